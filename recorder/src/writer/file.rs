//! The trace file as a memory-mapped region, and how chunk space is handed out.
//!
//! The whole file is mapped once at a large virtual length (`max_bytes`) and never remapped, so
//! threads keep raw pointers into it for the life of the recorder. Only the part of the file
//! that was preallocated (`posix_fallocate` on Linux, zeros written elsewhere) is ever touched:
//! a write past the end of a mapped file raises SIGBUS, and a write into a sparse hole on a full
//! disk does too, so blocks are allocated before a chunk is handed out, never after.
//!
//! Where the process has not `max_bytes` of address space left (`ulimit -v`; each recording
//! holds its mapping until it finishes, then its file's pages until it is let go), the file is
//! mapped at a share of what is left (see [`map_within`]), and that is its size cap, said on
//! stderr when the recording begins: a recording that cannot reserve a terabyte still records,
//! and leaves the training most of what there is.
//!
//! The process's file size limit (`RLIMIT_FSIZE`, `ulimit -f`) is a size cap like `max_bytes`:
//! growing a file past it kills the process with SIGXFSZ, so the file is never grown past it;
//! recording stops there and later events are dropped and counted.
//!
//! Space comes from two places:
//! - the bump region: one atomic `fetch_add` per chunk; the file grows behind it in steps;
//! - in ring mode, a fixed array of slots for event chunks, claimed round-robin.
//!
//! Closing is folded into the bump counter (`CLOSED` bit), so a reservation and `close` are
//! ordered by one atomic: a reservation either lands below the final data end or fails.
//!
//! The preparer thread (`prepare.rs`) keeps the file allocated and its pages faulted in ahead
//! of both; a writer that gets ahead of it grows the file itself, as below.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;

use poolsight_schema::lock::{self, Taken};

use super::mapping::{map_within, Mapping};
use super::prepare::{ahead, Populate, Signal, AHEAD};
use crate::RecorderError;

const CLOSED: u64 = 1 << 63;
/// Smallest growth step; steps double up to [`MAX_GROW_STEP`] so a long run makes few syscalls.
const MIN_GROW_STEP: u64 = 4 << 20;
const MAX_GROW_STEP: u64 = 256 << 20;

const SLOT_FREE: u8 = 0;
const SLOT_OWNED: u8 = 1;

pub(crate) struct MappedFile {
    path: PathBuf,
    file: File,
    map: Mapping,
    max_bytes: u64,
    /// What sets `max_bytes`, for the message when recording stops there.
    cap: SizeCap,
    /// Bytes of the file preallocated so far; everything below may be written.
    committed: AtomicU64,
    /// Next free offset of the bump region, with the CLOSED bit once closed.
    bump: AtomicU64,
    grow_step: Mutex<u64>,
    failed: AtomicBool,
    ring: Option<Ring>,
    /// Offset below which the bump region is allocated and faulted in (`u64::MAX` once that
    /// reaches the size cap). Only the preparer stores it; writers read it, relaxed, as a hint
    /// of when to wake the preparer.
    prepared: AtomicU64,
    signal: Signal,
}

struct Ring {
    start: u64,
    slot_len: u64,
    cursor: AtomicU64,
    /// Which slots a live thread is writing; process-local, the file has no say in ownership.
    owned: Box<[AtomicU8]>,
    /// Slots the preparer keeps ready past the cursor: [`AHEAD`] bytes of them.
    ahead: u64,
    /// Cursor value below which the slots are faulted in; stored by the preparer only.
    prepared: AtomicU64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SizeCap {
    Config,
    FileSizeLimit,
    AddressSpace,
}

/// `bytes` in the largest binary unit it reaches: `1 TiB`, `2 GiB`, `1.5 GiB`, `256 MiB`.
pub(super) fn size_text(bytes: u64) -> String {
    for (unit, shift) in [("TiB", 40), ("GiB", 30), ("MiB", 20)] {
        if bytes >= 1u64 << shift {
            let v = bytes as f64 / (1u64 << shift) as f64;
            return if v.fract() == 0.0 {
                format!("{v:.0} {unit}")
            } else {
                format!("{v:.1} {unit}")
            };
        }
    }
    format!("{bytes} bytes")
}

/// The process's soft file size limit in bytes, `None` when unlimited.
// `rlim_t` is not `u64` on every Unix.
#[allow(clippy::unnecessary_cast)]
fn file_size_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct we own.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_FSIZE, &mut lim) };
    (rc == 0 && lim.rlim_cur != libc::RLIM_INFINITY).then_some(lim.rlim_cur as u64)
}

