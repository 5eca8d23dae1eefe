//! `poolsight export --format parquet`: traces as a Parquet dataset that DuckDB, DataFusion,
//! Spark or Trino query directly, many runs and ranks in one directory.
//!
//! Layout (hive-style partitions, so engines prune by run and rank without opening files):
//!
//! ```text
//! DIR/_poolsight_dataset.json                 {"format":"poolsight-parquet","schema_version":1}
//! DIR/<table>/run=<run id>/rank=<rank>/part-0.parquet
//! ```
//!
//! Tables: `events`, `stacks` (the full form), `functions`, `lines`, `timers`, `epochs` (the
//! summary form) and `runs` (always; one row per trace). Their columns are in
//! `docs/parquet.md`, which is the contract; [`SCHEMA_VERSION`] changes with any change to it.
//!
//! A run id is computed from trace headers alone, so exporting the same traces again (or from
//! another machine) gives the same partitions: see [`runs::run_ids`].
//!
//! Every file is written under a hidden temporary name and renamed when complete, and the
//! `runs` file of a rank is written last: a rank whose `runs` row exists has all its tables.
//! Exporting the same trace again replaces its files.

mod events;
mod files;
mod runs;
mod summary;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rayon::prelude::*;

use poolsight_analyzer::read::{ChunkKind, ReadError, Trace};
use poolsight_analyzer::replay::{replay, ReplayOptions};

pub use files::{MARKER, VERSION_KEY};
pub use runs::run_ids;

/// The version of the dataset's tables and columns (docs/parquet.md). A directory holding
/// another version is refused rather than mixed.
pub const SCHEMA_VERSION: u32 = 1;

/// Why an export stopped. Nothing half-written is left under a name an engine reads.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("{path}: incomplete ({what}); a dataset kept for queries should not hold partial figures: pass --allow-incomplete to export what is readable")]
    Damaged { path: PathBuf, what: String },
    #[error("{} and {} are the same trace: each file can be exported once per run", first.display(), second.display())]
    SameTrace { first: PathBuf, second: PathBuf },
    #[error("{} and {} are both rank {rank} of run {run}: give each rank once", first.display(), second.display())]
    SameRank {
        first: PathBuf,
        second: PathBuf,
        run: String,
        rank: u32,
    },
    #[error("run id {0:?}: use 1 to 64 letters, digits, '.', '_' or '-'")]
    BadRunId(String),
    #[error("{} holds a poolsight dataset of schema version {found}, this poolsight writes version {SCHEMA_VERSION}: export into another directory", dir.display())]
    OtherVersion { dir: PathBuf, found: u64 },
    #[error("{} is not empty and holds no {MARKER}: export into a new or empty directory, or into a poolsight dataset", dir.display())]
    NotADataset { dir: PathBuf },
    #[error("{}: not a poolsight dataset marker (no schema_version)", path.display())]
    BadMarker { path: PathBuf },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("writing {}: {source}", path.display())]
    Parquet {
        path: PathBuf,
        source: Arc<parquet::errors::ParquetError>,
    },
    #[error("building a record batch: {0}")]
    Arrow(String),
}

/// Which tables to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Tables {
    /// `events` and `stacks`: every event, for any question.
    #[default]
    Events,
    /// `functions`, `lines`, `timers`, `epochs`: the seed reports as rows, small enough to
    /// keep for every run.
    Summary,
    /// Both.
    All,
}

impl Tables {
    fn events(self) -> bool {
        matches!(self, Tables::Events | Tables::All)
    }
    fn summary(self) -> bool {
        matches!(self, Tables::Summary | Tables::All)
    }
}

#[derive(Debug, Clone, Default)]
pub struct ExportOptions {
    pub tables: Tables,
    /// One run id for every trace given (a scheduler's job id, say), instead of the computed.
    pub run_id: Option<String>,
    /// Bytes of trace chunks exported so far, for a progress bar; counts up to
    /// [`progress_total`].
    pub progress: Option<Arc<AtomicU64>>,
}

/// What [`export`] wrote for one trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportedTrace {
    pub path: PathBuf,
    pub run: String,
    pub rank: u32,
    /// The trace's events, as `info` and `report` count them (the `events` table's rows, when
    /// it is written).
    pub events: u64,
    /// The files written, `runs` last.
    pub files: Vec<PathBuf>,
    /// Their total size.
    pub bytes: u64,
}

/// Opens the traces (in parallel), refusing the same file given twice and, unless
/// `allow_incomplete`, a trace with damaged parts. The traces stay in the order given.
pub fn open<P: AsRef<Path> + Sync>(
    paths: &[P],
    allow_incomplete: bool,
) -> Result<Vec<Trace>, ExportError> {
    let traces = paths
        .par_iter()
        .map(Trace::open)
        .collect::<Result<Vec<Trace>, ReadError>>()?;
    checked(traces, allow_incomplete)
}

