//! PyTorch's own memory files as poolsight traces: CUDA memory snapshots (the pickles of
//! `torch.cuda.memory._dump_snapshot` and the OOM dumps) and `torch.profiler` Chrome/Kineto
//! JSON traces. Each is converted once into a normal trace, written through the recorder with
//! the file's own timestamps, so that every report, view, export and `diff` reads it with the
//! one implementation they have (docs/pytorch-files.md gives the rules).
//!
//! - [`pickle`]: a pickle reader that never runs code (a snapshot is untrusted input) and
//!   reads in one pass, handing each dict and list to the snapshot reader as it completes;
//! - [`snapshot`]: a snapshot's entries and segments into events;
//! - [`kineto`]: a profiler trace's memory events, operator and Python ranges and steps;
//! - [`events`]: what both produce, and how it is written;
//! - [`frames`]: which frames of a stack are kept (`--frames`);
//! - [`resolver`]: [`PyTorchFiles`], these files read wherever a trace is.
//!
//! This crate writes through the recorder and plugs into loading through the reader's
//! `Resolver`; it never depends on the analyzer.

pub mod device;
pub mod events;
pub mod frames;
pub mod infer;
pub mod kineto;
pub mod pickle;
pub mod resolver;
pub mod settings;
pub mod snapshot;

use std::path::{Path, PathBuf};

pub use frames::FrameFilter;
use poolsight_recorder::{ImportInfo, RecorderError};
pub use resolver::{ranks_of, PyTorchFiles};

/// What a file is, judged by its first bytes (never by its name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A poolsight trace (`PSTRACE\0`).
    Trace,
    /// A pickle: a PyTorch memory snapshot.
    Snapshot,
    /// JSON: a `torch.profiler` Chrome/Kineto trace.
    Profile,
    /// Anything else.
    Unknown,
}

/// The kind of a file from its first bytes.
pub fn detect(head: &[u8]) -> Kind {
    if head.starts_with(b"PSTRACE\0") {
        return Kind::Trace;
    }
    match head.first() {
        // PROTO (protocol 2 and later); protocols 0 and 1 open with MARK, an empty dict or
        // list, or a text opcode of a scalar.
        Some(0x80) => Kind::Snapshot,
        Some(b'(' | b'}' | b']') => Kind::Snapshot,
        _ => match head.iter().find(|b| !b.is_ascii_whitespace()) {
            Some(b'{' | b'[') => Kind::Profile,
            _ => Kind::Unknown,
        },
    }
}

/// The kind of the file at `path`.
pub fn detect_file(path: &Path) -> std::io::Result<Kind> {
    detect_opened(&std::fs::File::open(path)?)
}

/// The kind of an open file, from its first bytes, read in place (the file's position does
/// not move), so that the same handle can then be converted ([`convert_opened`]).
pub fn detect_opened(file: &std::fs::File) -> std::io::Result<Kind> {
    let mut head = [0u8; 64];
    let mut n = 0;
    while n < head.len() {
        match read_at(file, &mut head[n..], n as u64)? {
            0 => break,
            k => n += k,
        }
    }
    Ok(detect(&head[..n]))
}

#[cfg(unix)]
fn read_at(file: &std::fs::File, buf: &mut [u8], at: u64) -> std::io::Result<usize> {
    std::os::unix::fs::FileExt::read_at(file, buf, at)
}

#[cfg(not(unix))]
fn read_at(file: &std::fs::File, buf: &mut [u8], at: u64) -> std::io::Result<usize> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = file;
    f.seek(SeekFrom::Start(at))?;
    f.read(buf)
}

/// How to convert.
#[derive(Debug, Clone, Default)]
pub struct Options {
    pub frames: FrameFilter,
    /// The rank to write in the header (`--rank`, or from the file's name).
    pub rank: Option<u32>,
    pub world_size: Option<u32>,
    /// Replace an existing output file.
    pub overwrite: bool,
    /// Profiler traces: PyTorch's memory category of allocations (`from_profile`).
    pub categories: Vec<kineto::Category>,
}

