//! The dataset's directory: its marker file (which schema version it holds), the partition
//! folders, and Parquet files written under a temporary name and renamed into place, so a
//! reader never sees a half-written file under a name it would read.

use std::fs::{self, File};
use std::io::{self, BufWriter};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use parquet::arrow::arrow_writer::{compute_leaves, ArrowColumnChunk, ArrowRowGroupWriterFactory};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::ColumnPath;
use rayon::prelude::*;

use super::{ExportError, SCHEMA_VERSION};

/// The marker at the dataset's root. The leading underscore keeps it out of Spark's and
/// Hive's file listings; engines globbing `*.parquet` never match it.
pub const MARKER: &str = "_poolsight_dataset.json";

/// Parquet key-value metadata key carrying the schema version in every file.
pub const VERSION_KEY: &str = "poolsight.schema_version";

/// Makes `dir` ready to receive this schema version: created when missing; an empty
/// directory gets the marker; a non-empty one must already hold this version's marker.
pub fn prepare(dir: &Path) -> Result<(), ExportError> {
    let io_err = |source: io::Error| ExportError::Io {
        path: dir.to_path_buf(),
        source,
    };
    fs::create_dir_all(dir).map_err(io_err)?;
    let marker = dir.join(MARKER);
    match fs::read_to_string(&marker) {
        Ok(text) => {
            let found = serde_json::from_str::<serde_json::Value>(&text)
                .ok()
                .and_then(|v| v.get("schema_version").and_then(|n| n.as_u64()));
            match found {
                Some(v) if v == u64::from(SCHEMA_VERSION) => Ok(()),
                Some(v) => Err(ExportError::OtherVersion {
                    dir: dir.to_path_buf(),
                    found: v,
                }),
                None => Err(ExportError::BadMarker { path: marker }),
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let empty = fs::read_dir(dir).map_err(io_err)?.next().is_none();
            if !empty {
                return Err(ExportError::NotADataset {
                    dir: dir.to_path_buf(),
                });
            }
            let text = format!(
                "{{\"format\":\"poolsight-parquet\",\"schema_version\":{SCHEMA_VERSION}}}\n"
            );
            replace_with(&marker, |tmp| fs::write(tmp, text.as_bytes())).map_err(|source| {
                ExportError::Io {
                    path: marker.clone(),
                    source,
                }
            })
        }
        Err(source) => Err(ExportError::Io {
            path: marker,
            source,
        }),
    }
}

/// `DIR/<table>/run=<run>/rank=<rank>/part-0.parquet`: one file per table and rank, so a
/// second export of the same trace replaces its files instead of adding duplicates.
pub fn table_path(dir: &Path, table: &str, run: &str, rank: u32) -> PathBuf {
    dir.join(table)
        .join(format!("run={run}"))
        .join(format!("rank={rank}"))
        .join("part-0.parquet")
}

/// A Parquet file being written: zstd, the schema version in its metadata, under a hidden
/// temporary name until [`ParquetFile::finish`] renames it. Each batch written is one row
/// group, its columns encoded and compressed in parallel (most of an export's CPU time).
pub struct ParquetFile {
    path: PathBuf,
    tmp: PathBuf,
    writer: Option<SerializedFileWriter<BufWriter<File>>>,
    columns: Option<ArrowRowGroupWriterFactory>,
    schema: SchemaRef,
    row_groups: usize,
}

impl ParquetFile {
    /// `delta_columns`: columns of distinct, steadily growing values (sequence numbers,
    /// times, pointers), written with delta encoding instead of a dictionary: a dictionary of
    /// millions of distinct values costs time and saves nothing.
    pub fn create(
        path: PathBuf,
        schema: SchemaRef,
        delta_columns: &[&str],
    ) -> Result<ParquetFile, ExportError> {
        let tmp = temporary_name(&path);
        let io_err = |source| ExportError::Io {
            path: path.clone(),
            source,
        };
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(io_err)?;
        }
        let file = File::create(&tmp).map_err(io_err)?;
        let mut props = WriterProperties::builder();
        for c in delta_columns {
            props = props
                .set_column_dictionary_enabled(ColumnPath::from(*c), false)
                .set_column_encoding(ColumnPath::from(*c), Encoding::DELTA_BINARY_PACKED);
        }
        let props = props
            .set_compression(Compression::ZSTD(ZstdLevel::default()))
            .set_created_by(format!("poolsight {}", env!("CARGO_PKG_VERSION")))
            .set_key_value_metadata(Some(vec![KeyValue::new(
                VERSION_KEY.to_string(),
                SCHEMA_VERSION.to_string(),
            )]))
            .build();
        let mut out = ParquetFile {
            path,
            tmp,
            writer: None,
            columns: None,
            schema: schema.clone(),
            row_groups: 0,
        };
        // ArrowWriter sets the file up (the Parquet schema, the Arrow schema in the metadata);
        // its lower-level parts then let the columns be encoded in parallel.
        let (writer, columns) =
            ArrowWriter::try_new(BufWriter::with_capacity(1 << 20, file), schema, Some(props))
                .and_then(|w| w.into_serialized_writer())
                .map_err(|e| out.parquet_error(e))?;
        out.writer = Some(writer);
        out.columns = Some(columns);
        Ok(out)
    }

    /// Writes the batch as one row group.
    pub fn write(&mut self, batch: &RecordBatch) -> Result<(), ExportError> {
        let result = self.write_row_group(batch);
        result.map_err(|e| self.parquet_error(e))
    }

    fn write_row_group(&mut self, batch: &RecordBatch) -> parquet::errors::Result<()> {
        let (Some(writer), Some(columns)) = (self.writer.as_mut(), self.columns.as_ref()) else {
            return Ok(());
        };
        let mut leaves = Vec::new();
        for (field, array) in self.schema.fields().iter().zip(batch.columns()) {
            leaves.extend(compute_leaves(field, array)?);
        }
        let chunks = columns
            .create_column_writers(self.row_groups)?
            .into_par_iter()
            .zip(leaves)
            .map(|(mut w, leaf)| {
                w.write(&leaf)?;
                w.close()
            })
            .collect::<parquet::errors::Result<Vec<ArrowColumnChunk>>>()?;
        let mut row_group = writer.next_row_group()?;
        for chunk in chunks {
            chunk.append_to_row_group(&mut row_group)?;
        }
        row_group.close()?;
        self.row_groups += 1;
        Ok(())
    }

    /// Writes the footer, then gives the file its real name.
    pub fn finish(mut self) -> Result<(), ExportError> {
        if let Some(w) = self.writer.take() {
            let closed = w.into_inner().and_then(|b| {
                b.into_inner()
                    .map_err(|e| parquet::errors::ParquetError::External(Box::new(e.into_error())))
            });
            let file = closed.map_err(|e| self.parquet_error(e))?;
            file.sync_all().map_err(|source| ExportError::Io {
                path: self.path.clone(),
                source,
            })?;
        }
        fs::rename(&self.tmp, &self.path).map_err(|source| ExportError::Io {
            path: self.path.clone(),
            source,
        })
    }

    fn parquet_error(&self, source: parquet::errors::ParquetError) -> ExportError {
        ExportError::Parquet {
            path: self.path.clone(),
            source: Arc::new(source),
        }
    }
}

impl Drop for ParquetFile {
    /// A file not finished (an error on the way) leaves nothing behind.
    fn drop(&mut self) {
        if self.writer.take().is_some() {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

/// Writes through a temporary name next to `path`, then renames it over `path`.
fn replace_with(path: &Path, write: impl FnOnce(&Path) -> io::Result<()>) -> io::Result<()> {
    let tmp = temporary_name(path);
    if let Err(e) = write(&tmp).and_then(|()| fs::rename(&tmp, path)) {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(())
}

/// `.NAME.tmp-PID`: hidden (Spark, Hive and `*.parquet` globs skip it) and unique per process.
fn temporary_name(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp-{}", std::process::id()))
}
