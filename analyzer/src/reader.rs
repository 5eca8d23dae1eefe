//! Opening a trace: the file is untrusted input (CI analyzes artifacts of other people's
//! branches). Every chunk is checked — bounds, FlatBuffers verification, identifier, checksum
//! of sealed chunks — before anything reads it. A bad chunk becomes a warning naming its
//! offset and what is wrong, and is skipped; a file that is not a trace at all, or of a major
//! version this reader does not know, is an error. Nothing allocates by a size read from the
//! file: the index holds one small entry per chunk that actually exists.
//!
//! The layout and the rules checked here are those of docs/format.md. Walk order: the footer slot
//! at `data_offset`, then (ring mode) the ring slots, then chunks one after another until the end
//! of the file. Zero bytes where a chunk should start are space that was reserved but never
//! written; the walk skips to the next non-zero word. Where a chunk should start but none does
//! (a damaged size prefix, a cut), the walk warns and resumes at the next offset that starts a
//! chunk, so one damaged chunk hides nothing else. Every count read from the file is bounded by
//! the file's size, and every offset sum is checked.

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use memmap2::Mmap;
use poolsight_schema::lock;
use poolsight_schema::{
    align8, chunk_crc, crc_covers_size_prefix, fb, header_crc, meta_offset, Prelude, PreludeError,
    HEADER_CRC_LEN, HEADER_CRC_MINOR, PRELUDE_LEN,
};
use rayon::prelude::*;

use crate::packed::{self, Packed};

/// Why a file could not be read at all.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {source}", path.display())]
    Prelude {
        path: PathBuf,
        #[source]
        source: PreludeError,
    },
    #[error("{}: bad header at offset {offset}: {what}", path.display())]
    Header {
        path: PathBuf,
        offset: u64,
        what: String,
    },
}

/// What kind of chunk an index entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChunkKind {
    Mem,
    Scope,
    Mark,
    Defs,
    Footer,
}

/// One verified chunk.
#[derive(Debug, Clone, Copy)]
pub struct ChunkInfo {
    pub offset: u64,
    /// Bytes of the size-prefixed buffer, prefix included.
    pub len: u32,
    pub kind: ChunkKind,
    pub seq: u64,
    pub thread: u32,
    pub base_ticks: u64,
    pub sealed: bool,
    /// Events (for event chunks), rebase events included.
    pub events: u32,
    /// A packed chunk (format 1.2): its events are decoded when read.
    pub packed: bool,
    /// A sealed event chunk whose checksum is still to be checked (a trace opened with
    /// [`Trace::open_deferred`]): the replay checks it when it first reads the chunk.
    pub crc_deferred: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceDef {
    pub id: u32,
    pub name: String,
    pub capacity: u64,
    pub allocation_unit: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadDef {
    pub id: u32,
    pub os_tid: u64,
    pub name: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameDef {
    pub kind: fb::FrameKind,
    pub phase: fb::Phase,
    pub line: u32,
    pub file: u32,
    pub name: u32,
}

/// Interned definitions, by id.
#[derive(Debug, Default, Clone)]
pub struct Defs {
    pub strings: HashMap<u32, String>,
    pub frames: HashMap<u32, FrameDef>,
    /// stack id -> (parent stack id, frame id)
    pub stacks: HashMap<u32, (u32, u32)>,
    pub threads: Vec<ThreadDef>,
    pub devices: Vec<DeviceDef>,
}

impl Defs {
    pub fn string(&self, id: u32) -> &str {
        self.strings.get(&id).map(String::as_str).unwrap_or("?")
    }
}

#[derive(Debug, Clone)]
pub struct Header {
    pub format_major: u16,
    pub format_minor: u16,
    pub writer: String,
    pub ticks0: u64,
    pub mono_ns: u64,
    pub unix_ns: u64,
    pub ticks_per_ns: f64,
    pub pid: u32,
    pub host: String,
    pub command_line: Vec<String>,
    pub rank: Option<u32>,
    pub world_size: Option<u32>,
    pub ring: Option<u32>,
    pub chunk_size: u32,
    pub cpu_source: fb::CpuSource,
    /// Devices named in the header (more may come in definitions chunks).
    pub devices: Vec<DeviceDef>,
    /// A packed trace (format 1.2): no ring slots, event chunks may be packed.
    pub packed: bool,
}

#[derive(Debug, Clone, Copy)]
pub struct Footer {
    pub end_ticks: u64,
    pub end_mono_ns: u64,
    pub end_unix_ns: u64,
    pub dropped_events: u64,
    pub chunks: u64,
    pub data_end: u64,
}

/// Something wrong with part of a file that did not stop the rest from being read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    pub offset: u64,
    pub what: String,
    /// Whether the problem is a chunk lost to a torn or corrupt write.
    pub torn: bool,
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "offset {}: {}", self.offset, self.what)
    }
}

/// An open, verified trace. Events are read in place from the mapping.
pub struct Trace {
    pub path: PathBuf,
    map: Mmap,
    /// Holds the reading lock for as long as `map` lives (see `map_file`).
    _file: File,
    /// A recorder held the file when it was opened: a trace without a sealed footer is then
    /// still being written, not killed.
    pub recording: bool,
    pub header: Header,
    /// Verified chunks in the order they were reserved (`seq`).
    pub chunks: Vec<ChunkInfo>,
    pub defs: Defs,
    /// `None` when the writer never finished (killed, crashed, or still running).
    pub footer: Option<Footer>,
    pub warnings: Vec<Warning>,
    /// Packed chunks that verified but could not be decoded when read (only a crafted file
    /// gets there: the checksum covers the packed bytes); their events are left out.
    decode_failures: Mutex<Vec<Warning>>,
    /// Per chunk, whether its deferred checksum was checked and held (see
    /// [`Trace::open_deferred`]); empty when nothing was deferred.
    crc_checked: Vec<AtomicBool>,
}

/// The events of one chunk: in place in the mapping, or decoded from a packed chunk.
pub enum Events<'a, T> {
    Mapped(&'a [T]),
    Decoded(Vec<T>),
}

