//! The preparer: a background thread that keeps the file ready ahead of its writers, so that a
//! writer never pays for the kernel's work on a fresh page.
//!
//! A store to a page of a shared file mapping that was never touched faults: the kernel finds
//! or allocates the page-cache page, zeroes it and lets the filesystem mark it dirty. That is a
//! few hundred nanoseconds per 4 KiB page, 15–30 ns per event at 32 bytes per event, and in
//! grow mode every event chunk is made of fresh pages. Growing the file (`posix_fallocate`) is
//! a syscall too. So one thread per recorder does both ahead of time, off the recording threads:
//!
//! - the bump region: it allocates the file up to twice [`ahead`] bytes past the bump counter
//!   (never past the size cap, `max_bytes` or `RLIMIT_FSIZE`) and faults the first [`ahead`]
//!   bytes of it in for writing (`MADV_POPULATE_WRITE`: the kernel does exactly what a write
//!   fault does, content unchanged). How far ahead grows with what was written: [`MIN_AHEAD`]
//!   at first, a quarter of the file's size after that (rounded up to a power of two: between
//!   a quarter and a half of what was written), [`AHEAD`] at most. A recording that writes a
//!   few hundred kilobytes (a short run, a test) so never makes the kernel zero 16 MiB of pages
//!   it will not use (about 8 ms of a core at the start of every recording, and the page cache
//!   they take until the trim at finish), and past its first 2 MiB what is faulted in beyond
//!   the end of a recording, work for nothing, is at most half of what it wrote (when the
//!   distance was as far as the file held, a 2.3 MB trace of `torch_overhead.py` had 6.25 MiB
//!   faulted in; now 2.2 MB has 2.8 MiB), while a fast writer still doubles the distance with
//!   every doubling of the file;
//! - in ring mode, the next slots after the ring cursor, [`AHEAD`] bytes of them: faulted in on
//!   the first lap, and made writable again on later laps after writeback cleaned them.
//!
//! Nothing changes for the file's content or for crash safety: prepared pages hold zeros, which
//! is what a reader takes for reserved-but-unwritten space, exactly like the preallocated tail
//! that was already there. Writers still grow the file themselves when they get ahead of the
//! preparer (a thread that could not start, a starved core): preparation only moves work.
//! Faulting a page in costs the preparer about what the writer's 128 events on that page cost,
//! so at the hot path's full rate (about 2 GB/s) it keeps up only with a core of its own; real
//! runs record far slower.
//!
//! # Waking the preparer, without a lock or a syscall per event
//!
//! The preparer sleeps in `thread::park`. A writer that reserves a chunk (once per chunk, never
//! per event) compares the end of its reservation with how far the preparer got (one relaxed
//! load) and, only once it is within half of [`AHEAD`] of it, calls [`Signal::wake`]: so the
//! preparer is woken about once per 8 MiB written, and a writer never waits for it.
//!
//! The wake must not be lost: a writer that advances the bump counter and sees `pending`
//! already set skips the unpark, relying on the preparer to see its advance. The preparer clears
//! `pending` and then reads the counters; the writer advances a counter and then sets `pending`.
//! All four are `SeqCst`, so they fall in one total order: if the writer's swap read `true`
//! that was not yet cleared, the preparer's clear comes after that swap, hence after the
//! writer's advance (which precedes its swap in program order), and the preparer's next read
//! of the counter, after its clear, sees the advance. If the swap read `false`, the writer
//! unparks, and `unpark` before `park` makes the next `park` return at once. On x86 the
//! counters' `SeqCst` read-modify-writes are the same `lock xadd` as `Relaxed` ones.
//!
//! # Stopping
//!
//! [`Signal::stop`] (from `close`, at finish or drop) sets `stop` and unparks; nothing waits for
//! the thread. It holds its own `Arc` of the mapped file, so the mapping outlives whatever it is
//! doing; it never grows the file after `close` (the check is under the mutex that `close` and
//! the trim take), and a page it faults in past a trimmed end is refused by the kernel
//! (`EFAULT`), never written. The thread does not keep the process alive.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::Thread;

use super::file::MappedFile;

/// How far ahead of the writers the file is kept allocated and faulted in. At the hot path's
/// fastest, about 2 GB/s, 16 MiB is 8 ms of recording: enough to ride out the preparer being
/// descheduled, small next to the page cache a trace fills anyway.
pub(crate) const AHEAD: u64 = 16 << 20;

/// How far ahead a file that holds little yet is prepared: 256 pages, about half a millisecond
/// of the kernel's work.
pub(crate) const MIN_AHEAD: u64 = 1 << 20;

/// How far past `bump` (the bytes written so far) the bump region is prepared: a quarter of
/// it rounded up to a power of two, between [`MIN_AHEAD`] and [`AHEAD`].
pub(crate) fn ahead(bump: u64) -> u64 {
    bump.checked_next_power_of_two()
        .map_or(AHEAD, |p| p / 4)
        .clamp(MIN_AHEAD, AHEAD)
}

