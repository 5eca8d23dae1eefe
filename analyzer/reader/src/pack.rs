//! Writing a packed trace (format 1.2, docs/format.md "Packed traces") from a verified one:
//! the same header with `packed` set, the footer, the definitions chunks as they were, and the
//! event chunks encoded as columns and compressed ([`crate::packed`]). Consecutive event chunks
//! of one thread and one kind are merged, up to [`PackOptions::merge`] of them, so that zstd
//! sees a few training steps at once; each merged chunk's events start with a rebase to its
//! own base, so the decoded events replay exactly as the originals.
//!
//! The live file is never packed in place: a recorder killed at any moment must leave a
//! readable file, which only the append-in-place format gives. Packing reads a finished (or
//! killed) trace and writes a new file; what the reader warned about in the input is not
//! carried over, the packed file holds what the input's verified chunks hold.

use std::io::Write;
use std::path::{Path, PathBuf};

use flatbuffers::FlatBufferBuilder;
use poolsight_schema::{
    align8, chunk_crc, data_offset, fb, finish_chunk, header_region, meta_field, meta_offset,
    FORMAT_MAJOR, FORMAT_MINOR,
};
use rayon::prelude::*;

use crate::packed::{self, Encoder};
use crate::{ChunkInfo, ChunkKind, Header, ReadError, Trace, Warning};

/// How to pack.
#[derive(Debug, Clone)]
pub struct PackOptions {
    /// zstd level (1..=22).
    pub level: i32,
    /// Most chunks merged into one packed chunk.
    pub merge: usize,
}

impl Default for PackOptions {
    fn default() -> Self {
        PackOptions {
            level: packed::DEFAULT_LEVEL,
            merge: 16,
        }
    }
}

/// What packing wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackSummary {
    pub events: u64,
    /// Chunks in the input (event, definitions and footer chunks).
    pub chunks_in: u64,
    /// Chunks in the packed file.
    pub chunks_out: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum PackError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is the trace being packed: write the packed trace to another file", path.display())]
    SameFile { path: PathBuf },
    #[error("{} is being recorded: write the packed trace to another file", path.display())]
    Recording { path: PathBuf },
    /// The trace to pack could not be opened (see [`pack_file`]).
    #[error(transparent)]
    Read(#[from] ReadError),
    /// zstd refused (out of memory, or a level it does not take).
    #[error("compressing a chunk failed: {source}")]
    Compress {
        #[source]
        source: std::io::Error,
    },
}

/// Groups merged into one batch of parallel work: bounds what is held in memory at once.
const BATCH: usize = 256;

/// Opens the trace at `input` with every checksum checked and packs it into `out`: what
/// `poolsight pack` does, and what a recording packed when it finishes does. Returns what the
/// reader warned about in `input` (chunks left out) beside what was written.
pub fn pack_file(
    input: &Path,
    out: &Path,
    opts: &PackOptions,
) -> Result<(PackSummary, Vec<Warning>), PackError> {
    let mut trace = Trace::open(input)?;
    let summary = pack(&trace, out, opts)?;
    Ok((summary, std::mem::take(&mut trace.warnings)))
}

/// Packs `trace` into a new file at `out`.
pub fn pack(trace: &Trace, out: &Path, opts: &PackOptions) -> Result<PackSummary, PackError> {
    let io = |source| PackError::Io {
        path: out.to_path_buf(),
        source,
    };
    if let (Ok(a), Ok(b)) = (
        std::fs::canonicalize(&trace.path),
        std::fs::canonicalize(out),
    ) {
        if a == b {
            return Err(PackError::SameFile { path: b });
        }
    }
    // Renaming over a file being recorded would take the recording's name from it.
    if std::fs::File::open(out).is_ok_and(|f| poolsight_schema::lock::is_being_recorded(&f)) {
        return Err(PackError::Recording {
            path: out.to_path_buf(),
        });
    }
    let tmp = {
        let mut p = out.as_os_str().to_owned();
        p.push(".packing");
        PathBuf::from(p)
    };
    let file = std::fs::File::create(&tmp).map_err(io)?;
    // Whatever fails from here on (a full disk, zstd, the rename), the half-written copy goes.
    struct RemoveUnlessKept<'a>(&'a Path, bool);
    impl Drop for RemoveUnlessKept<'_> {
        fn drop(&mut self) {
            if !self.1 {
                let _ = std::fs::remove_file(self.0);
            }
        }
    }
    let mut tmp_guard = RemoveUnlessKept(&tmp, false);
    let mut w = std::io::BufWriter::with_capacity(1 << 20, file);

    let header = build_header(trace);
    let data_offset = data_offset(header.len());
    w.write_all(&header_region(&header)).map_err(io)?;
    // The footer is written last (it holds the file's end); its size does not depend on its
    // values, so a placeholder keeps its slot.
    let footer_len = footer_chunk(trace, 0).len() as u64;
    w.write_all(&vec![0u8; footer_len as usize]).map_err(io)?;
    let mut at = data_offset + footer_len;

    let mut summary = PackSummary {
        events: 0,
        chunks_in: trace.chunks.len() as u64,
        chunks_out: 1,
        bytes_in: trace.bytes().len() as u64,
        bytes_out: 0,
    };
    let groups = groups(trace, opts.merge.max(1));
    for batch in groups.chunks(BATCH) {
        let packed: Vec<(Vec<u8>, u64)> = batch
            .par_iter()
            .map(|g| match g {
                Group::Copy(c) => Ok((copy_chunk(trace, c), 0)),
                Group::Events(cs) => pack_events(trace, cs, opts.level),
            })
            .collect::<Result<_, _>>()
            .map_err(|source| PackError::Compress { source })?;
        for (bytes, events) in &packed {
            summary.events += events;
            w.write_all(bytes).map_err(io)?;
            at += bytes.len() as u64;
            summary.chunks_out += 1;
        }
        trace.release_chunks(
            batch
                .iter()
                .flat_map(|g| match g {
                    Group::Copy(c) => std::slice::from_ref(c),
                    Group::Events(cs) => cs.as_slice(),
                })
                .copied(),
        );
    }
    let mut file = w.into_inner().map_err(|e| io(e.into_error()))?;
    {
        use std::io::{Seek, SeekFrom};
        file.seek(SeekFrom::Start(data_offset)).map_err(io)?;
        file.write_all(&footer_chunk(trace, at)).map_err(io)?;
    }
    file.sync_all().map_err(io)?;
    drop(file);
    std::fs::rename(&tmp, out).map_err(io)?;
    tmp_guard.1 = true;
    summary.bytes_out = at;
    Ok(summary)
}