impl<T> Deref for Events<'_, T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match self {
            Events::Mapped(s) => s,
            Events::Decoded(v) => v,
        }
    }
}

impl<T> Default for Events<'_, T> {
    fn default() -> Self {
        Events::Mapped(&[])
    }
}

impl<'a, T: Copy> IntoIterator for Events<'a, T> {
    type Item = T;
    type IntoIter = EventsIter<'a, T>;

    fn into_iter(self) -> EventsIter<'a, T> {
        match self {
            Events::Mapped(s) => EventsIter::Mapped(s.iter()),
            Events::Decoded(v) => EventsIter::Decoded(v.into_iter()),
        }
    }
}

impl<'b, T> IntoIterator for &'b Events<'_, T> {
    type Item = &'b T;
    type IntoIter = std::slice::Iter<'b, T>;

    fn into_iter(self) -> std::slice::Iter<'b, T> {
        self.iter()
    }
}

/// Iterates [`Events`] by value.
pub enum EventsIter<'a, T> {
    Mapped(std::slice::Iter<'a, T>),
    Decoded(std::vec::IntoIter<T>),
}

impl<T: Copy> Iterator for EventsIter<'_, T> {
    type Item = T;

    #[inline]
    fn next(&mut self) -> Option<T> {
        match self {
            EventsIter::Mapped(i) => i.next().copied(),
            EventsIter::Decoded(i) => i.next(),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match self {
            EventsIter::Mapped(i) => i.size_hint(),
            EventsIter::Decoded(i) => i.size_hint(),
        }
    }
}

/// Size prefix, root offset and file identifier.
const MIN_PREFIXED_LEN: usize = 12;

const VERIFIER: flatbuffers::VerifierOptions = flatbuffers::VerifierOptions {
    max_depth: 16,
    max_tables: 1 << 20,
    max_apparent_size: 1 << 31,
    ignore_missing_null_terminator: false,
};

impl Trace {
    pub fn open(path: impl AsRef<Path>) -> Result<Trace, ReadError> {
        let (path, file, map) = map_file(path.as_ref())?;
        Self::from_map(path, file, map, false)
    }

    /// [`Trace::open`], except that the checksums of sealed event chunks are not checked here
    /// but when the replay first reads each chunk, while its bytes are in the cache: one pass
    /// over the file instead of two. Everything else is verified as `open` verifies it, so
    /// reading the trace is as safe; but until [`Trace::checksums_hold`] says so, a corrupted
    /// chunk's events may have been read as if they were sound. Use it only as
    /// [`crate::load::load`] does: replay, then, unless every checksum held, open the file
    /// again with `open` (which names the corrupted chunks and leaves them out) and replay
    /// that instead.
    pub fn open_deferred(path: impl AsRef<Path>) -> Result<Trace, ReadError> {
        let (path, file, map) = map_file(path.as_ref())?;
        Self::from_map(path, file, map, true)
    }

    /// Checks a chunk's deferred checksum (nothing for a chunk whose checksum was checked at
    /// open). The replay calls it once for every chunk it reads.
    pub fn check_deferred(&self, c: &ChunkInfo) {
        if !c.crc_deferred {
            return;
        }
        let buf = &self.map[c.offset as usize..c.offset as usize + c.len as usize];
        let meta = self.chunk_root(c).meta();
        let holds = crc_holds(buf, meta, self.header.format_minor);
        // The chunks are sorted by (seq, offset), which the offset alone makes unique.
        let found = self
            .chunks
            .binary_search_by_key(&(c.seq, c.offset), |x| (x.seq, x.offset));
        // Not one of this trace's chunks: nothing to record.
        if let Some(flag) = found.ok().and_then(|i| self.crc_checked.get(i)) {
            flag.store(holds, Ordering::Relaxed);
        }
    }

    /// Whether every checksum of the trace was checked and held: always for a trace opened
    /// with [`Trace::open`]; for one opened with [`Trace::open_deferred`], once a replay read
    /// every chunk and no deferred checksum failed.
    pub fn checksums_hold(&self) -> bool {
        self.chunks
            .iter()
            .zip(&self.crc_checked)
            .all(|(c, ok)| !c.crc_deferred || ok.load(Ordering::Relaxed))
    }

    fn from_map(path: PathBuf, file: File, map: Mmap, deferred: bool) -> Result<Trace, ReadError> {
        let data: &[u8] = &map;
        let prelude = Prelude::decode(data).map_err(|source| ReadError::Prelude {
            path: path.clone(),
            source,
        })?;
        let mut warnings = Vec::new();
        let header = read_header(data, &prelude, &mut warnings).map_err(|(offset, what)| {
            ReadError::Header {
                path: path.clone(),
                offset,
                what,
            }
        })?;
        let spans = walk(
            &map,
            &file,
            prelude.data_offset as u64,
            &header,
            &mut warnings,
        );
        let minor = prelude.minor;
        let packed = header.packed;
        let results: Vec<Result<Verified, Warning>> = windows(&spans, |&(off, len)| (off, len))
            .par_iter()
            .flat_map_iter(|w| {
                let out: Vec<_> = w
                    .iter()
                    .map(|&&(off, len)| {
                        let verify =
                            |deferred| verify_chunk(data, off, len, minor, packed, deferred);
                        // A chunk refused for what a deferred checksum would have caught first
                        // is refused for the reason an open that checks every checksum gives.
                        verify(deferred).or_else(|e| if deferred { verify(false) } else { Err(e) })
                    })
                    .collect();
                release_window(&map, w.iter().map(|&&(off, len)| (off, len)));
                out
            })
            .collect();
        let mut chunks = Vec::with_capacity(results.len());
        let mut merged_seqs = Vec::new();
        for r in results {
            match r {
                Ok(v) => {
                    chunks.push(v.info);
                    warnings.extend(v.warning);
                    merged_seqs.extend(v.merged_seqs);
                }
                Err(w) => warnings.push(w),
            }
        }
        chunks.sort_by_key(|c| (c.seq, c.offset));
        let recording = lock::is_being_recorded(&file);
        let mut trace = Trace {
            path,
            map,
            _file: file,
            recording,
            header,
            chunks,
            defs: Defs::default(),
            footer: None,
            warnings,
            decode_failures: Mutex::new(Vec::new()),
            crc_checked: Vec::new(),
        };
        if trace.chunks.iter().any(|c| c.crc_deferred) {
            trace.crc_checked = trace
                .chunks
                .iter()
                .map(|_| AtomicBool::new(false))
                .collect();
        }
        trace.load_defs_and_footer();
        if trace.header.ring.is_none() {
            check_seqs(
                &trace.chunks,
                merged_seqs,
                trace.footer.as_ref(),
                &mut trace.warnings,
            );
        }
        trace.warn_if_partial(prelude.data_offset as u64);
        Ok(trace)
    }

