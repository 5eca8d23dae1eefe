//! The hook that writes the trace: every pool callback becomes one fixed-size memory event.
//!
//! What goes into each event's fields is fixed by `MemKind` in schema/trace.fbs; this file is
//! the one place that maps the pool's hook arguments onto it. Allocations carry the stack of the
//! scopes open on the calling thread plus the call site ([`Handle::site_stack`]), which is what
//! the line and function reports are built from.

use std::cell::Cell;
use std::sync::Arc;

use poolsight_recorder::{Handle, MemKind, MemRecord};

use crate::hooks::{
    self, AllocPost, AllocPre, FreeInfo, GlobalHookGuard, HookGuard, LimitSet, MallocPost,
    MallocPre, MemoryHook, OutOfMemory, Release,
};

thread_local! {
    /// The stack a foreign caller chose for the allocation it is making on this thread (see
    /// [`with_stack`]); `None`: the Rust call site.
    static STACK_OVERRIDE: Cell<Option<u32>> = const { Cell::new(None) };
}

/// Runs `f` (an allocation) with `stack` recorded as its calling context instead of the Rust
/// call site: the way for a caller that knows its context better (a Python traceback, a C
/// program's own frames) to name it; 0 names the open scopes of the calling thread (no Rust
/// call site). Nests; restores the previous choice when `f` returns.
pub fn with_stack<R>(stack: u32, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<u32>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let previous = self.0;
            let _ = STACK_OVERRIDE.try_with(|s| s.set(previous));
        }
    }
    let _restore = Restore(STACK_OVERRIDE.with(|s| s.replace(Some(stack))));
    f()
}

/// Writes the pool's hook events into a recorder's trace.
///
/// By default only the post events are written: they carry everything the reports need (the
/// pre events repeat the request without the answer), so leaving them out halves the trace.
/// [`TraceHook::with_pre_events`] keeps them, for a replay that must match CuPy's callback
/// sequence one to one.
pub struct TraceHook {
    handle: Handle,
    pre_events: bool,
}

impl TraceHook {
    /// A hook writing to `handle`'s recorder. Pools whose device the trace should describe
    /// (name, capacity, rounding unit) are announced with [`define_pool_device`], or use
    /// [`TraceHook::for_pool`].
    pub fn new(handle: Handle) -> Self {
        TraceHook {
            handle,
            pre_events: false,
        }
    }

    /// Also write `MallocPre`, `AllocPre` and `FreePre` events.
    pub fn with_pre_events(mut self, on: bool) -> Self {
        self.pre_events = on;
        self
    }

    /// The recorder this hook writes to.
    pub fn handle(&self) -> &Handle {
        &self.handle
    }

    /// Registers the hook for the calling thread until the guard drops (CuPy's `with hook:`).
    pub fn install(self) -> HookGuard {
        hooks::register(Arc::new(self))
    }

    /// Registers the hook for every thread of the process until the guard drops, for programs
    /// that allocate from worker threads.
    pub fn install_global(self) -> GlobalHookGuard {
        hooks::register_global(Arc::new(self))
    }
}

impl std::fmt::Debug for TraceHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceHook")
            .field("path", &self.handle.path())
            .field("pre_events", &self.pre_events)
            .finish()
    }
}

/// The format keeps the low 32 bits of a pmem id: enough to pair a free with its malloc among
/// the allocations alive at once.
#[inline]
fn low32(pmem_id: u64) -> u32 {
    pmem_id as u32
}

impl TraceHook {
    /// The allocation's stack: a foreign caller's choice ([`with_stack`]; 0 asks for the open
    /// scopes of this thread), else the open scopes plus the Rust call site.
    #[inline]
    fn stack(&self, caller: &'static std::panic::Location<'static>) -> u32 {
        match STACK_OVERRIDE.with(Cell::get) {
            Some(0) => self.handle.current_stack(),
            Some(stack) => stack,
            None => self.handle.site_stack(caller),
        }
    }
}

impl MemoryHook for TraceHook {
    fn name(&self) -> &str {
        "TraceHook"
    }

    fn wants_pre(&self) -> bool {
        self.pre_events
    }

    #[inline]
    fn malloc_preprocess(&self, i: &MallocPre) {
        if self.pre_events {
            self.handle.record_mem(MemRecord {
                bytes: i.size,
                stack: self.stack(i.caller),
                ..MemRecord::new(MemKind::MallocPre, i.device_id, i.stream)
            });
        }
    }

    #[inline]
    fn malloc_postprocess(&self, i: &MallocPost) {
        self.record_at(
            MemRecord {
                ptr: i.mem_ptr,
                bytes: i.size,
                stack: self.stack(i.caller),
                pmem: low32(i.pmem_id),
                ..MemRecord::new(MemKind::MallocPost, i.device_id, i.stream)
            },
            i.ticks,
        );
    }

    #[inline]
    fn alloc_preprocess(&self, i: &AllocPre) {
        if self.pre_events {
            self.handle.record_mem(MemRecord {
                bytes: i.mem_size,
                stack: self.stack(i.caller),
                ..MemRecord::new(MemKind::AllocPre, i.device_id, i.stream)
            });
        }
    }

    #[inline]
    fn alloc_postprocess(&self, i: &AllocPost) {
        self.handle.record_mem(MemRecord {
            ptr: i.mem_ptr,
            bytes: i.mem_size,
            stack: self.stack(i.caller),
            ..MemRecord::new(MemKind::AllocPost, i.device_id, i.stream)
        });
    }

    #[inline]
    fn free_preprocess(&self, i: &FreeInfo) {
        if self.pre_events {
            self.handle.record_mem(free_event(MemKind::FreePre, i));
        }
    }

    #[inline]
    fn free_postprocess(&self, i: &FreeInfo) {
        self.record_at(free_event(MemKind::FreePost, i), i.ticks);
    }

    fn release(&self, i: &Release) {
        self.handle.record_mem(MemRecord {
            bytes: i.bytes,
            ..MemRecord::new(MemKind::Release, i.device_id, i.stream)
        });
    }

    fn out_of_memory(&self, i: &OutOfMemory) {
        self.handle.record_mem(MemRecord {
            ptr: i.total,
            bytes: i.requested,
            ..MemRecord::new(MemKind::OutOfMemory, i.device_id, i.stream)
        });
    }

    fn limit_set(&self, i: &LimitSet) {
        self.handle.record_mem(MemRecord {
            bytes: i.limit,
            ..MemRecord::new(MemKind::LimitSet, i.device_id, 0)
        });
    }
}

impl TraceHook {
    /// At the pool's own time for the event when it gave one (read inside its lock), else now.
    #[inline(always)]
    fn record_at(&self, r: MemRecord, ticks: u64) {
        if ticks != 0 {
            self.handle.record_mem_at(r, ticks);
        } else {
            self.handle.record_mem(r);
        }
    }
}

#[inline]
fn free_event(kind: MemKind, i: &FreeInfo) -> MemRecord {
    MemRecord {
        ptr: i.mem_ptr,
        bytes: i.mem_size,
        pmem: low32(i.pmem_id),
        ..MemRecord::new(kind, i.device_id, i.stream)
    }
}
