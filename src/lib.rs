//! poolsight: one crate to depend on. Re-exports the write side ([`recorder`]), the read side
//! ([`analyzer`]) and the format ([`schema`]).
pub mod demo;

pub use poolsight_analyzer as analyzer;
pub use poolsight_recorder as recorder;
pub use poolsight_schema as schema;