/// A region handed out for one chunk.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Region {
    pub offset: u64,
    pub len: u64,
    /// Ring slot index, for release.
    pub slot: Option<usize>,
}

impl MappedFile {
    /// Creates the file, locked for this recording ([`open_new`]), and maps it. `fixed_len`
    /// bytes from offset 0 (prelude, header, footer slot and the ring, if any) are
    /// preallocated at once. The file never grows
    /// past `max_bytes` nor past the process's file size limit, and creating it fails when
    /// that cap leaves no room for the fixed part and one chunk of `chunk_len` bytes.
    pub fn create(
        path: &Path,
        fixed_len: u64,
        chunk_len: u64,
        ring: Option<(u64, u64, u64)>,
        max_bytes: u64,
        overwrite: bool,
    ) -> Result<MappedFile, RecorderError> {
        let err = |what: &'static str, e: std::io::Error| RecorderError::Io {
            path: path.to_path_buf(),
            what,
            source: e,
        };
        let (max_bytes, cap) = match file_size_limit() {
            Some(limit) if limit < max_bytes => (limit, SizeCap::FileSizeLimit),
            _ => (max_bytes, SizeCap::Config),
        };
        if fixed_len > max_bytes {
            return Err(RecorderError::Config(format!(
                "the fixed part of the trace ({fixed_len} bytes) exceeds max_bytes ({max_bytes})"
            )));
        }
        let first_len = fixed_len + chunk_len;
        if cap == SizeCap::FileSizeLimit && first_len > max_bytes {
            return Err(err(
                    "create",
                    std::io::Error::new(
                        std::io::ErrorKind::FileTooLarge,
                        format!(
                            "the process's file size limit (RLIMIT_FSIZE, ulimit -f) is {max_bytes} bytes, \
                             but the header, footer slot, ring and a first chunk need {first_len}"
                        ),
                    ),
                ));
        }
        let NewFile { file, at } = open_new(path, overwrite)?;
        let fail = |e: RecorderError| {
            // Nothing of a recording that could not start is left behind: not the file made
            // for it, and not a replaced file (replaced only once the new one stands).
            let _ = std::fs::remove_file(&at);
            e
        };
        let (map, max_bytes, cap) =
            map_within(&file, path, max_bytes, cap, first_len).map_err(|e| fail(err("map", e)))?;
        let ring = ring.map(|(start, slot_len, slots)| Ring {
            start,
            slot_len,
            cursor: AtomicU64::new(0),
            owned: (0..slots).map(|_| AtomicU8::new(SLOT_FREE)).collect(),
            ahead: (AHEAD / slot_len).clamp(1, slots),
            prepared: AtomicU64::new(0),
        });
        let mapped = MappedFile {
            path: path.to_path_buf(),
            file,
            map,
            max_bytes,
            cap,
            committed: AtomicU64::new(0),
            bump: AtomicU64::new(fixed_len),
            grow_step: Mutex::new(MIN_GROW_STEP),
            failed: AtomicBool::new(false),
            ring,
            prepared: AtomicU64::new(0),
            signal: Signal::new(),
        };
        mapped
            .allocate(fixed_len + MIN_GROW_STEP.min(max_bytes - fixed_len))
            .map_err(|e| fail(err("preallocate", e)))?;
        if at != path {
            std::fs::rename(&at, path).map_err(|e| fail(err("replace", e)))?;
        }
        Ok(mapped)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn base(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    /// Writes `bytes` at `offset`, which the caller reserved.
    pub fn write_at(&self, offset: u64, bytes: &[u8]) {
        debug_assert!(offset + bytes.len() as u64 <= self.committed.load(Ordering::Relaxed));
        // SAFETY: the range lies in a region this caller reserved, below `committed`, inside the
        // mapping; no other thread writes it.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.base().add(offset as usize),
                bytes.len(),
            )
        };
    }

    /// The bytes reserved in the bump region so far.
    #[cfg(test)]
    pub(crate) fn written(&self) -> u64 {
        self.bump.load(Ordering::Relaxed) & !CLOSED
    }

    pub fn has_failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    /// Reserves `len` bytes (a multiple of 8) in the bump region. `None` once closed or after a
    /// failure to grow the file; the caller counts what it then drops.
    pub fn reserve(&self, len: u64) -> Option<Region> {
        debug_assert_eq!(len % 8, 0);
        if self.has_failed() {
            return None;
        }
        // SeqCst: the preparer must see this advance if `wake` below skips the unpark
        // (prepare.rs); on x86 it is the same `lock xadd` as a relaxed one.
        let offset = self.bump.fetch_add(len, Ordering::SeqCst);
        if offset & CLOSED != 0 {
            return None;
        }
        let end = offset + len;
        if end + ahead(end) / 2 > self.prepared.load(Ordering::Relaxed) {
            self.signal.wake();
        }
        if end > self.committed.load(Ordering::Acquire) && !self.grow_to(end) {
            return None;
        }
        Some(Region {
            offset,
            len,
            slot: None,
        })
    }

    /// Claims the next ring slot that no live thread is writing. The previous content of the
    /// slot (the oldest chunk) is overwritten by the caller.
    pub fn claim_slot(&self) -> Option<Region> {
        let ring = self.ring.as_ref()?;
        if self.has_failed() || self.bump.load(Ordering::Relaxed) & CLOSED != 0 {
            return None;
        }
        let n = ring.owned.len() as u64;
        // At most one lap: if every slot is owned, there are more writer threads than slots.
        for _ in 0..n {
            // SeqCst: as the bump counter's advance in `reserve`, for the preparer.
            let cursor = ring.cursor.fetch_add(1, Ordering::SeqCst);
            if cursor + ring.ahead / 2 >= ring.prepared.load(Ordering::Relaxed) {
                self.signal.wake();
            }
            let idx = (cursor % n) as usize;
            if ring.owned[idx]
                .compare_exchange(SLOT_FREE, SLOT_OWNED, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return Some(Region {
                    offset: ring.start + idx as u64 * ring.slot_len,
                    len: ring.slot_len,
                    slot: Some(idx),
                });
            }
        }
        None
    }

    pub fn release_slot(&self, region: &Region) {
        if let (Some(ring), Some(idx)) = (&self.ring, region.slot) {
            // Release: the chunk's bytes are written before another thread may claim the slot.
            ring.owned[idx].store(SLOT_FREE, Ordering::Release);
        }
    }

    pub fn is_ring(&self) -> bool {
        self.ring.is_some()
    }

    fn grow_to(&self, end: u64) -> bool {
        let mut step = match self.grow_step.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        let committed = self.committed.load(Ordering::Acquire);
        if end <= committed {
            return true;
        }
        if self.has_failed() {
            return false;
        }
        if end > self.max_bytes {
            let by = match self.cap {
                SizeCap::Config => "RecorderConfig::max_bytes",
                SizeCap::FileSizeLimit => "the process's file size limit, RLIMIT_FSIZE",
                SizeCap::AddressSpace => "the address space the process had left for it",
            };
            self.fail(&format!(
                "the trace reached its size limit of {} bytes ({by})",
                self.max_bytes
            ));
            return false;
        }
        let target = (end.max(committed + *step)).min(self.max_bytes);
        match self.allocate(target) {
            Ok(()) => {
                *step = (*step * 2).min(MAX_GROW_STEP);
                true
            }
            Err(e) => {
                self.fail(&format!("could not grow it to {target} bytes: {e}"));
                false
            }
        }
    }

    pub(crate) fn signal(&self) -> &Signal {
        &self.signal
    }

    /// One round of the preparer (prepare.rs): in ring mode, faults in the [`Ring::ahead`]
    /// slots past the cursor; then allocates the bump region up to [`ahead`] bytes past the
    /// bump counter, never past the size cap, and faults those pages in. Pages a writer already
    /// went past are skipped.
    pub(crate) fn prepare_ahead(&self, populate: &mut Populate, stop: &dyn Fn() -> bool) {
        let page = populate.page;
        let base = self.base();
        if let Some(ring) = &self.ring {
            let n = ring.owned.len() as u64;
            // SeqCst: read after the clear of `pending` in the single total order (prepare.rs).
            let cursor = ring.cursor.load(Ordering::SeqCst);
            let mut next = ring.prepared.load(Ordering::Relaxed).max(cursor);
            while next < cursor + ring.ahead && !stop() {
                // Slots the writers already claimed are theirs: faulting them in now would only
                // make both wait on the same pages.
                next = next.max(ring.cursor.load(Ordering::Relaxed));
                let start = ring.start + (next % n) * ring.slot_len;
                // Whole pages: a neighbour's page faulted in too is harmless (content unchanged).
                let from = start / page * page;
                let to = (start + ring.slot_len).next_multiple_of(page);
                populate.run(base, from, to, stop, || 0, |_| {});
                next += 1;
                // Release: a writer reading it only decides whether to wake us; no data rides
                // on it, but a later value must not be seen before the pages are in.
                ring.prepared.store(next, Ordering::Release);
            }
        }
        // SeqCst: as the cursor above.
        let bump = self.bump.load(Ordering::SeqCst);
        if bump & CLOSED != 0 {
            return;
        }
        let want = (bump + ahead(bump)).min(self.max_bytes);
        let committed = self.allocate_ahead(bump);
        // The page holding the end of the file may be faulted in whole.
        let to = want.min(committed).next_multiple_of(page);
        let from = self
            .prepared
            .load(Ordering::Relaxed)
            .max(bump / page * page);
        // Writers write below the bump counter only: past it, no page is being written.
        let writer = || (self.bump.load(Ordering::Relaxed) & !CLOSED).next_multiple_of(page);
        populate.run(base, from, to, stop, writer, |end| {
            // Release: as for the ring's `prepared`.
            self.prepared.store(end, Ordering::Release)
        });
        if !populate.supported() {
            // Allocation ahead is all there is to do; stop writers from waking us for pages.
            self.prepared.store(to, Ordering::Release);
        }
        if want == self.max_bytes
            && committed >= want
            && self.prepared.load(Ordering::Relaxed) >= to
        {
            // Nothing more can be prepared: the cap is reached.
            self.prepared.store(u64::MAX, Ordering::Release);
        }
    }

    /// Keeps the file allocated at least `2 x ahead(bump)` past `bump`, growing it by the doubling
    /// step (never past the cap) unless it was closed or failed; returns the committed length.
    /// Allocating twice as far as pages are faulted in means that while `posix_fallocate` runs
    /// (it can hold the file's locks for milliseconds), writers still have prepared pages to
    /// fill and never fault into those locks. Errors are left to the writer that later needs
    /// the space, which reports them.
    fn allocate_ahead(&self, bump: u64) -> u64 {
        let committed = self.committed.load(Ordering::Acquire);
        if committed >= (bump + 2 * ahead(bump)).min(self.max_bytes) {
            return committed;
        }
        let mut step = match self.grow_step.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        // Checked under the mutex that `close` takes after setting CLOSED (and the trim after
        // it): either this growth is done before `close` reads the committed length, or
        // CLOSED is seen here; the file never grows after it was trimmed.
        if self.bump.load(Ordering::Relaxed) & CLOSED == 0 && !self.has_failed() {
            let committed = self.committed.load(Ordering::Acquire);
            let target = (bump + 2 * ahead(bump))
                .max(committed + *step)
                .min(self.max_bytes);
            if self.allocate(target).is_ok() {
                *step = (*step * 2).min(MAX_GROW_STEP);
            }
        }
        self.committed.load(Ordering::Acquire)
    }

    /// Preallocates the file up to `len` bytes and publishes the new committed length.
    fn allocate(&self, len: u64) -> std::io::Result<()> {
        let committed = self.committed.load(Ordering::Acquire);
        if len <= committed {
            return Ok(());
        }
        preallocate(&self.file, committed, len)?;
        // Release: threads that see the new length may write below it.
        self.committed.store(len, Ordering::Release);
        Ok(())
    }

    fn fail(&self, why: &str) {
        if !self.failed.swap(true, Ordering::AcqRel) {
            eprintln!(
                "poolsight: recording to {} stopped: {why}; later events are dropped and counted",
                self.path.display()
            );
        }
    }

    /// Stops all further reservations and returns the end of the bump region. A reservation
    /// that failed to grow the file still moved the bump counter, past the committed length; no
    /// byte past that length was written, so the data ends there at most.
    pub fn close(&self) -> u64 {
        let bump = self.bump.fetch_or(CLOSED, Ordering::AcqRel) & !CLOSED;
        self.signal.stop();
        let _guard = self.grow_step.lock();
        bump.min(self.committed.load(Ordering::Acquire))
    }

    /// Flushes the mapping and trims the preallocated tail past `data_end` — unless a reader
    /// maps the file (poolsight_schema::lock): cutting pages from under its mapping would
    /// kill it with SIGBUS. The trim waits a moment for readers to go, then leaves the tail
    /// (zeros past the footer's `data_end`, which readers skip) and says so.
    ///
    /// The mapping then keeps only the file's pages (the rest of its address space is given
    /// back), and the recording lock is given back, whatever happened: the recording is over.
    pub fn sync_and_trim(&self, data_end: u64) -> std::io::Result<()> {
        let done = self.sync_and_trim_locked(data_end);
        lock::unlock_recording(&self.file);
        done
    }

    fn sync_and_trim_locked(&self, data_end: u64) -> std::io::Result<()> {
        let committed = self.committed.load(Ordering::Acquire);
        let flush_len = data_end.min(committed) as usize;
        if flush_len > 0 {
            self.map.flush_range(0, flush_len)?;
        }
        let _guard = self.grow_step.lock();
        if data_end < committed {
            if self.wait_for_readers()? {
                let trimmed = self.file.set_len(data_end);
                lock::end_trim(&self.file);
                trimmed?;
                self.committed.store(data_end, Ordering::Release);
            } else {
                eprintln!(
                    "poolsight: {} is finished, but a reader had it open, so its preallocated \
                     tail ({} bytes of zeros past the data) was left in place",
                    self.path.display(),
                    committed - data_end
                );
            }
        }
        // The recording is over: its mapping keeps only what the file holds.
        self.map
            .give_back_past(self.committed.load(Ordering::Acquire));
        self.file.sync_data()
    }

    /// Takes the trim lock, trying for up to [`TRIM_PATIENCE`]; false if readers still hold
    /// the file then.
    fn wait_for_readers(&self) -> std::io::Result<bool> {
        let start = std::time::Instant::now();
        loop {
            match lock::begin_trim(&self.file)? {
                Taken::Yes => return Ok(true),
                Taken::Busy if start.elapsed() >= TRIM_PATIENCE => return Ok(false),
                Taken::Busy => std::thread::sleep(std::time::Duration::from_millis(5)),
            }
        }
    }
}

