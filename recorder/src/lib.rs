//! poolsight's write side: everything that runs inside the training process.
//!
//! - [`writer`]: the memory-mapped trace writer ([`Recorder`], per-thread chunks, interning);
//! - [`clock`]: the tick clock and its calibration;
//! - [`kinds`]: what is recorded ([`MemKind`], [`MarkKind`], [`FrameKind`], [`Phase`]), the
//!   schema's own enums, re-exported;
//! - [`scope`]: function/link/user scopes, as RAII guards for Rust and as tokens for foreign
//!   callers, and the interning of foreign call stacks;
//! - [`epoch`], [`cpu`]: epochs and CPU memory figures.
//!
//! The caching memory pool and its hooks live in `poolsight-pool`, which records through this
//! crate's public API like any other allocator's observer. The recorder never depends on the
//! analyzer: both only share the format in `poolsight-schema`.

pub mod clock;
pub mod cpu;
pub mod epoch;
mod error;
pub mod scope;
pub mod writer;

pub use cpu::CountingAllocator;
pub use epoch::CpuSampler;
pub use error::{RecorderError, ScopeError};
pub use poolsight_schema::kinds::{
    self, DeviceKind, FrameKind, MarkKind, MemKind, Phase, ScopeKind,
};
pub use scope::{ForeignFrame, ScopeGuard, ScopeToken};
pub use writer::{
    ClockSource, CpuSource, DeviceInfo, Frame, Handle, ImportInfo, MemRecord, Mode, Prediction,
    Recorder, RecorderConfig, Summary,
};
