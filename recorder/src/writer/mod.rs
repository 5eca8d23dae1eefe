//! The trace writer: how an event gets from a training thread onto disk.
//!
//! - [`file`]: the memory-mapped file, preallocation, reservations (bump region and ring);
//! - [`chunk`]: chunk templates, appending in place, sealing;
//! - [`thread`]: per-thread writers (the hot path);
//! - [`defs`]: interning of strings, frames and stacks.
//!
//! File layout (docs/format.md): prelude, header, header checksum, a fixed footer slot, the ring
//! slots in ring mode, then the bump region where event chunks (grow mode), definitions and
//! marks go.

mod chunk;
mod defs;
mod file;
pub(crate) mod fork;
mod mapping;
mod prepare;
mod thread;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flatbuffers::FlatBufferBuilder;
use poolsight_schema::header::Header;
use poolsight_schema::{align8, data_offset, fb, finish_chunk, header_region};

pub use defs::{DeviceInfo, Frame};
pub use thread::MemRecord;

use crate::clock::{self, Calibration};
pub use crate::cpu::CpuSource;
use crate::error::RecorderError;
use crate::kinds::{MarkKind, MemKind};
use chunk::{write_sealed, Stream, Template};
use file::{MappedFile, Region};

/// How the file holds event chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Lossless: the file grows as long as the run records.
    Grow,
    /// Flight recorder: `slots` event chunks of `chunk_size` bytes; the oldest are overwritten.
    Ring { slots: u32 },
}

/// Settings for [`Recorder::create`]. `RecorderConfig::default()` is lossless and fine for most
/// runs.
#[derive(Debug, Clone)]
pub struct RecorderConfig {
    pub mode: Mode,
    /// Bytes per event chunk (also the ring slot size). Larger chunks mean fewer atomics and
    /// smaller files; smaller ones mean less unused space per thread. 4 KiB to 16 MiB.
    pub chunk_size: u32,
    /// The file never grows past this many bytes; recording stops (and counts what it drops)
    /// when it would. Also the size of the virtual mapping.
    pub max_bytes: u64,
    pub rank: Option<u32>,
    pub world_size: Option<u32>,
    /// Devices known up front; pools define theirs when a trace hook is attached.
    pub devices: Vec<DeviceInfo>,
    pub cpu_source: CpuSource,
    /// The command line stored in the header; `None` takes this process's arguments.
    pub command_line: Option<Vec<String>>,
    /// How long to measure the clock rate at start (the footer adds a second point).
    pub calibration: Duration,
    /// Replace a file already at the path (never one being recorded). Off by default: an
    /// existing file is an error. The new recording is a new file renamed over the old one, so
    /// a reader of the old file keeps reading it.
    pub overwrite: bool,
    /// Where timestamps come from: this process's clock, or the caller's.
    pub clock: ClockSource,
    /// Written in the header of a trace converted from another tool's file.
    pub import: Option<ImportInfo>,
}

/// The clock a recorder's timestamps are read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClockSource {
    /// This process's clock ([`clock::ticks`]), calibrated at start and at finish.
    #[default]
    Process,
    /// Ticks are nanoseconds given by the caller, counted from 0 = `unix_ns` (the Unix time of
    /// the run's start): for a writer that converts a run recorded elsewhere, through the
    /// `*_at` methods and [`Recorder::finish_at`].
    Explicit { unix_ns: u64 },
}

/// What a converted trace came from (`Header.import`; the format's one definition).
pub use poolsight_schema::header::Import as ImportInfo;
pub use poolsight_schema::header::Prediction;

impl Default for RecorderConfig {
    fn default() -> Self {
        RecorderConfig {
            mode: Mode::Grow,
            chunk_size: 64 << 10,
            max_bytes: 1 << 40,
            rank: None,
            world_size: None,
            devices: Vec::new(),
            cpu_source: CpuSource::None,
            command_line: None,
            calibration: Duration::from_millis(10),
            overwrite: false,
            clock: ClockSource::Process,
            import: None,
        }
    }
}