/// Pages are faulted in by pieces of this size, so that progress is published often, a stop is
/// noticed quickly, and a writer that overtook the preparer is noticed before the two fault the
/// same pages (a writer then sleeps on each page the preparer holds, and both crawl).
const STEP: u64 = 256 << 10;

/// How writers reach the preparer.
pub(crate) struct Signal {
    /// A wake is pending: set by writers, cleared by the preparer before it looks at the
    /// counters (see the module documentation for why both sides are `SeqCst`).
    pending: AtomicBool,
    stop: AtomicBool,
    /// Set by the thread once it runs; see [`spawn`].
    started: AtomicBool,
    thread: OnceLock<Thread>,
}

impl Signal {
    pub fn new() -> Signal {
        Signal {
            pending: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            started: AtomicBool::new(false),
            thread: OnceLock::new(),
        }
    }

    /// Asks the preparer to look at the counters again. Called after a reservation advanced a
    /// counter with a `SeqCst` read-modify-write.
    #[cold]
    pub fn wake(&self) {
        if !self.pending.swap(true, Ordering::SeqCst) {
            if let Some(t) = self.thread.get() {
                t.unpark();
            }
        }
    }

    /// Tells the preparer to exit; returns at once.
    pub fn stop(&self) {
        // Release: pairs with the preparer's acquire load, so it exits on seeing the flag.
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }
}

/// Starts the preparer of `file`. When the thread cannot be started, writers do all the work
/// themselves, as they would if it fell behind.
///
/// Returns once the thread runs: starting a thread frees memory on the new thread (its boxed
/// closure), and with the counting allocator (`CpuSource::Heap`) a free that lands inside the
/// first epoch would show in its figures. Past that, the thread allocates nothing while the
/// recorder lives.
pub(crate) fn spawn(file: &Arc<MappedFile>) {
    let for_thread = Arc::clone(file);
    let spawned = std::thread::Builder::new()
        .name("poolsight-prepare".into())
        .spawn(move || run(&for_thread));
    let Ok(handle) = spawned else { return };
    // A wake before this finds no thread to unpark; it leaves `pending` set, and the thread
    // looks at the counters when it starts anyway.
    let _ = file.signal().thread.set(handle.thread().clone());
    drop(handle);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    // Acquire: pairs with the thread's release store once its start-up is done.
    while !file.signal().started.load(Ordering::Acquire) && std::time::Instant::now() < deadline {
        std::thread::yield_now();
    }
}

fn run(file: &MappedFile) {
    file.signal().started.store(true, Ordering::Release);
    let mut populate = Populate::new();
    loop {
        // SeqCst: the clear must precede, in the single total order, the counter reads in
        // `prepare_ahead` (module documentation).
        file.signal().pending.store(false, Ordering::SeqCst);
        if file.signal().stopped() {
            return;
        }
        file.prepare_ahead(&mut populate, &|| file.signal().stopped());
        std::thread::park();
    }
}

/// Faults pages of the mapping in for writing.
pub(crate) struct Populate {
    /// False once the kernel said it does not know `MADV_POPULATE_WRITE` (before Linux 5.14);
    /// then only allocation is done ahead.
    supported: bool,
    pub page: u64,
}

impl Populate {
    fn new() -> Populate {
        Populate {
            supported: cfg!(target_os = "linux"),
            page: crate::cpu::page_size(),
        }
    }

    pub fn supported(&self) -> bool {
        self.supported
    }

    /// Faults in the pages of `[from, to)` (page-aligned offsets) in pieces of [`STEP`],
    /// calling `done(end)` after each piece, and skipping, before each piece, to `writer()`
    /// (a page-aligned offset the writers have not reached) when they went past. Stops early
    /// when `stop()` says so or the kernel refuses (a range past a trimmed end).
    pub fn run(
        &mut self,
        base: *mut u8,
        from: u64,
        to: u64,
        stop: &dyn Fn() -> bool,
        writer: impl Fn() -> u64,
        mut done: impl FnMut(u64),
    ) {
        let mut at = from;
        while self.supported && !stop() {
            at = at.max(writer());
            if at >= to {
                return;
            }
            let end = (at + STEP).min(to);
            if !self.populate(base, at, end) {
                return;
            }
            done(end);
            at = end;
        }
    }

