//! CuPy's memory pool (`cupy/cuda/memory.pyx`, `SingleDeviceMemoryPool`): every request
//! rounded up to 512 bytes, freed memory cached per stream (an arena per stream) and served by
//! best fit, the rest of a chunk split off and cached, freed chunks merged with free
//! neighbours, whole free allocations returned to the device by `free_all_blocks`, and a
//! failed device allocation retried after `free_all_blocks` (twice) before running out of
//! memory.
//!
//! [`State`] is the policy's bookkeeping, shared by the pool that serves real memory
//! (`poolsight-pool`'s `MemoryPool`, which adds the device, the hooks and the lock) and by
//! [`Pool`], the model a recorded run is replayed through ([`crate::replay`]).

mod arena;
mod model;

pub use arena::{Chunk, State, NONE};
pub use model::{Block, Pool};

/// The rounding unit of every request, CuPy's `ALLOCATION_UNIT_SIZE`. Also keeps every chunk
/// aligned as well as a fresh device allocation.
pub const ALLOCATION_UNIT_SIZE: u64 = 512;

/// `size` rounded up to a multiple of [`ALLOCATION_UNIT_SIZE`] (0 stays 0), as the pool
/// accounts it; `None` if that does not fit in a `u64`.
#[inline]
pub fn round_size(size: u64) -> Option<u64> {
    Some(size.checked_add(ALLOCATION_UNIT_SIZE - 1)? / ALLOCATION_UNIT_SIZE * ALLOCATION_UNIT_SIZE)
}
