//! Pure models of GPU caching allocators: given the requests of a run (sizes, streams, frees
//! in time order), what would the allocator have reserved from the device, where would each
//! block have been placed, and which request would have failed on a device of a given size.
//!
//! No device and no recorder: a model is a state machine over byte counts and addresses, so
//! the same code serves a replay of a recorded run under other settings (`poolsight whatif`)
//! and a check of the model against the real allocator's recorded decisions.
//!
//! - [`pytorch`]: PyTorch's CUDA caching allocator (`c10/cuda/CUDACachingAllocator.cpp`), its
//!   settings as `PYTORCH_CUDA_ALLOC_CONF` spells them, a replay of requests through it and
//!   the check against recorded segments.
//!
//! CuPy's pool policy lives with the pool itself (`poolsight-pool`), which serves real memory.

pub mod pytorch;