    fn load_defs_and_footer(&mut self) {
        let mut defs = Defs {
            devices: self.header.devices.clone(),
            ..Defs::default()
        };
        let mut footer = None;
        for c in self
            .chunks
            .iter()
            .filter(|c| matches!(c.kind, ChunkKind::Defs | ChunkKind::Footer))
        {
            let chunk = self.chunk_root(c);
            if let Some(d) = chunk.body_as_defs() {
                merge_defs(&mut defs, &d);
            } else if let Some(f) = chunk.body_as_footer() {
                if c.sealed {
                    footer = Some(Footer {
                        end_ticks: f.end_ticks(),
                        end_mono_ns: f.end_mono_ns(),
                        end_unix_ns: f.end_unix_ns(),
                        dropped_events: f.dropped_events(),
                        chunks: f.chunks(),
                        data_end: f.data_end(),
                    });
                }
            }
        }
        if let Some(f) = footer {
            let len = self.map.len() as u64;
            if f.data_end > len {
                self.warnings.push(Warning {
                    offset: len,
                    what: format!(
                        "the file ends at {len} bytes but its writer wrote {}: it was truncated (copied while being written, or a disk filled); what remains was read",
                        f.data_end
                    ),
                    torn: false,
                });
            }
        }
        self.defs = defs;
        self.footer = footer;
    }

    /// Tells the kernel this process is done with a chunk's pages for now, so that a pass over
    /// a trace larger than RAM keeps only the chunks in flight resident. The bytes stay in the
    /// page cache; touching them again maps them back.
    pub fn release_pages(&self, c: &ChunkInfo) {
        release(&self.map, c.offset, c.offset + c.len as u64);
    }

    /// Gives back the whole pages between two file offsets (see [`Trace::release_pages`]).
    /// Releasing in large spans matters: each release interrupts every core running this
    /// process to flush its TLB, so a release per 64 KiB chunk costs more than the reading.
    pub fn release_span(&self, start: u64, end: u64) {
        release(&self.map, start, end);
    }