/// What a finished recording wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// Events in sealed chunks (chunks still owned by live threads are not counted here, but
    /// their events are in the file).
    pub events: u64,
    pub chunks: u64,
    pub dropped_events: u64,
    pub file_bytes: u64,
    /// This process is a child forked from the one that created the recorder (a `DataLoader`
    /// worker): it recorded nothing, and left the file alone for its parent to finish.
    pub forked: bool,
}

/// Keys per-recorder caches in thread-locals: a counter, never an address, because an address
/// can be reused by a later recorder whose ids differ.
static NEXT_RECORDER_ID: AtomicU64 = AtomicU64::new(1);

pub(crate) struct Shared {
    id: u64,
    cpu_source: CpuSource,
    /// Shared with the preparer thread, which may outlive the recorder by a moment.
    file: Arc<MappedFile>,
    templates: [Template; 3],
    chunk_len: u64,
    mark_chunk_len: u64,
    seq: AtomicU64,
    next_thread: AtomicU32,
    closed: AtomicBool,
    dropped: AtomicU64,
    events: AtomicU64,
    chunks: AtomicU64,
    interner: Mutex<defs::Interner>,
    footer: Region,
    calibration: Calibration,
    /// The fork generation this recorder was created in: a child forked since then holds a
    /// copy of it and must not write (see [`fork`]).
    forks: u64,
}

impl Shared {
    /// Whether this process is a child forked since the recorder was created.
    #[inline]
    fn forked(&self) -> bool {
        fork::forked_since(self.forks)
    }

    fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed)
    }

    fn template(&self, stream: Stream) -> &Template {
        &self.templates[stream as usize]
    }

    fn count_dropped(&self, n: u64) {
        self.dropped.fetch_add(n, Ordering::Relaxed);
    }
}

/// Owns a trace file being written. Dropping it finishes the file; [`Recorder::finish`] does the
/// same and reports errors. Record through [`Recorder::handle`] (cheap to clone, `Send + Sync`).
pub struct Recorder {
    handle: Handle,
    finished: bool,
}

/// A cloneable reference to a recorder, for hooks, scopes and other threads.
#[derive(Clone)]
pub struct Handle {
    shared: Arc<Shared>,
}

impl Recorder {
    /// Creates `path` and writes the header. Fails with a clear error when the file cannot be
    /// created, mapped or preallocated — never later, in the middle of training — and when it
    /// exists: [`RecorderError::Busy`] while another recording writes it (one recording per
    /// file), else [`RecorderError::Exists`] unless [`RecorderConfig::overwrite`].
    pub fn create(
        path: impl AsRef<Path>,
        config: RecorderConfig,
    ) -> Result<Recorder, RecorderError> {
        // Kept absolute, so that [`Handle::path`] still names the file after the process
        // changes directory (packing at finish opens it again by name).
        let path = std::path::absolute(path.as_ref()).unwrap_or_else(|_| path.as_ref().into());
        let path = path.as_path();
        if !(4096..=16 << 20).contains(&config.chunk_size) {
            return Err(RecorderError::Config(format!(
                "chunk_size must be between 4 KiB and 16 MiB, got {} bytes",
                config.chunk_size
            )));
        }
        let calibration = match config.clock {
            ClockSource::Process => Calibration::measure(config.calibration),
            ClockSource::Explicit { unix_ns } => Calibration {
                ticks: 0,
                mono_ns: 0,
                unix_ns,
                ticks_per_ns: 1.0,
            },
        };
        let header = build_header(&config, &calibration);
        let data_offset = data_offset(header.len());
        let footer_bytes = build_footer(&FooterFields::default());
        let footer_len = align8(footer_bytes.len() as u64);
        let chunk_len = align8(config.chunk_size as u64);
        let ring_start = data_offset + footer_len;
        let (fixed_len, ring) = match config.mode {
            Mode::Grow => (ring_start, None),
            Mode::Ring { slots } => {
                if slots < 2 {
                    return Err(RecorderError::Config(
                        "ring mode needs at least 2 slots".into(),
                    ));
                }
                let ring_len = chunk_len * slots as u64;
                (
                    ring_start + ring_len,
                    Some((ring_start, chunk_len, slots as u64)),
                )
            }
        };
        let file = Arc::new(MappedFile::create(
            path,
            fixed_len,
            chunk_len,
            ring,
            config.max_bytes,
            config.overwrite,
        )?);
        prepare::spawn(&file);
        file.write_at(0, &header_region(&header));
        let footer = Region {
            offset: data_offset,
            len: footer_len,
            slot: None,
        };
        // An Open footer until finish: its absence of a seal tells readers the writer never
        // finished.
        file.write_at(footer.offset, &footer_bytes);
        file.write_at(footer.offset, &((footer.len - 4) as u32).to_le_bytes());
        let shared = Shared {
            id: NEXT_RECORDER_ID.fetch_add(1, Ordering::Relaxed),
            cpu_source: config.cpu_source,
            file,
            templates: Stream::ALL.map(Template::build),
            chunk_len,
            mark_chunk_len: 4096,
            seq: AtomicU64::new(1),
            next_thread: AtomicU32::new(1),
            closed: AtomicBool::new(false),
            dropped: AtomicU64::new(0),
            events: AtomicU64::new(0),
            chunks: AtomicU64::new(0),
            interner: Mutex::new(defs::Interner::default()),
            footer,
            calibration,
            forks: fork::generation(),
        };
        Ok(Recorder {
            handle: Handle {
                shared: Arc::new(shared),
            },
            finished: false,
        })
    }