/// How long a finishing recorder waits for readers to let go before it leaves the file's tail.
const TRIM_PATIENCE: std::time::Duration = std::time::Duration::from_millis(200);

/// A file made for one recording, locked for it ([`open_new`]).
struct NewFile {
    file: File,
    /// Where it was made: the trace's path, or a name beside it when it is to replace a file
    /// there (renamed over it once the recording has started).
    at: PathBuf,
}

/// Makes a new file for one recording at `path` and takes its recording lock
/// (poolsight_schema::lock), so that no second recording can truncate it under this one's
/// mapping, in this process or another.
///
/// - No file there: it is created (`O_EXCL`: a racing creator gets the case below).
/// - A file being recorded: refused, naming the holder's pid from its header.
/// - Any other file: refused unless `overwrite`; then the new recording is a new file (new
///   inode), made beside it and renamed over it, so that whoever reads the old one (a report,
///   `tail`, an upload) keeps reading it whole.
fn open_new(path: &Path, overwrite: bool) -> Result<NewFile, RecorderError> {
    let io = |what: &'static str| {
        move |e: std::io::Error| RecorderError::Io {
            path: path.to_path_buf(),
            what,
            source: e,
        }
    };
    let busy = || RecorderError::Busy {
        path: path.to_path_buf(),
        pid: holder_pid(path),
    };
    let create = |at: &Path| -> Result<Option<NewFile>, RecorderError> {
        let file = match File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(at)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(None),
            Err(e) => return Err(io("create")(e)),
        };
        let new = NewFile {
            file,
            at: at.to_path_buf(),
        };
        match lock::lock_recording(&new.file) {
            Ok(Taken::Yes) => Ok(Some(new)),
            // Someone opened the file just made and locked it first.
            Ok(Taken::Busy) => Err(busy()),
            Err(e) => {
                let _ = std::fs::remove_file(&new.at);
                Err(io("lock")(e))
            }
        }
    };
    // A file that appears or vanishes between two steps starts the decision again.
    for _ in 0..8 {
        if let Some(new) = create(path)? {
            return Ok(new);
        }
        let old = match File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io("open the existing")(e)),
        };
        if lock::is_being_recorded(&old) {
            return Err(busy());
        }
        if !overwrite {
            return Err(RecorderError::Exists {
                path: path.to_path_buf(),
            });
        }
        if let Some(new) = create(&sibling(path))? {
            return Ok(new);
        }
    }
    Err(busy())
}