enum Group<'a> {
    /// A definitions chunk, copied.
    Copy(&'a ChunkInfo),
    /// Consecutive event chunks of one thread and kind, packed into one.
    Events(Vec<&'a ChunkInfo>),
}

/// The output chunks in the order they are written: by the seq of their first chunk.
fn groups(trace: &Trace, merge: usize) -> Vec<Group<'_>> {
    let mut out: Vec<Group<'_>> = Vec::new();
    // Index in `out` of the group still taking chunks, per (thread, kind).
    let mut open: Vec<((u32, ChunkKind), usize)> = Vec::new();
    for c in &trace.chunks {
        match c.kind {
            ChunkKind::Footer => {}
            ChunkKind::Defs => out.push(Group::Copy(c)),
            ChunkKind::Mem | ChunkKind::Scope | ChunkKind::Mark => {
                let key = (c.thread, c.kind);
                let slot = open.iter().position(|(k, _)| *k == key);
                let joined = slot.is_some_and(|s| match &mut out[open[s].1] {
                    Group::Events(cs) if cs.len() < merge && c.sealed && cs[0].sealed => {
                        cs.push(c);
                        true
                    }
                    _ => false,
                });
                if !joined {
                    out.push(Group::Events(vec![c]));
                    match slot {
                        Some(s) => open[s].1 = out.len() - 1,
                        None => open.push((key, out.len() - 1)),
                    }
                }
            }
        }
    }
    out
}

/// A definitions chunk as it was, sealed again by the current checksum rule (a 1.0 input's
/// checksums do not cover the size prefix).
fn copy_chunk(trace: &Trace, c: &ChunkInfo) -> Vec<u8> {
    let start = c.offset as usize;
    let mut bytes = trace.bytes()[start..start + c.len as usize].to_vec();
    let used = match fb::size_prefixed_root_as_chunk(&bytes) {
        Ok(chunk) => chunk.meta().used() as usize,
        Err(_) => bytes.len() - 4,
    };
    bytes.resize(align8(bytes.len() as u64) as usize, 0);
    seal(&mut bytes, c, used);
    bytes
}