    /// Groups chunks into runs of neighbouring file regions of at most [`WINDOW`] bytes, in
    /// file order: the unit of parallel work of a pass that releases pages as it goes.
    pub fn windows<'a>(
        &self,
        chunks: impl Iterator<Item = &'a ChunkInfo>,
    ) -> Vec<Vec<&'a ChunkInfo>> {
        let list: Vec<&ChunkInfo> = chunks.collect();
        windows(&list, |c| (c.offset, c.len))
            .into_iter()
            .map(|w| w.into_iter().copied().collect())
            .collect()
    }

    /// Releases the pages of chunks a pass is done with, in as few calls as their layout
    /// allows: each call costs every other core running the pass a TLB flush, so neighbours
    /// go together, across gaps of up to [`MIN_WINDOW`] (whose pages some other worker may
    /// still read: it faults them back in).
    pub fn release_chunks<'a>(&self, chunks: impl Iterator<Item = &'a ChunkInfo>) {
        let mut spans: Vec<(u64, u64)> = chunks
            .map(|c| (c.offset, c.offset + c.len as u64))
            .collect();
        spans.sort_unstable();
        let mut run: Option<(u64, u64)> = None;
        for (lo, hi) in spans {
            run = match run {
                Some((a, b)) if lo <= b.saturating_add(MIN_WINDOW) => Some((a, b.max(hi))),
                Some((a, b)) => {
                    release(&self.map, a, b);
                    Some((lo, hi))
                }
                None => Some((lo, hi)),
            };
        }
        if let Some((a, b)) = run {
            release(&self.map, a, b);
        }
    }

    /// Releases the pages of a window of [`Trace::windows`] once it is processed.
    pub fn release_window(&self, window: &[&ChunkInfo]) {
        release_window(&self.map, window.iter().map(|c| (c.offset, c.len)));
    }

    /// The raw bytes of the file.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    fn chunk_root(&self, c: &ChunkInfo) -> fb::Chunk<'_> {
        let buf = &self.map[c.offset as usize..c.offset as usize + c.len as usize];
        // SAFETY: this exact range passed the verifier when the trace was opened, and the
        // mapping is immutable for the Trace's lifetime.
        unsafe { fb::size_prefixed_root_as_chunk_unchecked(buf) }
    }

    /// Memory events of a `Mem` chunk, in place or decoded (empty for other kinds).
    pub fn mem_events(&self, c: &ChunkInfo) -> Events<'_, fb::MemEvent> {
        if c.packed {
            return self.decode(c, Packed::Mem, packed::decode_mem);
        }
        let events = self
            .chunk_root(c)
            .body_as_mem_events()
            .and_then(|b| b.events());
        Events::Mapped(vector_slice(events))
    }

    pub fn scope_events(&self, c: &ChunkInfo) -> Events<'_, fb::ScopeEvent> {
        if c.packed {
            return self.decode(c, Packed::Scope, packed::decode_scope);
        }
        let events = self
            .chunk_root(c)
            .body_as_scope_events()
            .and_then(|b| b.events());
        Events::Mapped(vector_slice(events))
    }

    pub fn mark_events(&self, c: &ChunkInfo) -> Events<'_, fb::MarkEvent> {
        if c.packed {
            return self.decode(c, Packed::Mark, packed::decode_mark);
        }
        let events = self
            .chunk_root(c)
            .body_as_mark_events()
            .and_then(|b| b.events());
        Events::Mapped(vector_slice(events))
    }

    /// Decodes a packed chunk of `kind`; a failure is remembered as a warning (see
    /// [`Trace::decode_failures`]) and gives no events.
    fn decode<T>(
        &self,
        c: &ChunkInfo,
        kind: Packed,
        columns: fn(&[u8], u32) -> Result<Vec<T>, packed::DecodeError>,
    ) -> Events<'_, T> {
        let Some(p) = self.chunk_root(c).body_as_packed_events() else {
            return Events::default();
        };
        if Packed::of_body(fb::ChunkBody(p.body())) != Some(kind) {
            return Events::default();
        }
        let data = p.data().map_or(&[][..], |d| d.bytes());
        match packed::decompress(data, p.encoded_len()).and_then(|e| columns(&e, p.events())) {
            Ok(v) => Events::Decoded(v),
            Err(e) => {
                let w = Warning {
                    offset: c.offset,
                    what: format!("packed chunk does not decode ({e}); its events are left out"),
                    torn: true,
                };
                let mut failures = self
                    .decode_failures
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                if !failures.contains(&w) {
                    failures.push(w);
                }
                Events::default()
            }
        }
    }

    /// Packed chunks that could not be decoded so far (each named once): a pass that read
    /// them left their events out.
    pub fn decode_failures(&self) -> Vec<Warning> {
        self.decode_failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Memory events of a chunk with absolute ticks, rebase markers applied and left out.
    pub fn mem_timeline<'a>(
        &'a self,
        c: &ChunkInfo,
    ) -> impl Iterator<Item = (u64, fb::MemEvent)> + 'a {
        let mut base = c.base_ticks;
        self.mem_events(c).into_iter().filter_map(move |e| {
            if e.kind() == fb::MemKind::Rebase {
                base = e.ptr();
                None
            } else {
                Some((base.wrapping_add(e.ts() as u64), e))
            }
        })
    }

    /// Scope events of a chunk with absolute end ticks, rebase markers applied and left out.
    pub fn scope_timeline<'a>(
        &'a self,
        c: &ChunkInfo,
    ) -> impl Iterator<Item = (u64, fb::ScopeEvent)> + 'a {
        let mut base = c.base_ticks;
        self.scope_events(c).into_iter().filter_map(move |e| {
            if e.stack() == 0 {
                base = e.duration();
                None
            } else {
                Some((base.wrapping_add(e.end() as u64), e))
            }
        })
    }

    /// Nanoseconds since the trace started for a tick value, rounded down; ticks before the
    /// start count as 0. Uses both calibration points when the run finished (a sealed footer),
    /// else the rate measured at start (docs/format.md, "Timestamps").
    pub fn ns_since_start(&self, ticks: u64) -> u64 {
        let h = &self.header;
        let dt = ticks.saturating_sub(h.ticks0) as f64;
        let rate = match self.footer {
            Some(f) if f.end_ticks > h.ticks0 && f.end_mono_ns > h.mono_ns => {
                (f.end_ticks - h.ticks0) as f64 / (f.end_mono_ns - h.mono_ns) as f64
            }
            _ => h.ticks_per_ns,
        };
        if rate > 0.0 {
            (dt / rate) as u64
        } else {
            0
        }
    }

    /// Ticks to nanoseconds, for durations.
    pub fn ticks_to_ns(&self, ticks: u64) -> u64 {
        self.ns_since_start(self.header.ticks0.saturating_add(ticks))
    }

    /// Chunks that were reserved but lost to torn or corrupt writes.
    pub fn torn_chunks(&self) -> usize {
        self.warnings.iter().filter(|w| w.torn).count()
    }

    /// Whether the writer finished the file: its footer is sealed (docs/format.md, "The
    /// footer and finished"). Chunks lost since, or events it dropped, do not change that;
    /// they make the run incomplete (see [`crate::incomplete`]).
    pub fn finished(&self) -> bool {
        self.footer.is_some()
    }

    /// A file the writer did not finish, or that says it dropped events, gets a warning of its
    /// own: every command that reads it then says so.
    fn warn_if_partial(&mut self, footer_at: u64) {
        if self.footer.is_none() {
            let why = if self.recording {
                format!(
                    "unfinished: process {} is still recording it; the reports cover what it \
                     wrote so far",
                    self.header.pid
                )
            } else {
                "unfinished: the writer never sealed the footer (killed or crashed); every \
                 complete event is read, the reports end where it stopped"
                    .to_string()
            };
            self.warnings.push(Warning {
                offset: footer_at,
                what: why,
                torn: false,
            });
        }
        if let Some(n) = self.footer.map(|f| f.dropped_events).filter(|&n| n > 0) {
            self.warnings.push(Warning {
                offset: footer_at,
                what: format!(
                    "the writer dropped {n} event(s) it could not record (the file could not \
                     grow, or they came after the recording finished)"
                ),
                torn: false,
            });
        }
    }
}

/// Bytes per unit of page release: large enough that releases are rare, small enough that a
/// pass keeps little resident.
pub const WINDOW: u64 = 8 << 20;

/// Smallest unit of parallel work, so that a small trace still splits across the threads.
const MIN_WINDOW: u64 = 256 << 10;

/// Groups items with (offset, len) into runs of neighbouring regions, sorted by offset: about
/// [`WINDOW`] bytes each, or fewer so that every thread gets several runs.
fn windows<T>(items: &[T], span: impl Fn(&T) -> (u64, u32)) -> Vec<Vec<&T>> {
    let mut sorted: Vec<&T> = items.iter().collect();
    sorted.sort_by_key(|t| span(t).0);
    let total: u64 = sorted.iter().map(|t| span(t).1 as u64).sum();
    let size = (total / (4 * rayon::current_num_threads() as u64)).clamp(MIN_WINDOW, WINDOW);
    let mut out: Vec<Vec<&T>> = Vec::new();
    let mut start = 0u64;
    for t in sorted {
        let (off, _) = span(t);
        match out.last_mut() {
            Some(w) if off.saturating_sub(start) < size => w.push(t),
            _ => {
                start = off;
                out.push(vec![t]);
            }
        }
    }
    out
}

