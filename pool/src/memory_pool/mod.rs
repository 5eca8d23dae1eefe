//! A caching device-memory pool, faithful to CuPy's `SingleDeviceMemoryPool`.
//!
//! Why a pool: device allocation is slow and synchronises the device, and a training step
//! allocates the same sizes again and again. Like CuPy's, this pool
//!
//! - rounds every request up to a multiple of [`ALLOCATION_UNIT_SIZE`] (512 bytes);
//! - keeps freed memory cached, per stream (arena), and serves a request from the smallest
//!   cached chunk that fits (best fit), splitting off and caching the rest;
//! - merges a freed chunk with free neighbours of the same device allocation;
//! - on a miss, asks the device; when the device is full or the pool's limit would be crossed,
//!   releases its cached whole allocations ([`MemoryPool::free_all_blocks`]) and tries again,
//!   then runs the collector stand-in ([`MemoryPool::set_collector`]), releases again and tries
//!   a third time, before failing with [`PoolError::OutOfMemory`] (CuPy's `_try_malloc`);
//! - calls the [`crate::hooks`] around every step, in CuPy's order, which is what the recorder
//!   and the profilers observe.
//!
//! The policy (rounding, bins, best fit, split and merge, arenas) is CuPy's model in
//! `poolsight-alloc-models` (`cupy::State`), the same code `poolsight whatif --allocator cupy`
//! replays a run through; this module adds the device, the limit, the hooks and the lock.
//!
//! Rust-specific choices: memory is handed out as an RAII [`PooledMemory`] that returns itself
//! to the pool on drop; `malloc` is `#[track_caller]` so hooks learn the call site for free.

use std::panic::Location;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::device::{Device, DeviceError};
use crate::hooks::{
    self, AllocPost, AllocPre, FreeInfo, HookSnapshot, LimitSet, MallocPost, MallocPre, MemoryHook,
    OutOfMemory, Release,
};
use crate::trace_hook::TraceHook;
pub use poolsight_alloc_models::cupy::{round_size, ALLOCATION_UNIT_SIZE};
use poolsight_alloc_models::cupy::{State, NONE};
use poolsight_recorder::writer::now_ticks;

/// Why the pool could not serve a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    /// Neither the cache, nor the device after releasing the cache, nor the limit allowed the
    /// request. The figures are the ones a user needs to size a limit or a batch.
    #[error(
        "out of memory allocating {} ({requested} bytes) on device {device_id}: \
         the pool holds {total} bytes, {}",
        human_bytes(*.requested),
        limit_text(*.limit)
    )]
    OutOfMemory {
        /// Device of the pool.
        device_id: u32,
        /// Rounded bytes asked for.
        requested: u64,
        /// Bytes the pool held from the device when it gave up.
        total: u64,
        /// The pool's limit; 0 means none.
        limit: u64,
    },
    /// The device failed for another reason than lack of memory.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// A copy would have gone outside the allocation.
    #[error("copy of {len} bytes at offset {offset} is out of bounds of a {size}-byte allocation")]
    OutOfBounds {
        /// Offset of the copy in the allocation.
        offset: u64,
        /// Bytes to copy.
        len: u64,
        /// Size of the allocation (as requested, not rounded).
        size: u64,
    },
}

fn limit_text(limit: u64) -> String {
    if limit == 0 {
        "no limit".to_owned()
    } else {
        format!("limit {limit}")
    }
}

/// `1.50 MiB`-style size for messages.
fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.2} {}", UNITS[u])
}

struct Inner {
    device: Arc<dyn Device>,
    device_id: u32,
    state: Mutex<State>,
    /// Bytes handed out (rounded). Atomics so the statistics can be read without the lock;
    /// written only under the lock.
    used: AtomicU64,
    /// Bytes held from the device. Reserved before a device allocation, like CuPy's
    /// `_try_block_total_bytes`, so concurrent misses cannot overshoot the limit together.
    total: AtomicU64,
    limit: AtomicU64,
    /// Written only under the lock, like `used`.
    next_pmem_id: AtomicU64,
    /// Runs before the third device try, where CuPy runs `gc.collect()`.
    collector: Mutex<Option<Collector>>,
    /// The trace this pool's own events go to ([`MemoryPool::record_to`]), whatever hooks are
    /// registered.
    own: OnceLock<TraceHook>,
}

