//! poolsight's analysis: a job's trace files loaded, replayed into a [`Profile`], and the
//! answers computed from it — the report tables as text, CSV and JSON, two runs compared, a
//! run replayed through a model of an allocator. It reads files through `poolsight-reader`
//! (re-exported as [`read`]) and draws and exports nothing: the pictures are `poolsight-views`',
//! the exports (Chrome/Perfetto, JSON Lines, Parquet) `poolsight-export`'s, so what only wants
//! the figures links no Arrow, Parquet or flamegraph code. Its modules, bottom first:
//!
//! - [`units`]: the seeds' number formats; [`read`]: the reader, where it has always been found;
//! - [`replay`]: turning one or more traces into a [`Profile`], in parallel;
//! - [`load`]: the files of one job made into profiles — other tools' files converted through
//!   a resolver the caller provides, the traces opened in order with their stacks shown as
//!   `--frames` asks, replayed, merged or per rank; what every front end calls;
//! - [`whatif`]: a run replayed through a model of an allocator (PyTorch's caching allocator
//!   under other settings, CuPy's pool): what it would reserve, and where it runs out;
//! - [`tables`]: the seed tables (Chainer's `functions` and `timers`, CuPy's `lines`, fastai's
//!   `epochs`) and the `report` of them all, each a pure function of a [`Profile`], with its
//!   table, JSON and CSV renderings kept apart from the computation, and its rows as plain
//!   columns for the exports and the HTML report to translate; the one list of report tables
//!   lives there; and `info`, what a file holds;
//! - [`diff`]: two runs' figures compared, and the rules a CI gate checks; [`predict`]: what a
//!   `fake_cuda` trace says a step would do on the GPU.
//!
//! The architecture and the path of one report from the file to the terminal are in
//! `docs/architecture.md`.

pub mod diff;
pub mod load;
pub mod predict;
pub mod replay;
pub mod tables;
pub mod units;
pub mod whatif;

/// The reader (crate `poolsight-reader`), where it has always been found.
pub use poolsight_reader as read;

pub use read::{ChunkInfo, ChunkKind, ReadError, Trace, Warning};
pub use replay::{replay, Profile, ReplayOptions};
