//! poolsight's read side: a verified reader over memory-mapped traces and the reports computed
//! from them. Reports are pure functions from a [`Trace`] to a result type; rendering (table,
//! JSON, CSV) is kept apart from the computation.

pub mod info;
pub mod reader;

pub use reader::{ChunkInfo, ChunkKind, ReadError, Trace, Warning};