fn release_window(map: &Mmap, spans: impl Iterator<Item = (u64, u32)>) {
    let (mut lo, mut hi) = (u64::MAX, 0u64);
    for (off, len) in spans {
        lo = lo.min(off);
        hi = hi.max(off + len as u64);
    }
    if lo < hi {
        release(map, lo, hi);
    }
}

const PAGE: u64 = 4096;

/// Releases the whole pages inside [start, end): pages shared with a neighbouring region,
/// which another thread may be reading, stay.
#[cfg(unix)]
fn release(map: &Mmap, start: u64, end: u64) {
    let start = start.div_ceil(PAGE) * PAGE;
    let end = (end.min(map.len() as u64) / PAGE) * PAGE;
    if start >= end {
        return;
    }
    // SAFETY: the mapping is a read-only shared mapping of a file that is not written while
    // analyzed; MADV_DONTNEED on it only drops this process's page-table entries, and the next
    // access refaults the same bytes from the file. Slices into it stay valid. Failure only
    // means the pages stay resident, so the result is ignored.
    let _ = unsafe {
        map.unchecked_advise_range(
            memmap2::UncheckedAdvice::DontNeed,
            start as usize,
            (end - start) as usize,
        )
    };
}

#[cfg(not(unix))]
fn release(_map: &Mmap, _start: u64, _end: u64) {}

fn vector_slice<T>(v: Option<flatbuffers::Vector<'_, T>>) -> &[T] {
    match v {
        // SAFETY: the generated event structs are `repr(transparent)` byte arrays (alignment
        // 1), and the verifier checked the vector's bytes lie inside the buffer.
        Some(v) => unsafe { std::slice::from_raw_parts(v.bytes().as_ptr() as *const T, v.len()) },
        None => &[],
    }
}

fn read_header(
    data: &[u8],
    prelude: &Prelude,
    warnings: &mut Vec<Warning>,
) -> Result<Header, (u64, String)> {
    let start = PRELUDE_LEN;
    let data_offset = prelude.data_offset as usize;
    let with_crc = prelude.minor >= HEADER_CRC_MINOR;
    let crc_len = if with_crc { HEADER_CRC_LEN } else { 0 };
    if data_offset > data.len() || data_offset < start + 4 + crc_len || data_offset % 8 != 0 {
        return Err((
            12,
            format!(
                "data offset {} is impossible for a {}-byte file",
                data_offset,
                data.len()
            ),
        ));
    }
    let header_end = data_offset - crc_len;
    if with_crc {
        let stored =
            u32::from_le_bytes(data[header_end..data_offset].try_into().unwrap_or_default());
        if header_crc(&data[..header_end]) != stored {
            warnings.push(Warning {
                offset: header_end as u64,
                what: "header checksum mismatch: the header was damaged after it was written; its clock calibration, devices and layout fields may be wrong".into(),
                torn: false,
            });
        }
    }
    let size = u32::from_le_bytes(data[start..start + 4].try_into().unwrap_or_default()) as u64;
    let room = (header_end - start - 4) as u64;
    if size > room {
        return Err((
            start as u64,
            format!("header claims {size} bytes but only {room} fit before the data"),
        ));
    }
    let buf = &data[start..start + 4 + size as usize];
    if buf.len() < MIN_PREFIXED_LEN || !fb::header_size_prefixed_buffer_has_identifier(buf) {
        return Err((start as u64, "missing header identifier \"PSTH\"".into()));
    }
    let h = fb::size_prefixed_root_as_header_with_opts(&VERIFIER, buf)
        .map_err(|e| (start as u64, format!("header does not verify: {e}")))?;
    if h.mode() == fb::Mode::Ring && align8(h.chunk_size() as u64) < MIN_CHUNK_LEN {
        return Err((
            start as u64,
            format!(
                "ring mode with chunk_size {} bytes: no ring slot can hold a chunk",
                h.chunk_size()
            ),
        ));
    }
    let clock = h.clock().copied().unwrap_or_default();
    Ok(Header {
        format_major: prelude.major,
        format_minor: prelude.minor,
        writer: h.writer().unwrap_or("").to_owned(),
        ticks0: clock.ticks0(),
        mono_ns: clock.mono_ns(),
        unix_ns: clock.unix_ns(),
        ticks_per_ns: clock.ticks_per_ns(),
        pid: h.pid(),
        host: h.host().unwrap_or("").to_owned(),
        command_line: h
            .command_line()
            .map(|v| v.iter().map(str::to_owned).collect())
            .unwrap_or_default(),
        rank: h.rank(),
        world_size: h.world_size(),
        ring: (h.mode() == fb::Mode::Ring).then_some(h.ring_slots()),
        chunk_size: h.chunk_size(),
        cpu_source: h.cpu_source(),
        packed: h.packed(),
        devices: h
            .devices()
            .into_iter()
            .flatten()
            .map(|d| device_def(&d))
            .collect(),
    })
}

/// The smallest chunk: size prefix, root offset, identifier, and a `ChunkMeta` (32 bytes).
const MIN_CHUNK_LEN: u64 = 48;