/// Packs one group of event chunks; also returns its recorded events, rebases left out, as
/// `info` and the replay count them.
fn pack_events(trace: &Trace, cs: &[&ChunkInfo], level: i32) -> std::io::Result<(Vec<u8>, u64)> {
    let first = cs[0];
    let rebase = |c: &ChunkInfo, i: usize| i > 0 && c.kind != ChunkKind::Mark;
    let (body, events, encoded, recorded) = match first.kind {
        ChunkKind::Mem => {
            let mut ev = Vec::new();
            for (i, c) in cs.iter().enumerate() {
                if rebase(c, i) {
                    ev.push(fb::MemEvent::new(
                        0,
                        fb::MemKind::Rebase,
                        0,
                        0,
                        c.base_ticks,
                        0,
                        0,
                        0,
                    ));
                }
                ev.extend_from_slice(&trace.mem_events(c));
            }
            let recorded = ev
                .iter()
                .filter(|e| e.kind() != fb::MemKind::Rebase)
                .count();
            (
                fb::ChunkBody::MemEvents,
                ev.len(),
                Encoder::mem(&ev),
                recorded,
            )
        }
        ChunkKind::Scope => {
            let mut ev = Vec::new();
            for (i, c) in cs.iter().enumerate() {
                if rebase(c, i) {
                    ev.push(fb::ScopeEvent::new(0, 0, c.base_ticks));
                }
                ev.extend_from_slice(&trace.scope_events(c));
            }
            let recorded = ev.iter().filter(|e| e.stack() != 0).count();
            (
                fb::ChunkBody::ScopeEvents,
                ev.len(),
                Encoder::scope(&ev),
                recorded,
            )
        }
        _ => {
            let mut ev = Vec::new();
            for c in cs {
                ev.extend_from_slice(&trace.mark_events(c));
            }
            (
                fb::ChunkBody::MarkEvents,
                ev.len(),
                Encoder::mark(&ev),
                ev.len(),
            )
        }
    };
    let data = packed::compress(&encoded, level)?;
    let mut fbb = FlatBufferBuilder::with_capacity(data.len() + 256);
    let data = fbb.create_vector(&data);
    let more: Vec<u64> = cs[1..].iter().map(|c| c.seq).collect();
    let more_seqs = (!more.is_empty()).then(|| fbb.create_vector(&more));
    let table = fb::PackedEvents::create(
        &mut fbb,
        &fb::PackedEventsArgs {
            body: body.0,
            events: events as u32,
            encoded_len: encoded.len() as u32,
            data: Some(data),
            more_seqs,
            open: !first.sealed,
        },
    );
    let mut bytes = finish_chunk(
        &mut fbb,
        fb::ChunkBody::PackedEvents,
        table.as_union_value(),
    );
    let used = bytes.len() - 4;
    bytes.resize(align8(bytes.len() as u64) as usize, 0);
    seal(&mut bytes, first, used);
    Ok((bytes, recorded as u64))
}

/// Sets the size prefix to the padded length and seals the chunk with `c`'s identity: seq,
/// base ticks, thread, `used`, checksum, state (docs/format.md, "Chunk metadata and sealing").
fn seal(bytes: &mut [u8], c: &ChunkInfo, used: usize) {
    let size = (bytes.len() - 4) as u32;
    bytes[..4].copy_from_slice(&size.to_le_bytes());
    let meta_at = match fb::size_prefixed_root_as_chunk(bytes) {
        Ok(chunk) => meta_offset(bytes, chunk.meta()),
        Err(_) => return,
    };
    let mut put = |field: usize, v: &[u8]| {
        bytes[meta_at + field..meta_at + field + v.len()].copy_from_slice(v)
    };
    put(meta_field::SEQ, &c.seq.to_le_bytes());
    put(meta_field::BASE_TICKS, &c.base_ticks.to_le_bytes());
    put(meta_field::THREAD, &c.thread.to_le_bytes());
    put(meta_field::USED, &(used as u32).to_le_bytes());
    put(meta_field::STATE, &[fb::ChunkState::Sealed.0]);
    let crc = chunk_crc(bytes, meta_at, 4 + used).unwrap_or(0);
    bytes[meta_at + meta_field::CRC32..meta_at + meta_field::CRC32 + 4]
        .copy_from_slice(&crc.to_le_bytes());
}

/// The input's footer with the packed file's end; an Open (all-zero) footer when the input
/// run never finished, so the packed trace reads as unfinished too.
fn footer_chunk(trace: &Trace, data_end: u64) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::with_capacity(256);
    fbb.force_defaults(true);
    let f = trace.footer;
    let footer = fb::Footer::create(
        &mut fbb,
        &fb::FooterArgs {
            end_ticks: f.map_or(0, |f| f.end_ticks),
            end_mono_ns: f.map_or(0, |f| f.end_mono_ns),
            end_unix_ns: f.map_or(0, |f| f.end_unix_ns),
            dropped_events: f.map_or(0, |f| f.dropped_events),
            chunks: f.map_or(0, |f| f.chunks),
            data_end: if f.is_some() { data_end } else { 0 },
        },
    );
    let mut bytes = finish_chunk(&mut fbb, fb::ChunkBody::Footer, footer.as_union_value());
    let used = bytes.len() - 4;
    bytes.resize(align8(bytes.len() as u64) as usize, 0);
    if f.is_some() {
        let id = ChunkInfo {
            offset: 0,
            len: 0,
            kind: ChunkKind::Footer,
            seq: 0,
            thread: 0,
            base_ticks: 0,
            sealed: true,
            events: 0,
            packed: false,
            crc_deferred: false,
        };
        seal(&mut bytes, &id, used);
    } else {
        let size = (bytes.len() - 4) as u32;
        bytes[..4].copy_from_slice(&size.to_le_bytes());
    }
    bytes
}

/// The input's header, in the current format with `packed` set.
fn build_header(trace: &Trace) -> Vec<u8> {
    Header {
        format_major: FORMAT_MAJOR,
        format_minor: FORMAT_MINOR,
        packed: true,
        ..trace.header.clone()
    }
    .encode()
}
