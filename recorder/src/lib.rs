//! poolsight's write side: everything that runs inside the training process.
//!
//! - [`writer`]: the memory-mapped trace writer ([`Recorder`], per-thread chunks, interning);
//! - [`clock`]: the tick clock and its calibration;
//! - [`pool`], [`device`], [`hooks`]: a CuPy-style caching memory pool over a host or CUDA
//!   device, with CuPy's `MemoryHook` callbacks; [`trace_hook`] writes them to the trace;
//! - [`scope`], [`epoch`], [`cpu`]: Chainer-style function/link scopes, epochs, CPU memory.
//!
//! The recorder never depends on the analyzer: both only share the format in `poolsight-schema`.

pub mod clock;
pub mod cpu;
pub mod device;
pub mod epoch;
pub mod hooks;
pub mod pool;
pub mod scope;
pub mod trace_hook;
pub mod writer;

pub use cpu::CountingAllocator;
pub use epoch::CpuSampler;
pub use scope::{current_stack, Phase, ScopeGuard};
pub use trace_hook::TraceHook;

pub use poolsight_schema::fb;
pub use writer::{
    CpuSource, DeviceInfo, Frame, Handle, MemRecord, Mode, Recorder, RecorderConfig, Summary,
};

use std::path::PathBuf;

/// Why the recorder could not start (or finish). Failures while recording never surface here:
/// they stop recording, count dropped events and are reported once on stderr and in the file.
#[derive(Debug, thiserror::Error)]
pub enum RecorderError {
    #[error("cannot {what} trace file {}: {source}", path.display())]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid recorder configuration: {0}")]
    Config(String),
}