/// Finds every chunk's (offset, length incl. prefix) without trusting anything but bounds.
fn walk(
    map: &Mmap,
    file: &File,
    data_offset: u64,
    header: &Header,
    warnings: &mut Vec<Warning>,
) -> Vec<(u64, u32)> {
    let data: &[u8] = map;
    let end = data.len() as u64;
    let mut spans = Vec::new();
    // Size prefixes are read with `pread` and map nothing; what reads through the mapping (ring
    // slots, the searches past a damaged or empty stretch) sets `mapped`, and the pages it
    // passed go back a window at a time.
    let mut mapped = false;
    let mut off = match frame_read(file, data, data_offset) {
        Frame::Chunk(len) => {
            spans.push((data_offset, len));
            align8(data_offset + len as u64)
        }
        other => {
            mapped = true;
            let next = resync(data, data_offset + 8);
            warnings.push(Warning {
                offset: data_offset,
                what: format!(
                    "the footer slot {}: whether the run finished is unknown; reading resumes at offset {next}",
                    other.describe(data_offset, end)
                ),
                torn: true,
            });
            next
        }
    };
    if let (Some(slots), false) = (header.ring, header.packed) {
        // read_header refused slots too small to hold a chunk, so the loop below is bounded by
        // the file's size however large `slots` claims to be.
        let slot_len = align8(header.chunk_size as u64);
        let fit = end.saturating_sub(off) / slot_len;
        if slots as u64 > fit {
            warnings.push(Warning {
                offset: off,
                what: format!(
                    "the header declares {slots} ring slots of {slot_len} bytes but only {fit} fit in the file: it was truncated or its header is damaged"
                ),
                torn: true,
            });
        }
        let slots = (slots as u64).min(fit);
        mapped = true;
        for i in 0..slots {
            let at = off + i * slot_len;
            match frame_at(data, at) {
                Frame::Chunk(len) if len as u64 <= slot_len => spans.push((at, len)),
                Frame::Zero => {}
                other => warnings.push(Warning {
                    offset: at,
                    what: format!(
                        "ring slot {i} does not hold a whole chunk ({}); skipped",
                        match other {
                            Frame::Chunk(len) => format!("a chunk of {len} bytes overflows it"),
                            other => other.describe(at, end),
                        }
                    ),
                    torn: true,
                }),
            }
        }
        off += slots * slot_len;
    }
    let mut released = data_offset;
    while off < end {
        if mapped && off - released >= WINDOW {
            release(map, released, off);
            released = off;
        }
        match frame_read(file, data, off) {
            Frame::Chunk(len) => {
                spans.push((off, len));
                off = align8(off + len as u64);
            }
            Frame::End => break,
            Frame::Zero => {
                mapped = true;
                // A chunk never starts with a zero size, so the search starts one word on.
                let Some(next) = next_nonzero_word(data, off + 8) else {
                    break;
                };
                warnings.push(Warning {
                    offset: off,
                    what: format!(
                        "{} bytes were reserved for a chunk that was never written (writer killed mid-chunk?)",
                        next - off
                    ),
                    torn: true,
                });
                off = next;
            }
            other => {
                mapped = true;
                let next = resync(data, off + 8);
                let tail = if next < end {
                    format!("reading resumes at the next chunk, at offset {next}")
                } else {
                    "no chunk follows".to_owned()
                };
                warnings.push(Warning {
                    offset: off,
                    what: format!("{}; {tail}", other.describe(off, end)),
                    torn: true,
                });
                off = next;
            }
        }
    }
    if mapped {
        release(map, released, end);
    }
    spans
}

/// What starts at an offset where a chunk may start.
#[derive(Debug, Clone, Copy)]
enum Frame {
    /// A size prefix that fits in the file followed by the chunk identifier: the length, prefix
    /// included.
    Chunk(u32),
    /// A zero size prefix: reserved, never written.
    Zero,
    /// A size that runs past the end of the file.
    Cut { claims: u64 },
    /// A size that fits, but no chunk identifier after it.
    NotAChunk { claims: u64 },
    /// Fewer than 4 bytes left.
    End,
}

impl Frame {
    fn describe(self, off: u64, end: u64) -> String {
        match self {
            Frame::Chunk(len) => format!("holds a chunk of {len} bytes"),
            Frame::Zero => "is empty (zero size prefix)".to_owned(),
            Frame::Cut { claims } => format!(
                "chunk claims {claims} bytes but the file ends after {}: the file is truncated or the size is damaged; the chunk is lost",
                end.saturating_sub(off)
            ),
            Frame::NotAChunk { claims } => format!(
                "no chunk starts here (a size prefix of {} bytes without the \"PSTC\" identifier): the size of the chunk before it or this chunk was damaged",
                claims.saturating_sub(4)
            ),
            Frame::End => "is cut off by the end of the file".to_owned(),
        }
    }
}

fn frame_at(data: &[u8], off: u64) -> Frame {
    let end = data.len() as u64;
    let head = data.get(off as usize..).unwrap_or_default();
    frame_head(&head[..head.len().min(MIN_PREFIXED_LEN)], off, end)
}

/// [`frame_at`], reading the frame's first bytes with a system call rather than through the
/// mapping: the walk visits one spot every chunk, and a fault there would map the pages
/// around it too (the kernel's fault-around), pages the walk would then have to give back.
/// Where the read fails, the mapping has the same bytes.
#[cfg(unix)]
fn frame_read(file: &File, data: &[u8], off: u64) -> Frame {
    use std::os::unix::fs::FileExt;
    let end = data.len() as u64;
    let mut head = [0u8; MIN_PREFIXED_LEN];
    let n = end.saturating_sub(off).min(MIN_PREFIXED_LEN as u64) as usize;
    match file.read_exact_at(&mut head[..n], off) {
        Ok(()) => frame_head(&head[..n], off, end),
        Err(_) => frame_at(data, off),
    }
}

#[cfg(not(unix))]
fn frame_read(_file: &File, data: &[u8], off: u64) -> Frame {
    frame_at(data, off)
}

/// The frame at `off` from its first bytes, `head` (up to [`MIN_PREFIXED_LEN`] of them).
fn frame_head(head: &[u8], off: u64, end: u64) -> Frame {
    if off.checked_add(4).is_none_or(|e| e > end) {
        return Frame::End;
    }
    let size = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as u64;
    if size == 0 {
        return Frame::Zero;
    }
    let claims = size + 4;
    if off + claims > end {
        return Frame::Cut { claims };
    }
    if claims < MIN_PREFIXED_LEN as u64 || &head[8..12] != fb::CHUNK_IDENTIFIER.as_bytes() {
        return Frame::NotAChunk { claims };
    }
    Frame::Chunk(claims as u32)
}