/// Opened traces as [`open`] takes them: the same file given twice, and unless
/// `allow_incomplete` a trace with damaged parts, refused.
pub fn checked(traces: Vec<Trace>, allow_incomplete: bool) -> Result<Vec<Trace>, ExportError> {
    for (i, a) in traces.iter().enumerate() {
        if let Some(w) = a.warnings.first().filter(|_| !allow_incomplete) {
            return Err(ExportError::Damaged {
                path: a.path.clone(),
                what: w.to_string(),
            });
        }
        for b in &traces[..i] {
            if poolsight_analyzer::load::same_recording(&a.header, &b.header) {
                return Err(ExportError::SameTrace {
                    first: b.path.clone(),
                    second: a.path.clone(),
                });
            }
        }
    }
    Ok(traces)
}

/// What [`ExportOptions::progress`] counts up to: the bytes of the traces' event chunks.
pub fn progress_total(traces: &[Trace]) -> u64 {
    traces.iter().map(event_chunk_bytes).sum()
}

fn event_chunk_bytes(t: &Trace) -> u64 {
    t.chunks
        .iter()
        .filter(|c| matches!(c.kind, ChunkKind::Mem | ChunkKind::Scope | ChunkKind::Mark))
        .map(|c| u64::from(c.len))
        .sum()
}

/// Exports the traces into the dataset at `dir`, in parallel (one trace per task). `dir` is
/// created when missing; a non-empty `dir` must be a dataset of this [`SCHEMA_VERSION`].
/// Results are in the order of `traces`.
pub fn export(
    traces: &[Trace],
    dir: &Path,
    opts: &ExportOptions,
) -> Result<Vec<ExportedTrace>, ExportError> {
    if let Some(id) = &opts.run_id {
        let ok = !id.is_empty()
            && id.len() <= 64
            && id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if !ok {
            return Err(ExportError::BadRunId(id.clone()));
        }
    }
    let ids = run_ids(traces, opts.run_id.as_deref());
    for (i, a) in traces.iter().enumerate() {
        for (j, b) in traces[..i].iter().enumerate() {
            let rank = runs::rank_of(a);
            if ids[i] == ids[j] && rank == runs::rank_of(b) {
                return Err(ExportError::SameRank {
                    first: b.path.clone(),
                    second: a.path.clone(),
                    run: ids[i].clone(),
                    rank,
                });
            }
        }
    }
    files::prepare(dir)?;
    traces
        .par_iter()
        .zip(ids.par_iter())
        .map(|(t, run)| export_one(t, run, dir, opts))
        .collect()
}

fn export_one(
    trace: &Trace,
    run: &str,
    dir: &Path,
    opts: &ExportOptions,
) -> Result<ExportedTrace, ExportError> {
    let rank = runs::rank_of(trace);
    let profile = replay(trace, 0, &ReplayOptions::default());
    let progress = opts.progress.as_deref();
    let mut written = Vec::new();
    if opts.tables.events() {
        let path = files::table_path(dir, "events", run, rank);
        let mut f = files::ParquetFile::create(
            path.clone(),
            events::EVENTS_SCHEMA.clone(),
            events::DELTA_COLUMNS,
        )?;
        events::write_events(trace, &mut f, progress)?;
        f.finish()?;
        written.push(path);
        let path = files::table_path(dir, "stacks", run, rank);
        let mut f = files::ParquetFile::create(path.clone(), events::STACKS_SCHEMA.clone(), &[])?;
        events::write_stacks(trace, &mut f)?;
        f.finish()?;
        written.push(path);
    } else if let Some(p) = progress {
        p.fetch_add(event_chunk_bytes(trace), Ordering::Relaxed);
    }
    if opts.tables.summary() {
        for (table, batch) in summary::batches(&profile)? {
            let path = files::table_path(dir, table, run, rank);
            let mut f = files::ParquetFile::create(path.clone(), batch.schema(), &[])?;
            f.write(&batch)?;
            f.finish()?;
            written.push(path);
        }
    }
    let batch = runs::runs_batch(trace, &profile)?;
    let path = files::table_path(dir, "runs", run, rank);
    let mut f = files::ParquetFile::create(path.clone(), batch.schema(), &[])?;
    f.write(&batch)?;
    f.finish()?;
    written.push(path);
    let bytes = written
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum();
    Ok(ExportedTrace {
        path: trace.path.clone(),
        run: run.to_string(),
        rank,
        events: profile.sources.first().map_or(0, |s| s.events),
        files: written,
        bytes,
    })
}