/// Why a file could not be converted.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("not a PyTorch memory snapshot: {0}")]
    Pickle(#[from] pickle::PickleError),
    #[error("not a PyTorch memory snapshot: {0}")]
    NotSnapshot(String),
    #[error("not a torch.profiler trace: {0}")]
    NotProfile(String),
    #[error("{0}")]
    Write(#[from] RecorderError),
}

/// What [`convert_file`] did.
#[derive(Debug, Clone)]
pub struct Converted {
    pub kind: Kind,
    pub input_bytes: u64,
    pub entries: u64,
    pub events: u64,
    pub output_bytes: u64,
    pub overflowed: bool,
    pub unmapped: Vec<String>,
    /// A snapshot's allocator settings and segments, read in the same pass (`None` for a
    /// profiler trace).
    pub allocator: Option<settings::AllocatorState>,
}

/// Converts the snapshot or profiler trace at `input` into a poolsight trace at `output`.
/// `progress` is called with the input bytes read so far.
pub fn convert_file(
    input: &Path,
    output: &Path,
    opts: &Options,
    progress: Option<&mut dyn FnMut(u64)>,
) -> Result<Converted, ImportError> {
    let file = std::fs::File::open(input).map_err(|source| ImportError::Io {
        path: input.to_path_buf(),
        source,
    })?;
    convert_opened(&file, input, output, opts, progress)
}

/// [`convert_file`] of a file already open (`input` is its path, for messages): what reads a
/// file's kind and then converts it opens it once.
pub fn convert_opened(
    file: &std::fs::File,
    input: &Path,
    output: &Path,
    opts: &Options,
    mut progress: Option<&mut dyn FnMut(u64)>,
) -> Result<Converted, ImportError> {
    let io = |source| ImportError::Io {
        path: input.to_path_buf(),
        source,
    };
    let len = file.metadata().map_err(io)?.len();
    let map = if len == 0 {
        None
    } else {
        // SAFETY: the mapping is read-only and private; a file changed under it while being
        // read gives wrong bytes, which the reader reports as a damaged pickle, never UB in
        // safe code (every access is bounds-checked against the mapping's length).
        Some(unsafe { memmap2::Mmap::map(file) }.map_err(io)?)
    };
    let data: &[u8] = map.as_deref().unwrap_or(&[]);
    #[cfg(unix)]
    if let Some(m) = &map {
        let _ = m.advise(memmap2::Advice::Sequential);
    }
    let kind = detect(data);
    let mut events = match kind {
        Kind::Snapshot => {
            let mut released = 0;
            let mut read_so_far = |pos: u64| {
                if let Some(m) = &map {
                    release_read_pages(m, &mut released, pos);
                }
                if let Some(p) = progress.as_mut() {
                    p(pos);
                }
            };
            snapshot::read(data, opts.frames, Some(&mut read_so_far))?
        }
        Kind::Profile => kineto::convert_with(data, opts.frames, &opts.categories)?,
        Kind::Trace => {
            return Err(ImportError::NotSnapshot(
                "it is a poolsight trace already".into(),
            ))
        }
        Kind::Unknown if data.is_empty() => {
            return Err(ImportError::NotSnapshot("the file is empty".into()))
        }
        Kind::Unknown => {
            return Err(ImportError::NotSnapshot(
                "neither a pickle nor JSON (its first byte is not one either starts with)".into(),
            ))
        }
    };
    let info = ImportInfo {
        kind: match kind {
            Kind::Profile => "torch-profiler",
            _ => "pytorch-snapshot",
        }
        .into(),
        path: input.display().to_string(),
        bytes: len,
        entries: events.entries,
        overflowed: events.overflowed,
        unmapped: events.unmapped.clone(),
        // The allocator's state travels in the trace: whatif and oom replay a converted trace
        // as they replay its snapshot.
        allocator: events.allocator.clone(),
    };
    let (entries, overflowed, unmapped) =
        (events.entries, events.overflowed, events.unmapped.clone());
    let allocator = events.allocator.take();
    let rank = opts.rank;
    let mtime = file
        .metadata()
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos() as u64);
    let w = events.write(output, info, opts.overwrite, rank, opts.world_size, mtime)?;
    Ok(Converted {
        kind,
        input_bytes: len,
        entries,
        events: w.events,
        output_bytes: w.file_bytes,
        overflowed,
        unmapped,
        allocator,
    })
}

/// Hands back the pages of `map` below `pos`, which a pickle's reader has read and will not
/// read again: a snapshot is read in one pass, and the process then holds what it made of the
/// bytes, not the bytes.
fn release_read_pages(map: &memmap2::Mmap, released: &mut usize, pos: u64) {
    // A multiple of every page size in use.
    const ALIGN: usize = 1 << 16;
    let end = (pos as usize).min(map.len()) & !(ALIGN - 1);
    if end <= *released {
        return;
    }
    #[cfg(unix)]
    // SAFETY: the mapping is private, read-only and backed by the file: a page dropped here is
    // read again from the file if it is touched again, so the bytes seen are the file's either
    // way (nothing written to the mapping is lost: nothing is).
    let _ = unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, 0, end) };
    *released = end;
}

/// The rank a snapshot's file name gives: `snapshot_<rank>.pickle`, `..._rank-<N>.pickle`,
/// `..._rank<N>...` or `rank_<N>` anywhere in the name.
pub fn rank_from_name(path: &Path) -> Option<u32> {
    let name = path.file_stem()?.to_str()?.to_ascii_lowercase();
    let digits_after = |i: usize| -> Option<u32> {
        let rest = &name[i..];
        let end = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        rest[..end].parse().ok()
    };
    if let Some(i) = name.rfind("rank") {
        let mut j = i + 4;
        while name[j..].starts_with(['-', '_', '=']) {
            j += 1;
        }
        if let Some(r) = digits_after(j) {
            return Some(r);
        }
    }
    let stem = name.strip_prefix("snapshot_")?;
    stem.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_by_content() {
        assert_eq!(detect(b"PSTRACE\0\x01"), Kind::Trace);
        assert_eq!(detect(b"\x80\x04\x95"), Kind::Snapshot);
        assert_eq!(detect(b"(dp0\n"), Kind::Snapshot);
        assert_eq!(detect(b"  \n{\"traceEvents\": []}"), Kind::Profile);
        assert_eq!(detect(b"hello"), Kind::Unknown);
        assert_eq!(detect(b""), Kind::Unknown);
    }

    #[test]
    fn ranks_from_names() {
        let r = |s: &str| rank_from_name(Path::new(s));
        assert_eq!(r("snapshot_3.pickle"), Some(3));
        assert_eq!(r("run/oom_rank-12.pickle"), Some(12));
        assert_eq!(r("mem_rank_2_step9.pickle"), Some(2));
        assert_eq!(r("snapshot.pickle"), None);
        assert_eq!(r("snapshot_x.pickle"), None);
    }
}
