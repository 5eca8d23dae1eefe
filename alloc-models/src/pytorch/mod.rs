//! PyTorch's CUDA caching allocator, rule by rule, as of the PyTorch source named in
//! `docs/whatif.md`. [`Settings`] are the allocator's options; [`Allocator`] is the device
//! allocator (`DeviceCachingAllocator`) of one device; [`replay`] runs a run's requests
//! through it; [`check`] compares its decisions with the ones a snapshot recorded. The
//! allocator's code is in three files: `allocator.rs` (blocks: best fit, split, merge, the
//! malloc path), `segments.rs` (device memory: new segments, releases, garbage collection)
//! and `expandable.rs` (expandable segments).

mod allocator;
pub mod check;
mod expandable;
pub mod replay;
mod segments;
mod settings;
mod view;

pub use crate::replay::{Oom, Stats};
pub use allocator::{get_allocation_size, round_size, Allocator, Handle, SegmentEvent, SegmentOp};
pub use settings::{Settings, SettingsError};
pub use view::{BlockView, SegmentView};

/// Every size is rounded to at least 512 bytes (`kMinBlockSize`).
pub const MIN_BLOCK: u64 = 512;
/// The largest request of the small pool (`kSmallSize`, 1 MiB).
pub const SMALL_SIZE: u64 = 1 << 20;
/// Small requests are packed into 2 MiB segments (`kSmallBuffer`); also the page of an
/// expandable segment of the small pool.
pub const SMALL_BUFFER: u64 = 2 << 20;
/// Requests between 1 and 10 MiB share 20 MiB segments (`kLargeBuffer`); also the page of an
/// expandable segment of the large pool and the default `max_non_split_rounding`.
pub const LARGE_BUFFER: u64 = 20 << 20;
/// Below this, a large request gets a `LARGE_BUFFER` segment (`kMinLargeAlloc`, 10 MiB).
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// Larger segments are rounded to 2 MiB (`kRoundLarge`).
pub const ROUND_LARGE: u64 = 2 << 20;
