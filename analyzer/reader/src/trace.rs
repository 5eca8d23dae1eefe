//! [`Trace`]: an open, verified trace file, its events read in place from the mapping.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use memmap2::Mmap;
use poolsight_schema::{fb, lock, Prelude};
use rayon::prelude::*;

use super::packed::{self, Packed};
use super::pages::{release_window, windows};
use super::types::{ChunkInfo, Defs, Events, Footer, Header, ReadError, Warning};
use super::verify::{check_seqs, crc_holds, read_header, verify_chunk, Verified};
use super::walk::walk;

/// An open, verified trace. Events are read in place from the mapping.
pub struct Trace {
    pub path: PathBuf,
    pub(super) map: Mmap,
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
    /// What the stack ids of the events read are (see [`Trace::renumber_stacks`]); `None`: as
    /// in the file.
    stack_ids: Option<Box<[u32]>>,
}

impl Trace {
    pub fn open(path: impl AsRef<Path>) -> Result<Trace, ReadError> {
        let path = path.as_ref();
        Self::open_named(path, path, false)
    }

    /// [`Trace::open`] of the file at `file` (with `deferred`, [`Trace::open_deferred`]), named
    /// `name` in its [`Trace::path`] and in its errors: a trace converted from a file the user
    /// named (a PyTorch snapshot) reads as that file.
    pub fn open_named(file: &Path, name: &Path, deferred: bool) -> Result<Trace, ReadError> {
        let (file, map) = map_file(file, name)?;
        Self::from_map(name.to_path_buf(), file, map, deferred)
    }

    /// [`Trace::open`], except that the checksums of sealed event chunks are not checked here
    /// but when the replay first reads each chunk, while its bytes are in the cache: one pass
    /// over the file instead of two. Everything else is verified as `open` verifies it, so
    /// reading the trace is as safe; but until [`Trace::checksums_hold`] says so, a corrupted
    /// chunk's events may have been read as if they were sound. Use it only as
    /// `poolsight_analyzer::load` does: replay, then, unless every checksum held, open the file
    /// again with `open` (which names the corrupted chunks and leaves them out) and replay
    /// that instead.
    pub fn open_deferred(path: impl AsRef<Path>) -> Result<Trace, ReadError> {
        let path = path.as_ref();
        Self::open_named(path, path, true)
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
            stack_ids: None,
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

    /// The raw bytes of the file.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    pub(super) fn chunk_root(&self, c: &ChunkInfo) -> fb::Chunk<'_> {
        let buf = &self.map[c.offset as usize..c.offset as usize + c.len as usize];
        // SAFETY: this exact range passed the verifier when the trace was opened, and the
        // mapping is immutable for the Trace's lifetime.
        unsafe { fb::size_prefixed_root_as_chunk_unchecked(buf) }
    }

    /// Memory events of a `Mem` chunk, in place or decoded (empty for other kinds). Inlined
    /// into the replay's loops (another crate's), which iterate what it gives.
    #[inline]
    pub fn mem_events(&self, c: &ChunkInfo) -> Events<'_, fb::MemEvent> {
        let events = self.events(c, Packed::Mem, packed::decode_mem, |b| {
            b.body_as_mem_events().and_then(|b| b.events())
        });
        self.renumbered(events, |e, id| e.set_stack(id(e.stack())))
    }

    #[inline]
    pub fn scope_events(&self, c: &ChunkInfo) -> Events<'_, fb::ScopeEvent> {
        let events = self.events(c, Packed::Scope, packed::decode_scope, |b| {
            b.body_as_scope_events().and_then(|b| b.events())
        });
        // Stack 0 marks a rebase (its `duration` is the new base), not a scope.
        self.renumbered(events, |e, id| {
            if e.stack() != 0 {
                e.set_stack(id(e.stack()))
            }
        })
    }

    #[inline]
    pub fn mark_events(&self, c: &ChunkInfo) -> Events<'_, fb::MarkEvent> {
        let events = self.events(c, Packed::Mark, packed::decode_mark, |b| {
            b.body_as_mark_events().and_then(|b| b.events())
        });
        // Only a raised call's mark names a stack (its `aux`).
        self.renumbered(events, |e, id| {
            if e.kind() == fb::MarkKind::ScopeAbort {
                e.set_aux(id(e.aux()))
            }
        })
    }

    /// The events of chunk `c`: decoded from a packed chunk of `kind`, else in place in the
    /// vector `body` finds in the chunk.
    fn events<'a, T>(
        &'a self,
        c: &ChunkInfo,
        kind: Packed,
        decode: fn(&[u8], u32) -> Result<Vec<T>, packed::DecodeError>,
        body: impl FnOnce(fb::Chunk<'a>) -> Option<flatbuffers::Vector<'a, T>>,
    ) -> Events<'a, T> {
        if c.packed {
            return self.decode(c, kind, decode);
        }
        Events::Mapped(vector_slice(body(self.chunk_root(c))))
    }

    /// Shows the trace through other definitions: from now on `defs` are its definitions and
    /// an event read with stack `s` carries stack `ids[s]` (ids past the end of `ids` as they
    /// are). The loading step shows a trace's stacks through a view of their frames this way
    /// (`--frames`), where dropping frames makes several stacks one. The file is untouched;
    /// the events of a renumbered trace are copied out of the mapping as they are read.
    pub fn renumber_stacks(&mut self, defs: Defs, ids: Vec<u32>) {
        self.defs = defs;
        self.stack_ids = Some(ids.into_boxed_slice());
    }

    /// `events` with their stacks renumbered by `set` (see [`Trace::renumber_stacks`]).
    fn renumbered<'a, T: Copy>(
        &self,
        events: Events<'a, T>,
        set: impl Fn(&mut T, &dyn Fn(u32) -> u32),
    ) -> Events<'a, T> {
        let Some(ids) = &self.stack_ids else {
            return events;
        };
        let id = |s: u32| ids.get(s as usize).copied().unwrap_or(s);
        let mut v = match events {
            Events::Mapped(s) => s.to_vec(),
            Events::Decoded(v) => v,
        };
        for e in &mut v {
            set(e, &id);
        }
        Events::Decoded(v)
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
    /// they make the run incomplete (see `poolsight_analyzer::load::incomplete`).
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

fn vector_slice<T>(v: Option<flatbuffers::Vector<'_, T>>) -> &[T] {
    match v {
        // SAFETY: the generated event structs are `repr(transparent)` byte arrays (alignment
        // 1), and the verifier checked the vector's bytes lie inside the buffer.
        Some(v) => unsafe { std::slice::from_raw_parts(v.bytes().as_ptr() as *const T, v.len()) },
        None => &[],
    }
}

/// The file mapped read-only; errors name it `name`.
///
/// The file is locked for reading first (poolsight_schema::lock), and stays locked while the
/// returned `File` is open: a recorder finishing it meanwhile does not trim the file under the
/// mapping, which would kill this process with SIGBUS; a second recording never truncates a
/// file, it replaces it with a new one.
fn map_file(path: &Path, name: &Path) -> Result<(File, Mmap), ReadError> {
    let io = |source| ReadError::Io {
        path: name.to_path_buf(),
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
    Ok((file, map))
}

/// How long an open waits for a finishing recorder's trim (a few ms at most).
const READ_LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);