/// The first 8-aligned offset at or after `from` where a chunk starts, or the file's end.
fn resync(data: &[u8], from: u64) -> u64 {
    let end = data.len() as u64;
    let mut at = align8(from);
    while at < end {
        if let Frame::Chunk(_) = frame_at(data, at) {
            return at;
        }
        at += 8;
    }
    end
}

/// The first 8-aligned offset at or after `from` whose 8 bytes are not all zero.
fn next_nonzero_word(data: &[u8], from: u64) -> Option<u64> {
    data.get(from as usize..)?
        .chunks_exact(8)
        .position(|w| w != [0u8; 8])
        .map(|i| from + 8 * i as u64)
}

/// The file mapped read-only.
///
/// The file is locked for reading first (poolsight_schema::lock), and stays locked while the
/// returned `File` is open: a recorder finishing it meanwhile does not trim the file under the
/// mapping, which would kill this process with SIGBUS; a second recording never truncates a
/// file, it replaces it with a new one.
fn map_file(path: &Path) -> Result<(PathBuf, File, Mmap), ReadError> {
    let io = |source| ReadError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    if lock::lock_reading(&file, READ_LOCK_PATIENCE).map_err(io)? == lock::Taken::Busy {
        return Err(io(std::io::Error::new(
            std::io::ErrorKind::WouldBlock,
            "its recorder is finishing it right now; try again in a moment",
        )));
    }
    // SAFETY: the mapping is read-only, and with the reading lock held no poolsight process
    // shortens the file (see above); a program that is not poolsight could still truncate it.
    let map = unsafe { Mmap::map(&file) }.map_err(io)?;
    Ok((path.to_path_buf(), file, map))
}

/// How long an open waits for a finishing recorder's trim (a few ms at most).
const READ_LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);

/// Whether a chunk's checksum holds (by the rule of the file's format minor version).
fn crc_holds(buf: &[u8], meta: &fb::ChunkMeta, minor: u16) -> bool {
    let used = meta.used() as usize;
    let meta_at = meta_offset(buf, meta);
    let sum = if crc_covers_size_prefix(minor) {
        chunk_crc(buf, meta_at, 4 + used)
    } else {
        chunk_crc(&buf[4..], meta_at - 4, used)
    };
    sum == Some(meta.crc32())
}

/// A chunk that passed verification, and what was odd about it.
struct Verified {
    info: ChunkInfo,
    warning: Option<Warning>,
    /// The seqs of the further chunks a packed chunk holds.
    merged_seqs: Vec<u64>,
}

fn verify_chunk(
    data: &[u8],
    off: u64,
    len: u32,
    minor: u16,
    packed_trace: bool,
    deferred: bool,
) -> Result<Verified, Warning> {
    let bad = |what: String| Warning {
        offset: off,
        what,
        torn: true,
    };
    let buf = &data[off as usize..off as usize + len as usize];
    // flatbuffers asserts (panics) on buffers too short to hold an identifier.
    if buf.len() < MIN_PREFIXED_LEN || !fb::chunk_size_prefixed_buffer_has_identifier(buf) {
        return Err(bad("not a chunk (no \"PSTC\" identifier); skipped".into()));
    }
    let chunk = fb::size_prefixed_root_as_chunk_with_opts(&VERIFIER, buf)
        .map_err(|e| bad(format!("chunk does not verify ({e}); skipped")))?;
    let meta = chunk.meta();
    let used = meta.used() as usize;
    if used > buf.len() - 4 {
        return Err(bad(format!(
            "the chunk says it uses {used} bytes but holds {}: damaged; skipped",
            buf.len() - 4
        )));
    }
    let crc_holds = || crc_holds(buf, meta, minor);
    // Only a sealed event chunk's checksum may wait: the reader's walk needs nothing from
    // its events, and the replay checks it when it reads them.
    let defer = deferred
        && meta.state() == fb::ChunkState::Sealed
        && matches!(
            chunk.body_type(),
            fb::ChunkBody::MemEvents
                | fb::ChunkBody::ScopeEvents
                | fb::ChunkBody::MarkEvents
                | fb::ChunkBody::PackedEvents
        );
    let mut warning = None;
    let sealed = match meta.state() {
        fb::ChunkState::Sealed if defer || crc_holds() => true,
        fb::ChunkState::Sealed => {
            return Err(bad(
                "checksum mismatch: the chunk was corrupted after it was written; skipped".into(),
            ))
        }
        // The writer stores `used` and `crc32` only when sealing, the state last: an Open chunk
        // with either set had its state byte damaged, or its writer was killed mid-seal.
        fb::ChunkState::Open if meta.crc32() == 0 && used == 0 => false,
        fb::ChunkState::Open if crc_holds() => {
            warning = Some(Warning {
                offset: off,
                what: "the chunk is marked Open but its checksum is set and holds: its state byte was damaged, or its writer was killed while sealing it; read as sealed".into(),
                torn: false,
            });
            true
        }
        fb::ChunkState::Open if meta.crc32() == 0 => {
            warning = Some(Warning {
                offset: off,
                what: format!("the chunk is Open with no checksum but says it uses {used} bytes: its writer was killed while sealing it, or the chunk was damaged; its events are read unverified"),
                torn: false,
            });
            false
        }
        fb::ChunkState::Open => return Err(bad(
            "the chunk is marked Open but carries a checksum that does not hold: damaged; skipped"
                .into(),
        )),
        other => {
            return Err(bad(format!(
                "unknown chunk state {}: damaged; skipped",
                other.0
            )))
        }
    };
    let (kind, events) = match chunk.body_type() {
        fb::ChunkBody::MemEvents => (
            ChunkKind::Mem,
            chunk
                .body_as_mem_events()
                .and_then(|b| b.events())
                .map_or(0, |v| v.len()),
        ),
        fb::ChunkBody::ScopeEvents => (
            ChunkKind::Scope,
            chunk
                .body_as_scope_events()
                .and_then(|b| b.events())
                .map_or(0, |v| v.len()),
        ),
        fb::ChunkBody::MarkEvents => (
            ChunkKind::Mark,
            chunk
                .body_as_mark_events()
                .and_then(|b| b.events())
                .map_or(0, |v| v.len()),
        ),
        fb::ChunkBody::Defs => (ChunkKind::Defs, 0),
        fb::ChunkBody::Footer => (ChunkKind::Footer, 0),
        fb::ChunkBody::PackedEvents if packed_trace => {
            let p = chunk
                .body_as_packed_events()
                .ok_or_else(|| bad("packed chunk without a body; skipped".into()))?;
            return verify_packed(&p, sealed, off, len, meta, defer).map_err(bad);
        }
        other => return Err(bad(format!("unknown chunk body type {}; skipped", other.0))),
    };
    if matches!(kind, ChunkKind::Defs) && !sealed {
        return Err(bad("definitions chunk was never sealed; skipped".into()));
    }
    Ok(Verified {
        merged_seqs: Vec::new(),
        info: ChunkInfo {
            offset: off,
            len,
            kind,
            seq: meta.seq(),
            thread: meta.thread(),
            base_ticks: meta.base_ticks(),
            sealed,
            events: events as u32,
            packed: false,
            crc_deferred: defer,
        },
        warning,
    })
}