/// A new name in `path`'s folder for the file that will replace it.
fn sibling(path: &Path) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .map_or_else(|| "trace".into(), |n| n.to_string_lossy().into_owned());
    path.with_file_name(format!(
        ".{name}.{}.{}.new",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}

/// The pid in the header of the trace at `path`, to name who records it.
fn holder_pid(path: &Path) -> Option<u32> {
    use std::io::Read;
    let mut head = Vec::new();
    File::open(path)
        .ok()?
        .take(1 << 16)
        .read_to_end(&mut head)
        .ok()?;
    lock::header_pid(&head)
}

/// Allocates the file's blocks in `[from, to)`, growing the file to `to`.
#[cfg(target_os = "linux")]
fn preallocate(file: &File, from: u64, to: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: plain syscall on a descriptor we own.
    let rc = unsafe {
        libc::posix_fallocate(
            file.as_raw_fd(),
            from as libc::off_t,
            (to - from) as libc::off_t,
        )
    };
    match rc {
        0 => Ok(()),
        rc => Err(std::io::Error::from_raw_os_error(rc)),
    }
}

/// Allocates the file's blocks in `[from, to)` by writing zeros, where `posix_fallocate` is not
/// available: a sparse hole would turn a full disk into SIGBUS on a later store.
#[cfg(not(target_os = "linux"))]
fn preallocate(file: &File, from: u64, to: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let zeros = [0u8; 64 << 10];
    let mut at = from;
    while at < to {
        let n = (to - at).min(zeros.len() as u64) as usize;
        file.write_all_at(&zeros[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

// SAFETY: the raw mapping is shared by design; every write goes to a region exactly one thread
// reserved, and the fields that coordinate reservations are atomics or behind a mutex.
unsafe impl Send for MappedFile {}
unsafe impl Sync for MappedFile {}
