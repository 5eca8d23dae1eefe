//! poolsight's read side, grouped by what each part is:
//!
//! - [`read`]: reading a file — the verified reader over memory-mapped traces (the file is
//!   untrusted input), packed traces;
//! - [`replay`]: turning one or more traces into a [`Profile`], in parallel, in one pass;
//! - [`load`]: the files of one job made into profiles — other tools' files converted through
//!   a resolver the caller provides, the traces opened in order with their stacks shown as
//!   `--frames` asks, replayed, merged or per rank; what every front end calls;
//! - [`tables`]: the seed tables (Chainer's `functions` and `timers`, CuPy's `lines`, fastai's
//!   `epochs`) and the `report` of them all, each a pure function of a [`Profile`], with its
//!   table, JSON and CSV renderings kept apart from the computation; the one list of report
//!   tables lives there; and `info`, what a file holds;
//! - [`views`]: the pictures — flamegraphs, the timeline, the interactive HTML report;
//! - [`diff`]: two runs' figures compared, and the rules a CI gate checks;
//! - [`whatif`]: a run replayed through a model of an allocator (PyTorch's caching allocator
//!   under other settings, CuPy's pool): what it would reserve, and where it runs out;
//! - [`export`]: traces rewritten for other tools (Chrome/Perfetto, JSON Lines), the Parquet
//!   dataset of many runs, and packed traces.
//!
//! The architecture and the path of one report from the file to the terminal are in
//! `docs/architecture.md`.

pub mod diff;
pub mod export;
pub mod load;
pub mod read;
pub mod replay;
pub mod tables;
pub mod units;
pub mod views;
pub mod whatif;

pub use read::{ChunkInfo, ChunkKind, ReadError, Trace, Warning};
pub use replay::{replay, Profile, ReplayOptions};