/// The hooks one pool operation calls: the registered ones (the thread's, then the global
/// ones), then the pool's own [`TraceHook`].
struct Hooks<'a> {
    registered: Option<HookSnapshot>,
    own: Option<&'a TraceHook>,
}

impl<'a> Hooks<'a> {
    /// `None` (nothing to build, nothing to call) when there are no hooks at all.
    #[inline]
    fn of(own: &'a OnceLock<TraceHook>) -> Option<Hooks<'a>> {
        let (registered, own) = (hooks::current(), own.get());
        (registered.is_some() || own.is_some()).then_some(Hooks { registered, own })
    }

    #[inline]
    fn wants_pre(&self) -> bool {
        self.registered.as_ref().is_some_and(|r| r.wants_pre())
            || self.own.is_some_and(|t| t.wants_pre())
    }

    /// Calls `f` on each hook. Inlined, the pool's own hook is a `TraceHook` the compiler
    /// knows, so its call is a direct one.
    #[inline]
    fn for_each(&self, mut f: impl FnMut(&dyn MemoryHook)) {
        if let Some(r) = &self.registered {
            r.for_each(&mut f);
        }
        if let Some(t) = self.own {
            f(t);
        }
    }
}

/// A callback that frees memory the program holds on to, run by the pool before its last
/// try when the device is out of memory (see [`MemoryPool::set_collector`]).
pub type Collector = Arc<dyn Fn() + Send + Sync>;

impl Inner {
    #[inline]
    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while the lock is held (hooks and the device run outside it); if it
        // ever happens, the state is still consistent between operations, so keep going.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reserves `size` bytes of the limit; false when they do not fit (now, or ever: a size
    /// past the limit itself).
    fn try_reserve(&self, size: u64) -> bool {
        let limit = match self.limit.load(Ordering::Relaxed) {
            0 => u64::MAX,
            l => l,
        };
        if size > limit {
            return false;
        }
        let mut cur = self.total.load(Ordering::Relaxed);
        loop {
            if cur > limit - size {
                return false;
            }
            match self.total.compare_exchange_weak(
                cur,
                cur + size,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
    }

    fn device_alloc(
        &self,
        mem_size: u64,
        stream: u32,
        caller: &'static Location<'static>,
        hooks: Option<&Hooks<'_>>,
    ) -> Result<u64, DeviceError> {
        let Some(h) = hooks else {
            return self.device.alloc(mem_size);
        };
        let pre = AllocPre {
            device_id: self.device_id,
            mem_size,
            stream,
            caller,
        };
        if h.wants_pre() {
            h.for_each(|k| k.alloc_preprocess(&pre));
        }
        let r = self.device.alloc(mem_size);
        let post = AllocPost {
            device_id: self.device_id,
            mem_size,
            mem_ptr: *r.as_ref().unwrap_or(&0),
            stream,
            caller,
        };
        h.for_each(|k| k.alloc_postprocess(&post));
        r
    }

    fn out_of_memory(&self, requested: u64, stream: u32, hooks: Option<&Hooks<'_>>) -> PoolError {
        let total = self.total.load(Ordering::Relaxed);
        let limit = self.limit.load(Ordering::Relaxed);
        if let Some(h) = hooks {
            let ev = OutOfMemory {
                device_id: self.device_id,
                requested,
                total,
                limit,
                stream,
            };
            h.for_each(|k| k.out_of_memory(&ev));
        }
        PoolError::OutOfMemory {
            device_id: self.device_id,
            requested,
            total,
            limit,
        }
    }

    /// Gets `mem_size` new bytes from the device, as CuPy's `SingleDeviceMemoryPool._try_malloc`
    /// (cupy/cuda/memory.pyx): reserve against the limit, else release the cache and reserve
    /// again, else run the collector and release the cache and reserve a third time; then
    /// allocate from the device in the same three tries, each one with its own
    /// `alloc_pre`/`alloc_post` (pointer 0 when it fails); then give up.
    ///
    /// CuPy's third try follows `gc.collect()`, which frees arrays only a cycle kept alive.
    /// Rust frees every value when its owner drops, so nothing waits for a collector: the
    /// stand-in is the pool's [`MemoryPool::set_collector`] callback, for caches the program
    /// keeps itself (none by default, when the third try sees exactly the second's state).
    fn try_malloc(
        &self,
        mem_size: u64,
        stream: u32,
        caller: &'static Location<'static>,
        hooks: Option<&Hooks<'_>>,
    ) -> Result<u64, PoolError> {
        let mut reserved = false;
        for attempt in 0..3 {
            if attempt > 0 {
                self.reclaim(attempt);
            }
            // A request larger than the limit itself still goes through the three tries, as
            // CuPy's `_try_block_total_bytes` does not tell the two cases apart.
            if self.try_reserve(mem_size) {
                reserved = true;
                break;
            }
        }
        if !reserved {
            return Err(self.out_of_memory(mem_size, stream, hooks));
        }
        for attempt in 0..3 {
            if attempt > 0 {
                self.reclaim(attempt);
            }
            match self.device_alloc(mem_size, stream, caller, hooks) {
                Ok(ptr) => return Ok(ptr),
                Err(DeviceError::OutOfMemory { .. }) => {}
                Err(e) => {
                    self.total.fetch_sub(mem_size, Ordering::Relaxed);
                    return Err(PoolError::Device(e));
                }
            }
        }
        self.total.fetch_sub(mem_size, Ordering::Relaxed);
        Err(self.out_of_memory(mem_size, stream, hooks))
    }

    /// What CuPy does before its second (`free_all_blocks`) and third (`gc.collect()`, then
    /// `free_all_blocks`) try.
    fn reclaim(&self, attempt: u32) {
        if attempt >= 2 {
            let collector = self
                .collector
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            if let Some(c) = collector {
                c();
            }
        }
        self.free_all_blocks(None);
    }

    /// Everything between the malloc hooks; builds the handle before the post hooks run so
    /// that a panicking hook cannot leak the chunk. With hooks, also the clock read inside the
    /// lock as the block was handed out ([`MallocPost::ticks`]; 0 without hooks).
    fn malloc_rounded(
        self: &Arc<Self>,
        size: u64,
        mem_size: u64,
        stream: u32,
        caller: &'static Location<'static>,
        hooks: Option<&Hooks<'_>>,
    ) -> Result<(PooledMemory, u64), PoolError> {
        let told = hooks.is_some();
        if mem_size == 0 {
            // CuPy hands out a null `Memory(0)` without touching the pool or the device.
            let st = self.lock();
            let (pmem_id, ticks) = (self.next_pmem_id(&st), stamp(told, &st));
            drop(st);
            return Ok((self.handle(NONE, 0, size, 0, stream, pmem_id), ticks));
        }
        let arena = {
            let mut st = self.lock();
            let arena = st.arena_index(stream);
            if let Some((idx, ptr)) = st.take_best_fit(arena, mem_size) {
                self.add_used(&st, mem_size);
                let (pmem_id, ticks) = (self.next_pmem_id(&st), stamp(told, &st));
                drop(st);
                return Ok((
                    self.handle(idx, ptr, size, mem_size, stream, pmem_id),
                    ticks,
                ));
            }
            arena
        };
        let ptr = self.try_malloc(mem_size, stream, caller, hooks)?;
        let mut st = self.lock();
        let idx = st.add_allocation(ptr, mem_size, arena);
        self.add_used(&st, mem_size);
        let (pmem_id, ticks) = (self.next_pmem_id(&st), stamp(told, &st));
        drop(st);
        Ok((
            self.handle(idx, ptr, size, mem_size, stream, pmem_id),
            ticks,
        ))
    }

    /// Adds `delta` (two's complement for a decrease) to the used bytes. Only ever called with
    /// the lock held (the guard proves it), so a plain load and store suffice: cheaper than an
    /// atomic read-modify-write, and still readable without the lock.
    #[inline]
    fn add_used(&self, _locked: &State, delta: u64) {
        let v = self.used.load(Ordering::Relaxed).wrapping_add(delta);
        self.used.store(v, Ordering::Relaxed);
    }

    /// Next `pmem_id`; like [`Inner::add_used`], under the lock.
    #[inline]
    fn next_pmem_id(&self, _locked: &State) -> u64 {
        let id = self.next_pmem_id.load(Ordering::Relaxed);
        self.next_pmem_id.store(id + 1, Ordering::Relaxed);
        id
    }

    #[inline]
    fn handle(
        self: &Arc<Self>,
        chunk: u32,
        ptr: u64,
        size: u64,
        mem_size: u64,
        stream: u32,
        pmem_id: u64,
    ) -> PooledMemory {
        PooledMemory {
            pool: Arc::clone(self),
            chunk,
            ptr,
            size,
            mem_size,
            pmem_id,
            stream,
        }
    }

    fn malloc(
        self: &Arc<Self>,
        size: u64,
        stream: u32,
        caller: &'static Location<'static>,
    ) -> Result<PooledMemory, PoolError> {
        let hooks = Hooks::of(&self.own);
        let Some(h) = hooks.as_ref() else {
            // Fast path: no event is built at all.
            return match round_size(size) {
                Some(mem_size) => self
                    .malloc_rounded(size, mem_size, stream, caller, None)
                    .map(|(m, _)| m),
                None => Err(self.out_of_memory(u64::MAX, stream, None)),
            };
        };
        let rounded = round_size(size);
        let mem_size = rounded.unwrap_or(u64::MAX);
        if h.wants_pre() {
            let pre = MallocPre {
                device_id: self.device_id,
                size,
                mem_size,
                stream,
                caller,
            };
            h.for_each(|k| k.malloc_preprocess(&pre));
        }
        let r = match rounded {
            Some(m) => self.malloc_rounded(size, m, stream, caller, Some(h)),
            None => Err(self.out_of_memory(u64::MAX, stream, Some(h))),
        };
        let (mem_ptr, pmem_id, ticks) = match &r {
            Ok((m, ticks)) => (m.ptr, m.pmem_id, *ticks),
            Err(_) => (0, 0, 0),
        };
        let post = MallocPost {
            device_id: self.device_id,
            size,
            mem_size,
            mem_ptr,
            pmem_id,
            stream,
            caller,
            ticks,
        };
        h.for_each(|k| k.malloc_postprocess(&post));
        r.map(|(m, _)| m)
    }

    fn free(&self, m: &PooledMemory) {
        if m.ptr == 0 {
            // 0-byte memory never came from the pool (CuPy fires no free hooks for it either).
            return;
        }
        let hooks = Hooks::of(&self.own);
        let info = FreeInfo {
            device_id: self.device_id,
            mem_size: m.mem_size,
            mem_ptr: m.ptr,
            pmem_id: m.pmem_id,
            stream: m.stream,
            ticks: 0,
        };
        if let Some(h) = hooks.as_ref().filter(|h| h.wants_pre()) {
            h.for_each(|k| k.free_preprocess(&info));
        }
        let ticks = {
            let mut st = self.lock();
            st.give_back(m.chunk);
            self.add_used(&st, m.mem_size.wrapping_neg());
            stamp(hooks.is_some(), &st)
        };
        if let Some(h) = &hooks {
            h.for_each(|k| k.free_postprocess(&FreeInfo { ticks, ..info }));
        }
    }

    fn free_all_blocks(&self, stream: Option<u32>) -> u64 {
        let mut released = Vec::new();
        let mut per_arena = Vec::new();
        self.lock()
            .drain_unsplit(stream, &mut released, &mut per_arena);
        let mut bytes = 0;
        // Outside the lock: returning memory to a real device can synchronise it.
        for (ptr, size) in released {
            // SAFETY: (ptr, size) is a whole allocation obtained from this device, just removed
            // from the pool, so nobody can use or free it again.
            unsafe { self.device.free(ptr, size) };
            bytes += size;
        }
        self.total.fetch_sub(bytes, Ordering::Relaxed);
        if !per_arena.is_empty() {
            if let Some(h) = Hooks::of(&self.own) {
                for (stream, bytes) in per_arena {
                    let ev = Release {
                        device_id: self.device_id,
                        bytes,
                        stream,
                    };
                    h.for_each(|k| k.release(&ev));
                }
            }
        }
        bytes
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // No `PooledMemory` is alive (each holds a reference), so every chunk is free and every
        // allocation can go back to the device.
        let st = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        for (ptr, size) in st.allocations() {
            // SAFETY: whole allocations from this device, no longer reachable.
            unsafe { self.device.free(ptr, size) };
        }
    }
}

/// A caching memory pool for one device, CuPy's `SingleDeviceMemoryPool`.
///
/// Cloning is cheap and gives another handle to the same pool, so it can be shared between
/// threads and stored next to the tensors that use it; wrapping it in an `Arc` works as well.
#[derive(Clone)]
pub struct MemoryPool {
    inner: Arc<Inner>,
}

impl MemoryPool {
    /// A pool over `device`, empty, with no limit.
    pub fn new(device: Arc<dyn Device>) -> Self {
        let device_id = device.id();
        MemoryPool {
            inner: Arc::new(Inner {
                device,
                device_id,
                state: Mutex::new(State::default()),
                used: AtomicU64::new(0),
                total: AtomicU64::new(0),
                limit: AtomicU64::new(0),
                next_pmem_id: AtomicU64::new(1),
                collector: Mutex::new(None),
                own: OnceLock::new(),
            }),
        }
    }

    /// The device the pool draws from, for copies and reports.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.inner.device
    }

    /// The device's id, as hooks report it.
    pub fn device_id(&self) -> u32 {
        self.inner.device_id
    }

    /// Allocates at least `size` bytes on stream 0; see [`MemoryPool::malloc_on`].
    #[track_caller]
    #[inline]
    pub fn malloc(&self, size: u64) -> Result<PooledMemory, PoolError> {
        self.inner.malloc(size, 0, Location::caller())
    }

    /// Allocates at least `size` bytes (rounded up to 512) for use on `stream`.
    ///
    /// Memory freed on a stream is only reused for that stream, so a kernel still running on
    /// one stream cannot see its memory handed to another. A 0-byte request returns a null
    /// allocation without touching the pool (the malloc hooks still fire, as in CuPy). The
    /// caller's location is passed to hooks, which is how the line profile knows the call site.
    #[track_caller]
    #[inline]
    pub fn malloc_on(&self, size: u64, stream: u32) -> Result<PooledMemory, PoolError> {
        self.inner.malloc(size, stream, Location::caller())
    }

    /// Returns cached memory to the device: the free chunks that are whole device allocations,
    /// of one stream's arena or of all (`None`). Split chunks stay until all their parts are
    /// free and merged, as in CuPy. Returns the bytes released; fires
    /// [`crate::hooks::MemoryHook::release`] per arena that released something.
    pub fn free_all_blocks(&self, stream: Option<u32>) -> u64 {
        self.inner.free_all_blocks(stream)
    }

    /// Number of cached free chunks, all arenas together.
    pub fn n_free_blocks(&self) -> usize {
        self.inner.lock().n_free_blocks()
    }

    /// Bytes handed out and not yet freed (rounded sizes).
    pub fn used_bytes(&self) -> u64 {
        self.inner.used.load(Ordering::Relaxed)
    }

    /// Bytes the pool holds from the device: used plus cached.
    pub fn total_bytes(&self) -> u64 {
        self.inner.total.load(Ordering::Relaxed)
    }

    /// Bytes held from the device but not handed out (the cache).
    pub fn free_bytes(&self) -> u64 {
        self.total_bytes().saturating_sub(self.used_bytes())
    }

    /// Records this pool's events with `hook`, after any registered hooks, for as long as the
    /// pool lives: a pool bound to one trace, whichever thread allocates and whatever hooks
    /// other code registers (a recording's pools in a process that records several traces).
    /// Once per pool: a second call gives the hook back.
    pub fn record_to(&self, hook: TraceHook) -> Result<(), TraceHook> {
        self.inner.own.set(hook)
    }

    /// Caps the bytes the pool may hold from the device (0 removes the cap), like CuPy's
    /// `set_limit(size=...)`. Memory already held above a new, lower limit is not released;
    /// new device allocations must fit under it.
    pub fn set_limit(&self, bytes: u64) {
        self.inner.limit.store(bytes, Ordering::Relaxed);
        if let Some(h) = Hooks::of(&self.inner.own) {
            let ev = LimitSet {
                device_id: self.inner.device_id,
                limit: bytes,
            };
            h.for_each(|k| k.limit_set(&ev));
        }
    }

    /// Sets what runs where CuPy's pool calls `gc.collect()`: before the third try of a
    /// device allocation (or of a reservation under the limit), after the second failed.
    /// Rust drops values deterministically, so there is no garbage to collect; a program that
    /// keeps caches of its own (activations kept for reuse, a dataloader's prefetch) can drop
    /// them here. `None` removes it. The callback must not allocate from this pool.
    pub fn set_collector(&self, collector: Option<Collector>) {
        *self
            .inner
            .collector
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = collector;
    }

    /// The current limit; 0 means none.
    pub fn get_limit(&self) -> u64 {
        self.inner.limit.load(Ordering::Relaxed)
    }
}

impl std::fmt::Debug for MemoryPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryPool")
            .field("device", &self.inner.device.name())
            .field("used_bytes", &self.used_bytes())
            .field("total_bytes", &self.total_bytes())
            .field("limit", &self.get_limit())
            .finish()
    }
}

