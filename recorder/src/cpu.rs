//! CPU memory figures for the epoch report (fastai's `cpu used` / `cpu peak` columns).
//!
//! The trace header's `CpuSource` says which source a trace used:
//!
//! - [`CountingAllocator`], installed as the `#[global_allocator]`: the exact bytes of live heap
//!   allocations and their peak, at every instant, and per epoch the bytes of the blocks
//!   allocated since it began. This is the Rust counterpart of Python's `tracemalloc`, which
//!   fastai starts at each epoch's begin for the same columns, with its meaning: a block from
//!   before the epoch freed during it does not lower the epoch's figures. It is exact: no
//!   allocation, however short-lived, escapes the peak.
//! - Figures handed in by the caller ([`CpuSource::Tracemalloc`]): the Python package passes
//!   `tracemalloc`'s.
//! - The resident set size from `/proc/self/statm`, for programs that do not install the
//!   allocator. It sees everything the process touches (allocator caches, stacks, mapped files)
//!   but is only known when read; the peak of an epoch is the highest value read, so reading it
//!   often ([`crate::writer::Handle::start_cpu_sampler`]) matters, exactly as fastai polls its
//!   GPU figures from a thread.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};

/// Where per-epoch CPU memory figures come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuSource {
    None,
    /// Exact heap bytes from the counting global allocator; per epoch, with `tracemalloc`'s
    /// meaning (the blocks allocated since the epoch began).
    Heap,
    /// Resident set size.
    Rss,
    /// Given by the caller with each epoch mark, with `tracemalloc`'s meaning (the Python
    /// package's default); the recorder measures nothing itself.
    Tracemalloc,
}

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);
/// The current epoch's number among [`CountingAllocator::begin_epoch`] calls; every block
/// remembers the one it was allocated in.
static GENERATION: AtomicU64 = AtomicU64::new(1);
/// Bytes of the blocks allocated since the epoch began and still live (can dip below 0 for a
/// moment when a free races the begin), and their peak.
static EPOCH_LIVE: AtomicI64 = AtomicI64::new(0);
static EPOCH_PEAK: AtomicU64 = AtomicU64::new(0);