    pub fn handle(&self) -> Handle {
        self.handle.clone()
    }

    /// Seals this thread's chunks, writes the footer (second clock point, dropped events),
    /// flushes and trims the file. Chunks of threads still running stay open in the file with
    /// every event they hold; events recorded after this (or racing with it) are dropped and
    /// counted by the handle, not the file.
    pub fn finish(mut self) -> Result<Summary, RecorderError> {
        self.finish_inner(None)
    }

    /// [`Recorder::finish`] for a recorder on a [`ClockSource::Explicit`] clock: the run ended
    /// at `end_ticks` (its duration, in ns).
    pub fn finish_at(mut self, end_ticks: u64) -> Result<Summary, RecorderError> {
        self.finish_inner(Some(end_ticks))
    }

    fn finish_inner(&mut self, end: Option<u64>) -> Result<Summary, RecorderError> {
        self.finished = true;
        let shared = &self.handle.shared;
        if shared.forked() {
            // The parent finishes its trace; a forked child leaves the file alone.
            shared.closed.store(true, Ordering::Release);
            return Ok(Summary {
                events: 0,
                chunks: 0,
                dropped_events: shared.dropped.load(Ordering::Relaxed),
                file_bytes: 0,
                forked: true,
            });
        }
        thread::seal_current_thread(shared);
        // The file counts what was dropped while it recorded; events that race with the finish
        // (a thread still recording) are after it, counted by the handle only.
        let dropped_while_recording = shared.dropped.load(Ordering::Acquire);
        shared.closed.store(true, Ordering::Release);
        let data_end = shared.file.close();
        let (end_ticks, end_mono_ns, end_unix_ns) = match end {
            Some(t) => (t, t, shared.calibration.unix_ns.saturating_add(t)),
            None => Calibration::now(),
        };
        let fields = FooterFields {
            end_ticks,
            end_mono_ns,
            end_unix_ns,
            dropped_events: dropped_while_recording,
            chunks: shared.seq.load(Ordering::Relaxed) - 1,
            data_end,
        };
        let bytes = build_footer(&fields);
        write_sealed(&shared.file, &shared.footer, &bytes, 0);
        shared
            .file
            .sync_and_trim(data_end)
            .map_err(|e| RecorderError::Io {
                path: shared.file.path().to_path_buf(),
                what: "flush",
                source: e,
            })?;
        Ok(Summary {
            events: shared.events.load(Ordering::Relaxed),
            chunks: shared.chunks.load(Ordering::Relaxed),
            dropped_events: fields.dropped_events,
            file_bytes: data_end,
            forked: false,
        })
    }
}

