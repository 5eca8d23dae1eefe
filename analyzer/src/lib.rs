//! poolsight's read side: a verified reader over memory-mapped traces, the replay that turns
//! one or more traces into a [`Profile`], and the reports computed from it. Each report is a
//! pure function from a [`Profile`] to a result type; rendering (table, JSON, CSV) is kept
//! apart from the computation.

pub mod csv;
pub mod dataset;
pub mod diff;
pub mod epochs;
pub mod export;
pub mod flamegraph;
pub mod functions;
pub mod html;
pub mod incomplete;
pub mod info;
pub mod lines;
pub mod load;
pub mod names;
pub mod pack;
pub mod packed;
pub mod reader;
pub mod render;
pub mod replay;
pub mod report;
pub mod timeline;
pub mod timers;

pub use reader::{ChunkInfo, ChunkKind, ReadError, Trace, Warning};
pub use replay::{replay, Profile, ReplayOptions};