/// The checks of a packed chunk that need no decoding (docs/format.md, "Packed traces"): it
/// was sealed by `pack`, names an event body, and declares sizes its bytes can hold. Whether
/// the columns decode is found when they are read.
fn verify_packed(
    p: &fb::PackedEvents<'_>,
    sealed: bool,
    off: u64,
    len: u32,
    meta: &fb::ChunkMeta,
    defer: bool,
) -> Result<Verified, String> {
    if !sealed {
        return Err("packed chunk is not sealed; skipped".into());
    }
    let kind = match Packed::of_body(fb::ChunkBody(p.body())) {
        Some(Packed::Mem) => ChunkKind::Mem,
        Some(Packed::Scope) => ChunkKind::Scope,
        Some(Packed::Mark) => ChunkKind::Mark,
        None => {
            return Err(format!(
                "packed chunk of unknown body type {}; skipped",
                p.body()
            ))
        }
    };
    let min = Packed::of_body(fb::ChunkBody(p.body())).map_or(1, Packed::min_event_bytes);
    let encoded = p.encoded_len();
    if encoded > packed::MAX_ENCODED_LEN || (p.events() as u64) * (min as u64) > encoded as u64 {
        return Err(format!(
            "packed chunk declares {} events in {encoded} encoded bytes: damaged; skipped",
            p.events()
        ));
    }
    Ok(Verified {
        info: ChunkInfo {
            offset: off,
            len,
            kind,
            seq: meta.seq(),
            thread: meta.thread(),
            base_ticks: meta.base_ticks(),
            sealed: !p.open(),
            events: p.events(),
            packed: true,
            crc_deferred: defer,
        },
        warning: None,
        merged_seqs: p
            .more_seqs()
            .map(|v| v.iter().collect())
            .unwrap_or_default(),
    })
}

/// In grow mode the writer numbers chunks densely from 1 and nothing overwrites them, so a
/// `seq` that is absent (below the highest one found, or below the sealed footer's count) is a
/// chunk that was lost. The warning counts as a torn chunk only when no other one does: a
/// damaged chunk that was already reported is most likely the one missing.
fn check_seqs(
    chunks: &[ChunkInfo],
    merged: Vec<u64>,
    footer: Option<&Footer>,
    warnings: &mut Vec<Warning>,
) {
    let mut found: Vec<u64> = chunks
        .iter()
        .filter(|c| c.kind != ChunkKind::Footer && c.seq != 0)
        .map(|c| c.seq)
        .chain(merged.into_iter().filter(|&s| s != 0))
        .collect();
    found.sort_unstable();
    found.dedup();
    let last = found.last().copied().unwrap_or(0);
    let want = footer.map_or(last, |f| f.chunks.max(last));
    let missing = want - found.len() as u64;
    if missing == 0 {
        return;
    }
    const NAMED: usize = 5;
    let mut named = Vec::with_capacity(NAMED);
    let mut expect = 1u64;
    for &seq in found.iter().chain(std::iter::once(&want.saturating_add(1))) {
        while expect < seq && named.len() < NAMED {
            named.push(format!("#{expect}"));
            expect += 1;
        }
        if named.len() == NAMED {
            break;
        }
        expect = seq.saturating_add(1);
    }
    let more = if missing > named.len() as u64 {
        ", ..."
    } else {
        ""
    };
    let torn = !warnings.iter().any(|w| w.torn);
    warnings.push(Warning {
        offset: 0,
        what: format!(
            "{missing} of the {want} chunks the writer reserved are missing (seq {}{more}): lost to damage or truncation",
            named.join(", ")
        ),
        torn,
    });
}

fn merge_defs(defs: &mut Defs, d: &fb::Defs<'_>) {
    for s in d.strings().into_iter().flatten() {
        defs.strings
            .insert(s.id(), s.text().unwrap_or("").to_owned());
    }
    for f in d.frames().into_iter().flatten() {
        defs.frames.insert(
            f.id(),
            FrameDef {
                kind: f.kind(),
                phase: f.phase(),
                line: f.line(),
                file: f.file(),
                name: f.name(),
            },
        );
    }
    for s in d.stacks().into_iter().flatten() {
        defs.stacks.insert(s.id(), (s.parent(), s.frame()));
    }
    for t in d.threads().into_iter().flatten() {
        defs.threads.push(ThreadDef {
            id: t.id(),
            os_tid: t.os_tid(),
            name: t.name().unwrap_or("").to_owned(),
        });
    }
    for dev in d.devices().into_iter().flatten() {
        defs.devices.push(device_def(&dev));
    }
}

fn device_def(d: &fb::DeviceDef<'_>) -> DeviceDef {
    DeviceDef {
        id: d.id(),
        name: d.name().unwrap_or("").to_owned(),
        capacity: d.capacity(),
        allocation_unit: d.allocation_unit(),
    }
}