impl std::ops::Deref for Recorder {
    type Target = Handle;
    fn deref(&self) -> &Handle {
        &self.handle
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        if !self.finished {
            if let Err(e) = self.finish_inner(None) {
                eprintln!("poolsight: {e}");
            }
        }
    }
}

impl Handle {
    /// Records one memory event on this thread.
    ///
    /// This is also the entry point for observers of allocators other than poolsight's pool
    /// (PyTorch's caching allocator, a CuPy `MemoryHook`): the reports need, per allocation, a
    /// `MallocPost` (address, requested size, stack, an id), per free a `FreePost` (same address
    /// and device, the size the allocation was accounted with), and, when the observer sees
    /// the allocator take memory from the device or give it back, `AllocPost` and `Release`.
    /// The stack comes from [`Handle::current_stack`], [`Handle::foreign_stack`] or
    /// [`Handle::intern_frames`].
    #[inline]
    pub fn record_mem(&self, r: MemRecord) {
        thread::with_writer(&self.shared, |w| w.mem(&r, clock::ticks()));
    }

    /// [`Handle::record_mem`] at `ticks` ([`now_ticks`]) read earlier: inside the allocator's
    /// lock, so that events of different threads on the same block keep the allocator's order
    /// (a free on one thread before the next malloc of the block on another). `ticks` must not
    /// be earlier than this thread's previous memory event: a thread whose events go back in
    /// time is read correctly, but replayed more slowly.
    #[inline]
    pub fn record_mem_at(&self, r: MemRecord, ticks: u64) {
        thread::with_writer(&self.shared, |w| w.mem(&r, ticks));
    }

    /// Records that the block at `ptr` on `device` (`bytes`, its size as its allocation was
    /// accounted) now belongs to `stack`, its live bytes unchanged (`MemKind::Relabel`, format
    /// 1.6): an observer that learns later what a block is (a tensor that became a parameter's
    /// gradient, an optimizer's state) moves it in one event, so that the reports of what is
    /// live at an instant show it under `stack` while cumulative figures count it once, where
    /// it was made.
    #[inline]
    pub fn record_relabel(&self, device: u32, ptr: u64, bytes: u64, stack: u32) {
        self.record_mem(MemRecord {
            ptr,
            bytes,
            stack,
            ..MemRecord::new(MemKind::Relabel, device, 0)
        });
    }

    /// Records a scope that opened at `start_ticks` ([`clock::ticks`]) and closes now. `stack`
    /// is the interned stack whose innermost frame is the scope.
    #[inline]
    pub fn record_scope(&self, stack: u32, start_ticks: u64) {
        thread::with_writer(&self.shared, |w| {
            w.scope(stack, start_ticks, clock::ticks())
        });
    }

    /// [`Handle::record_scope`] for a scope that closed at `end_ticks`: for a writer that
    /// replays a run recorded elsewhere, with [`ClockSource::Explicit`] timestamps.
    #[inline]
    pub fn record_scope_at(&self, stack: u32, start_ticks: u64, end_ticks: u64) {
        thread::with_writer(&self.shared, |w| w.scope(stack, start_ticks, end_ticks));
    }

    /// Records a rare event (epoch boundary, CPU sample) with an absolute timestamp.
    pub fn record_mark(&self, kind: MarkKind, aux: u32, a: u64, b: u64) {
        thread::with_writer(&self.shared, |w| w.mark(kind, aux, a, b, clock::ticks()));
    }

    /// [`Handle::record_mark`] at `ticks`.
    pub fn record_mark_at(&self, kind: MarkKind, aux: u32, a: u64, b: u64, ticks: u64) {
        thread::with_writer(&self.shared, |w| w.mark(kind, aux, a, b, ticks));
    }

    pub fn intern_string(&self, s: &str) -> u32 {
        self.shared.intern_string(s)
    }

    pub fn intern_frame(&self, frame: &Frame) -> u32 {
        self.shared.intern_frame(frame)
    }

    /// The stack made of `parent` (0 for none) with `frame` innermost.
    pub fn intern_stack(&self, parent: u32, frame: u32) -> u32 {
        self.shared.intern_stack(parent, frame)
    }