    #[cfg(target_os = "linux")]
    fn populate(&mut self, base: *mut u8, from: u64, to: u64) -> bool {
        // SAFETY: the range lies inside the mapping (below the file's committed length, which is
        // below the mapping's length) and is page-aligned; MADV_POPULATE_WRITE only faults the
        // pages in, it never changes their content, so it is harmless even on pages a writer
        // owns.
        let rc = unsafe {
            libc::madvise(
                base.add(from as usize) as *mut libc::c_void,
                (to - from) as usize,
                libc::MADV_POPULATE_WRITE,
            )
        };
        if rc == 0 {
            return true;
        }
        if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
            self.supported = false;
        }
        false
    }

    #[cfg(not(target_os = "linux"))]
    fn populate(&mut self, _base: *mut u8, _from: u64, _to: u64) -> bool {
        self.supported = false;
        false
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use crate::{Recorder, RecorderConfig};

    fn path(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("poolsight-prepare-{name}-{}", std::process::id()))
    }

    fn len(p: &std::path::Path) -> u64 {
        std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
    }

    /// Waits (up to a generous limit, for a loaded machine) until `ok` holds.
    fn eventually(ok: impl Fn() -> bool) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if ok() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        ok()
    }

    /// The bytes of `p`'s pages held in the page cache (faulted in, or written).
    fn resident(p: &std::path::Path) -> u64 {
        let file = std::fs::File::open(p).expect("open");
        let bytes = len(p) as usize;
        // SAFETY: a read-only mapping of a file we opened, only passed to mincore and unmapped
        // here; nothing reads through it.
        unsafe {
            use std::os::fd::AsRawFd;
            let at = libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            );
            assert_ne!(at, libc::MAP_FAILED);
            let page = crate::cpu::page_size() as usize;
            let mut vec = vec![0u8; bytes.div_ceil(page)];
            assert_eq!(libc::mincore(at, bytes, vec.as_mut_ptr()), 0);
            libc::munmap(at, bytes);
            (vec.iter().filter(|&&v| v & 1 != 0).count() * page) as u64
        }
    }

    #[test]
    fn how_far_ahead_grows_with_the_file() {
        use super::{ahead, AHEAD, MIN_AHEAD};
        assert_eq!(ahead(0), MIN_AHEAD);
        assert_eq!(ahead(300 << 10), MIN_AHEAD);
        assert_eq!(ahead((3 << 20) + 1), MIN_AHEAD);
        assert_eq!(ahead((12 << 20) + 1), 4 << 20);
        assert_eq!(ahead(AHEAD), AHEAD / 4);
        assert_eq!(ahead(4 * AHEAD), AHEAD);
        assert_eq!(ahead(u64::MAX / 2 + 7), AHEAD);
    }

    #[test]
    fn the_file_is_allocated_ahead_of_the_writers() {
        let p = path("ahead");
        let rec = Recorder::create(&p, RecorderConfig::default()).expect("create");
        assert!(
            eventually(|| len(&p) >= 2 * super::MIN_AHEAD),
            "the file was not grown ahead: {} bytes",
            len(&p)
        );
        // A recording that has written little has little faulted in ahead of it: the kernel
        // may hold whole large folios of what was allocated, but not the 32 MiB (2 x AHEAD)
        // that every start allocated and held before.
        std::thread::sleep(Duration::from_millis(50));
        let early = resident(&p);
        assert!(
            early < super::AHEAD,
            "{early} bytes faulted in before anything was written ({} reserved)",
            rec.handle().shared.file.written()
        );
        // One that writes much is allocated further past what it wrote: twice a quarter of it
        // (rounded up to a power of two), here AHEAD.
        let handle = rec.handle();
        let record = crate::MemRecord::new(crate::MemKind::AllocPost, 0, 0);
        let mut n = 0;
        while handle.shared.file.written() < 2 * super::AHEAD && n < 10_000_000 {
            handle.record_mem(record);
            n += 1;
        }
        let written = handle.shared.file.written();
        assert!(
            eventually(|| len(&p) >= written + super::AHEAD),
            "the file was not grown ahead: {} bytes, {written} written",
            len(&p)
        );
        let summary = rec.finish().expect("finish");
        assert_eq!(len(&p), summary.file_bytes, "trimmed at finish");
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(len(&p), summary.file_bytes, "never grown after finish");
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn preparing_stops_at_the_size_cap() {
        let p = path("cap");
        let cap = 6 << 20;
        let config = RecorderConfig {
            max_bytes: cap,
            ..RecorderConfig::default()
        };
        let rec = Recorder::create(&p, config).expect("create");
        // Written to past half the cap: the preparer wants more than the cap leaves.
        let handle = rec.handle();
        let record = crate::MemRecord::new(crate::MemKind::AllocPost, 0, 0);
        while handle.shared.file.written() < cap / 2 {
            handle.record_mem(record);
        }
        assert!(eventually(|| len(&p) == cap), "{} bytes", len(&p));
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(len(&p), cap, "never past max_bytes");
        let summary = rec.finish().expect("finish");
        assert!(summary.file_bytes < cap);
        assert_eq!(len(&p), summary.file_bytes);
        let _ = std::fs::remove_file(&p);
    }
}
