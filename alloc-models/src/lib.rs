//! Pure models of GPU caching allocators: given the requests of a run (sizes, streams, frees
//! in time order), what would the allocator have reserved from the device, where would each
//! block have been placed, and which request would have failed on a device of a given size.
//!
//! No device and no recorder: a model is a state machine over byte counts and addresses, so
//! the same code serves a replay of a recorded run under other settings (`poolsight whatif`),
//! a check of the model against the real allocator's recorded decisions, and, for CuPy's
//! pool, the bookkeeping of the pool that serves real memory (`poolsight-pool`).
//!
//! - [`pytorch`]: PyTorch's CUDA caching allocator (`c10/cuda/CUDACachingAllocator.cpp`), its
//!   settings as `PYTORCH_CUDA_ALLOC_CONF` spells them, and the check against recorded
//!   segments;
//! - [`cupy`]: CuPy's memory pool (`cupy/cuda/memory.pyx`): 512-byte rounding, best-fit bins,
//!   split and merge of chunks, one arena per stream;
//! - [`replay`]: a run's requests replayed through either ([`replay::Model`]).

pub mod cupy;
pub mod pytorch;
pub mod replay;