/// A global allocator that counts the bytes its inner allocator has handed out and not yet
/// taken back, and their peak — and, as Python's `tracemalloc` started at an epoch's begin
/// counts them (fastai's `PeakMemMetric` CPU columns), the bytes of the blocks allocated since
/// the epoch began and their peak: a block from before the epoch that is freed during it does
/// not lower them.
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
/// compared against the peak. To know a block's epoch, each block carries 16 bytes in front of
/// it (more for alignments above 16) holding the epoch it was allocated in, as `tracemalloc`
/// keeps a trace per block. The cost is a few uncontended atomic adds per allocation, plus a
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

    /// Starts an epoch: from now on [`CountingAllocator::epoch_current`] counts the bytes of
    /// the blocks allocated from here on, as `tracemalloc.start()` would.
    pub fn begin_epoch() {
        GENERATION.fetch_add(1, Ordering::Relaxed);
        EPOCH_LIVE.store(0, Ordering::Relaxed);
        EPOCH_PEAK.store(0, Ordering::Relaxed);
    }

    /// Bytes of the blocks allocated since [`CountingAllocator::begin_epoch`] and still live:
    /// `tracemalloc.get_traced_memory()[0]`.
    pub fn epoch_current() -> u64 {
        EPOCH_LIVE.load(Ordering::Relaxed).max(0) as u64
    }

    /// The highest [`CountingAllocator::epoch_current`] since the epoch began:
    /// `tracemalloc.get_traced_memory()[1]`.
    pub fn epoch_peak() -> u64 {
        EPOCH_PEAK.load(Ordering::Relaxed)
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

/// Bytes in front of a block: its epoch, in the 8 bytes right before the block.
const HEADER: usize = 16;

/// The header's length for `layout` (the block's alignment, if larger) and the layout asked of
/// the inner allocator; `None` when the sum overflows.
#[inline]
fn framed(layout: Layout) -> Option<(usize, Layout)> {
    let head = HEADER.max(layout.align());
    let size = layout.size().checked_add(head)?;
    let outer = Layout::from_size_align(size, layout.align().max(8)).ok()?;
    Some((head, outer))
}

/// Writes the current epoch in front of the block at `user`.
///
/// # Safety
/// `user` is 8-aligned and the 8 bytes before it belong to the block.
#[inline]
unsafe fn stamp(user: *mut u8) -> u64 {
    let generation = GENERATION.load(Ordering::Relaxed);
    // SAFETY: as the caller promises.
    unsafe { (user.sub(8) as *mut u64).write(generation) };
    generation
}

/// The epoch a block was allocated in.
///
/// # Safety
/// `user` is a block this allocator returned.
#[inline]
unsafe fn stamp_of(user: *mut u8) -> u64 {
    // SAFETY: every block carries its header.
    unsafe { (user.sub(8) as *const u64).read() }
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

/// A change of the bytes of this epoch's blocks.
#[inline]
fn epoch_changed(delta: i64) {
    let now = EPOCH_LIVE.fetch_add(delta, Ordering::Relaxed) + delta;
    if now > 0 && now as u64 > EPOCH_PEAK.load(Ordering::Relaxed) {
        EPOCH_PEAK.fetch_max(now as u64, Ordering::Relaxed);
    }
}

impl<A: GlobalAlloc> CountingAllocator<A> {
    /// Hands out a block from `base` (the inner allocator's), stamped with this epoch.
    #[inline]
    unsafe fn issue(base: *mut u8, head: usize, size: usize) -> *mut u8 {
        if base.is_null() {
            return base;
        }
        // SAFETY: `base` has `head + size` bytes; `head` >= 16 keeps the user block aligned as
        // asked and leaves the 8 bytes before it in the block.
        let user = unsafe { base.add(head) };
        unsafe { stamp(user) };
        grew(size);
        epoch_changed(size as i64);
        user
    }
}

// SAFETY: every method asks the inner allocator for the caller's block plus a header in front,
// aligned as the caller asked, and hands out the part after the header; the header is only
// ever written and read by this allocator. Layouts given back are the ones the block was
// allocated with, header included.
unsafe impl<A: GlobalAlloc> GlobalAlloc for CountingAllocator<A> {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let Some((head, outer)) = framed(layout) else {
            return std::ptr::null_mut();
        };
        // SAFETY: `outer` has a non-zero size.
        unsafe { Self::issue(self.inner.alloc(outer), head, layout.size()) }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let Some((head, outer)) = framed(layout) else {
            return std::ptr::null_mut();
        };
        // SAFETY: as in `alloc`.
        unsafe { Self::issue(self.inner.alloc_zeroed(outer), head, layout.size()) }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // The layout was framed when the block was allocated, so it frames again.
        let Some((head, outer)) = framed(layout) else {
            return;
        };
        // SAFETY: `ptr` came from `alloc` with this layout: its header is `head` bytes before.
        let generation = unsafe { stamp_of(ptr) };
        unsafe { self.inner.dealloc(ptr.sub(head), outer) };
        shrank(layout.size());
        if generation == GENERATION.load(Ordering::Relaxed) {
            epoch_changed(-(layout.size() as i64));
        }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let Some((head, outer)) = framed(layout) else {
            return std::ptr::null_mut();
        };
        let Some(new_outer) = new_size.checked_add(head) else {
            return std::ptr::null_mut();
        };
        // SAFETY: `ptr` came from `alloc` with this layout; the header moves with the block.
        let generation = unsafe { stamp_of(ptr) };
        let base = unsafe { self.inner.realloc(ptr.sub(head), outer, new_outer) };
        if base.is_null() {
            return base;
        }
        // SAFETY: the new block has `head + new_size` bytes.
        let user = unsafe { base.add(head) };
        // The net change only: whether the block moved (both copies alive for a moment) is
        // the inner allocator's business, and tracemalloc counts a realloc the same way.
        if new_size >= layout.size() {
            grew(new_size - layout.size());
        } else {
            shrank(layout.size() - new_size);
        }
        if generation == GENERATION.load(Ordering::Relaxed) {
            epoch_changed(new_size as i64 - layout.size() as i64);
        } else {
            // tracemalloc counts a block from before the epoch, reallocated in it, as a new
            // block of the new size.
            // SAFETY: the header is the block's own.
            unsafe { stamp(user) };
            epoch_changed(new_size as i64);
        }
        user
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

/// CPU bytes in use now, per `source` (0 for [`CpuSource::None`], for figures the caller
/// hands in, or when unreadable).
pub fn bytes_now(source: CpuSource) -> u64 {
    match source {
        CpuSource::None | CpuSource::Tracemalloc => 0,
        CpuSource::Heap => CountingAllocator::current(),
        CpuSource::Rss => rss_bytes().unwrap_or(0),
    }
}
