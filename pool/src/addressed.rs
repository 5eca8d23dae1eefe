//! The pool for callers that hold raw addresses: a C program, Python, or PyTorch's pluggable
//! allocator, which call `malloc(size) -> ptr` and `free(ptr)` and never see a
//! [`PooledMemory`]. Live allocations are kept here, by address, until freed.
//!
//! Allocation stacks: a foreign caller knows its calling context better than the pool does (a
//! Python traceback, the scopes of its thread), so [`AddressedPool::malloc`] takes the stack to
//! record, which the [`TraceHook`](crate::TraceHook) writes instead of the Rust call site.

use std::sync::Mutex;

use rustc_hash::FxHashMap;

use crate::trace_hook::with_stack;
use crate::{MemoryPool, PoolError, PooledMemory};

/// Why a free was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FreeError {
    /// The address is not a live allocation of this pool (never allocated, or freed twice).
    #[error("0x{0:x} is not an allocation of this pool (freed twice, or from another allocator)")]
    Unknown(u64),
}

/// A [`MemoryPool`] addressed by pointers.
pub struct AddressedPool {
    pool: MemoryPool,
    live: Mutex<FxHashMap<u64, PooledMemory>>,
}

impl AddressedPool {
    pub fn new(pool: MemoryPool) -> Self {
        AddressedPool {
            pool,
            live: Mutex::new(FxHashMap::default()),
        }
    }

    /// The pool underneath, for its figures (`used_bytes`, ...) and `free_all_blocks`.
    pub fn pool(&self) -> &MemoryPool {
        &self.pool
    }

    /// Allocates `size` bytes on `stream`; the trace records `stack` as the allocation's
    /// calling context (0: the open scopes of this thread). A 0-byte request returns 0 and
    /// holds nothing, as `malloc(0)` may.
    pub fn malloc(&self, size: u64, stream: u32, stack: u32) -> Result<u64, PoolError> {
        let mem = with_stack(stack, || self.pool.malloc_on(size, stream))?;
        let ptr = mem.ptr();
        if ptr != 0 {
            self.lock().insert(ptr, mem);
        }
        Ok(ptr)
    }

    /// Returns `ptr` to the pool. Freeing 0 does nothing, as `free(NULL)`.
    pub fn free(&self, ptr: u64) -> Result<(), FreeError> {
        if ptr == 0 {
            return Ok(());
        }
        let mem = self.lock().remove(&ptr).ok_or(FreeError::Unknown(ptr))?;
        // Dropped outside the lock: the free hooks run with nothing held.
        drop(mem);
        Ok(())
    }

    /// Number of allocations handed out and not yet freed.
    pub fn live_allocations(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FxHashMap<u64, PooledMemory>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for AddressedPool {
    fn drop(&mut self) {
        // Allocations still live go back to the pool, firing their free hooks, so a trace of a
        // program that never freed still balances.
        let live = std::mem::take(&mut *self.lock());
        drop(live);
    }
}
