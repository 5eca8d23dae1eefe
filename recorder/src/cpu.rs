//! CPU memory figures for the epoch report (fastai's `cpu used` / `cpu peak` columns).
//!
//! Two sources, as the trace header's `CpuSource` says which one a trace used:
//!
//! - [`CountingAllocator`], installed as the `#[global_allocator]`: the exact bytes of live heap
//!   allocations and their peak, at every instant. This is the Rust counterpart of Python's
//!   `tracemalloc`, which fastai uses for the same columns, and it is exact: no allocation,
//!   however short-lived, escapes the peak.
//! - The resident set size from `/proc/self/statm`, for programs that do not install the
//!   allocator. It sees everything the process touches (allocator caches, stacks, mapped files)
//!   but is only known when read; the peak of an epoch is the highest value read, so reading it
//!   often ([`crate::writer::Handle::start_cpu_sampler`]) matters, exactly as fastai polls its
//!   GPU figures from a thread.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::writer::CpuSource;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// A global allocator that counts the bytes its inner allocator has handed out and not yet
/// taken back, and their peak.
///
/// ```ignore
/// #[global_allocator]
/// static ALLOC: poolsight_recorder::cpu::CountingAllocator =
///     poolsight_recorder::cpu::CountingAllocator::new();
/// ```
///
/// The counters are process-wide statics (there is one global allocator), updated with relaxed
/// atomics: the count is exact because every update is one atomic add or subtract, and the
/// peak is exact because each add returns the value it produced, so every intermediate total is
/// compared against the peak. The cost is one uncontended atomic add per allocation, plus a
/// compare-and-swap when a new peak is reached.
#[derive(Debug, Default, Clone, Copy)]
pub struct CountingAllocator<A = System> {
    inner: A,
}

impl CountingAllocator<System> {
    /// Counts allocations served by the system allocator.
    pub const fn new() -> Self {
        CountingAllocator { inner: System }
    }

    /// Live heap bytes now.
    pub fn current() -> u64 {
        LIVE.load(Ordering::Relaxed) as u64
    }

    /// The highest [`CountingAllocator::current`] since the start or the last
    /// [`CountingAllocator::reset_peak`].
    pub fn peak() -> u64 {
        PEAK.load(Ordering::Relaxed) as u64
    }

    /// Starts a new peak from the live bytes now. The peak is process-wide: epochs reset it at
    /// their start, so code that also resets it shortens the epoch's peak window.
    pub fn reset_peak() {
        PEAK.store(LIVE.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// Whether a `CountingAllocator` is the global allocator (it has served an allocation):
    /// otherwise its figures stay at 0.
    pub fn is_installed() -> bool {
        INSTALLED.load(Ordering::Relaxed)
    }
}

impl<A> CountingAllocator<A> {
    /// Counts allocations served by `inner` (jemalloc, mimalloc, ...).
    pub const fn wrapping(inner: A) -> Self {
        CountingAllocator { inner }
    }
}

#[inline]
fn grew(bytes: usize) {
    let now = LIVE.fetch_add(bytes, Ordering::Relaxed) + bytes;
    // A load first: the peak is rarely beaten, and a plain load is far cheaper than the
    // compare-and-swap loop of fetch_max.
    if now > PEAK.load(Ordering::Relaxed) {
        PEAK.fetch_max(now, Ordering::Relaxed);
    }
    if !INSTALLED.load(Ordering::Relaxed) {
        INSTALLED.store(true, Ordering::Relaxed);
    }
}

#[inline]
fn shrank(bytes: usize) {
    LIVE.fetch_sub(bytes, Ordering::Relaxed);
}

// SAFETY: every method forwards to the inner allocator with the caller's arguments unchanged and
// returns its answer; the counting never touches the memory.
unsafe impl<A: GlobalAlloc> GlobalAlloc for CountingAllocator<A> {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as received.
        let p = unsafe { self.inner.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as received.
        let p = unsafe { self.inner.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as received.
        unsafe { self.inner.dealloc(ptr, layout) };
        shrank(layout.size());
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded as received.
        let p = unsafe { self.inner.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            // The net change only: whether the block moved (both copies alive for a moment) is
            // the inner allocator's business, and tracemalloc counts a realloc the same way.
            if new_size >= layout.size() {
                grew(new_size - layout.size());
            } else {
                shrank(layout.size() - new_size);
            }
        }
        p
    }
}

/// Resident set size in bytes, from `/proc/self/statm`. Where that file cannot be read (not
/// Linux, or /proc not mounted), the process's peak RSS from `getrusage` instead (it never
/// falls, so epoch figures from it show growth only); `None` if neither answers.
pub fn rss_bytes() -> Option<u64> {
    let from_proc = || -> Option<u64> {
        let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
        let resident: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
        Some(resident * page_size())
    };
    from_proc().or_else(peak_rss_bytes)
}

#[cfg(not(unix))]
fn peak_rss_bytes() -> Option<u64> {
    None
}

#[cfg(unix)]
fn peak_rss_bytes() -> Option<u64> {
    // SAFETY: getrusage fills the struct it is given; all-zero is a valid `rusage`.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return None;
    }
    let max = u64::try_from(usage.ru_maxrss).ok()?;
    // Bytes on macOS, KiB elsewhere.
    Some(if cfg!(target_os = "macos") {
        max
    } else {
        max * 1024
    })
}

/// The system's page size (4 KiB where it cannot be read).
pub(crate) fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 {
        n as u64
    } else {
        4096
    }
}

/// CPU bytes in use now, per `source` (0 for [`CpuSource::None`] or when unreadable).
pub fn bytes_now(source: CpuSource) -> u64 {
    match source {
        CpuSource::None => 0,
        CpuSource::Heap => CountingAllocator::current(),
        CpuSource::Rss => rss_bytes().unwrap_or(0),
    }
}