/// Memory handed out by a [`MemoryPool`]; goes back to the pool (not the device) when dropped,
/// firing the free hooks.
///
/// It keeps the pool alive, so it may outlive every `MemoryPool` handle.
pub struct PooledMemory {
    pool: Arc<Inner>,
    chunk: u32,
    ptr: u64,
    size: u64,
    mem_size: u64,
    pmem_id: u64,
    stream: u32,
}

impl PooledMemory {
    /// Device address (0 for a 0-byte allocation).
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Bytes requested.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Bytes reserved for it in the pool (the request rounded up to 512).
    pub fn mem_size(&self) -> u64 {
        self.mem_size
    }

    /// Id unique within the pool, as in the hooks' `pmem_id` (never 0).
    pub fn pmem_id(&self) -> u64 {
        self.pmem_id
    }

    /// Device the memory is on.
    pub fn device_id(&self) -> u32 {
        self.pool.device_id
    }

    /// Stream (arena) the memory belongs to.
    pub fn stream(&self) -> u32 {
        self.stream
    }

    fn check(&self, offset: u64, len: usize) -> Result<u64, PoolError> {
        let len = len as u64;
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(self.ptr + offset),
            _ => Err(PoolError::OutOfBounds {
                offset,
                len,
                size: self.size,
            }),
        }
    }

    /// Copies `src` to the start of this memory; fails if `src` is longer than [`Self::size`].
    pub fn copy_from_host(&self, src: &[u8]) -> Result<(), PoolError> {
        self.copy_from_host_at(0, src)
    }

    /// Copies `src` to `offset` bytes into this memory, within [`Self::size`].
    pub fn copy_from_host_at(&self, offset: u64, src: &[u8]) -> Result<(), PoolError> {
        let dst = self.check(offset, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        Ok(self.pool.device.copy_from_host(dst, src)?)
    }

    /// Fills `dst` from the start of this memory; fails if `dst` is longer than [`Self::size`].
    pub fn copy_to_host(&self, dst: &mut [u8]) -> Result<(), PoolError> {
        self.copy_to_host_at(0, dst)
    }

    /// Fills `dst` from `offset` bytes into this memory, within [`Self::size`].
    pub fn copy_to_host_at(&self, offset: u64, dst: &mut [u8]) -> Result<(), PoolError> {
        let src = self.check(offset, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        Ok(self.pool.device.copy_to_host(src, dst)?)
    }
}

impl Drop for PooledMemory {
    fn drop(&mut self) {
        self.pool.free(self);
    }
}

impl std::fmt::Debug for PooledMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PooledMemory")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("size", &self.size)
            .field("mem_size", &self.mem_size)
            .field("pmem_id", &self.pmem_id)
            .field("device_id", &self.pool.device_id)
            .field("stream", &self.stream)
            .finish()
    }
}

/// The clock for [`MallocPost::ticks`] and [`FreeInfo::ticks`], read with the lock held (the
/// guard proves it) when hooks will be told; 0 when none will.
#[inline]
fn stamp(hooks: bool, _locked: &State) -> u64 {
    if hooks {
        now_ticks()
    } else {
        0
    }
}