    /// Interns a whole stack given outermost first (a Python traceback, say).
    pub fn intern_frames(&self, frames: &[Frame]) -> u32 {
        self.shared.intern_frames(frames)
    }

    /// Interns many stacks at once, written as one definitions chunk: `frames` are distinct
    /// frames, and each stack lists indices into them, outermost first (a converter that
    /// meets each frame in many stacks). Returns each stack's id, as
    /// [`Handle::intern_frames`] would.
    pub fn intern_stacks<S: AsRef<[u32]>>(&self, frames: &[Frame], stacks: &[S]) -> Vec<u32> {
        self.shared.intern_stacks(frames, stacks)
    }

    pub fn define_device(&self, device: DeviceInfo) {
        self.shared.define_device(device)
    }

    /// Whether this process is a child forked since the recorder was created (a `DataLoader`
    /// worker): what it records here is dropped, so an observer may pass its work over.
    #[inline]
    pub fn forked(&self) -> bool {
        self.shared.forked()
    }

    /// Events dropped so far (the file could not grow, or recording had stopped).
    pub fn dropped_events(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }

    pub fn path(&self) -> PathBuf {
        self.shared.file.path().to_path_buf()
    }

    /// Unique among the recorders of this process, never reused.
    pub fn id(&self) -> u64 {
        self.shared.id
    }

    /// Where this recorder's CPU memory figures come from (as written in the header).
    pub fn cpu_source(&self) -> CpuSource {
        self.shared.cpu_source
    }

    /// Ticks-per-ns measured at start.
    pub fn ticks_per_ns(&self) -> f64 {
        self.shared.calibration.ticks_per_ns
    }
}

fn build_header(config: &RecorderConfig, cal: &Calibration) -> Vec<u8> {
    Header {
        format_major: poolsight_schema::FORMAT_MAJOR,
        format_minor: poolsight_schema::FORMAT_MINOR,
        writer: concat!("poolsight-recorder ", env!("CARGO_PKG_VERSION")).into(),
        ticks0: cal.ticks,
        mono_ns: cal.mono_ns,
        unix_ns: cal.unix_ns,
        ticks_per_ns: cal.ticks_per_ns,
        pid: std::process::id(),
        host: hostname(),
        command_line: config
            .command_line
            .clone()
            .unwrap_or_else(|| std::env::args().collect()),
        rank: config.rank,
        world_size: config.world_size,
        ring: match config.mode {
            Mode::Grow => None,
            Mode::Ring { slots } => Some(slots),
        },
        chunk_size: config.chunk_size,
        cpu_source: match config.cpu_source {
            CpuSource::None => fb::CpuSource::None,
            CpuSource::Heap => fb::CpuSource::Heap,
            CpuSource::Rss => fb::CpuSource::Rss,
            CpuSource::Tracemalloc => fb::CpuSource::Tracemalloc,
        },
        devices: config.devices.clone(),
        packed: false,
        import: config.import.clone(),
    }
    .encode()
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into our buffer.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if rc != 0 {
        return String::new();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

#[derive(Default)]
struct FooterFields {
    end_ticks: u64,
    end_mono_ns: u64,
    end_unix_ns: u64,
    dropped_events: u64,
    chunks: u64,
    data_end: u64,
}

/// The footer always has the same size (every field is written even when zero), so the
/// placeholder written at create and the real one written at finish share one region.
fn build_footer(f: &FooterFields) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::with_capacity(256);
    fbb.force_defaults(true);
    let footer = fb::Footer::create(
        &mut fbb,
        &fb::FooterArgs {
            end_ticks: f.end_ticks,
            end_mono_ns: f.end_mono_ns,
            end_unix_ns: f.end_unix_ns,
            dropped_events: f.dropped_events,
            chunks: f.chunks,
            data_end: f.data_end,
        },
    );
    finish_chunk(&mut fbb, fb::ChunkBody::Footer, footer.as_union_value())
}

/// Ticks now, for [`Handle::record_scope`]'s `start_ticks` and [`Handle::record_mem_at`].
#[inline]
pub fn now_ticks() -> u64 {
    clock::ticks()
}
