//! poolsight's memory pool: a caching device-memory pool faithful to CuPy's, over a host or CUDA
//! device, with CuPy's `MemoryHook` callbacks around every step.
//!
//! - [`MemoryPool`] (CuPy's `SingleDeviceMemoryPool`): rounding, best-fit bins, split and
//!   merge, per-stream arenas, limit and out-of-memory retry;
//! - [`device`]: the backends, [`device::HostDevice`] (simulated memory with a capacity) and,
//!   with the `cuda` feature, `device::CudaDevice`;
//! - [`hooks`]: the [`hooks::MemoryHook`] trait, per-thread and process-wide registration,
//!   [`hooks::DebugPrintHook`];
//! - [`TraceHook`]: the hook that writes pool events into a `poolsight-recorder` trace;
//! - [`AddressedPool`]: the pool for callers that hold raw addresses (C, Python, PyTorch),
//!   with the allocation's stack chosen by the caller ([`with_stack`]).
//!
//! The pool knows nothing of the trace format: only [`TraceHook`] records, through the
//! recorder's public API, as any other allocator's observer would; the pool itself only reads
//! the recorder's clock, inside its lock, for the hooks ([`hooks::MallocPost::ticks`]).

mod addressed;
pub mod device;
pub mod hooks;
mod memory_pool;
mod recording;
mod trace_hook;

pub use addressed::{AddressedPool, FreeError};
pub use memory_pool::{
    round_size, Collector, MemoryPool, PoolError, PooledMemory, ALLOCATION_UNIT_SIZE,
};
pub use recording::define_pool_device;
pub use trace_hook::{with_stack, TraceHook};
