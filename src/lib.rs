//! poolsight: one crate to depend on. Re-exports the write side ([`recorder`]), the memory pool
//! and its hooks ([`pool`]), the read side ([`analyzer`]) and the format ([`schema`]).
//!
//! Library users who only record or analyze can turn off the default `cli` feature, which only
//! the `poolsight` command needs ([`cli`]: the binary and the Python package run it).

pub use poolsight_import as import;
pub use poolsight_pool as pool;
pub use poolsight_recorder as recorder;
pub use poolsight_schema as schema;

/// The read side, under one name: the analyzer (`poolsight-analyzer`: loading, replay, the
/// report tables, diff, what-if) with the reader (`read`), the pictures (`views`) and the
/// exports (`export`), each its own crate.
pub mod analyzer {
    pub use poolsight_analyzer::*;
    pub use poolsight_export as export;
    pub use poolsight_views as views;
}

mod finish;
pub use finish::{pack_finished, FinishError, FinishPacked, PackedRecording};

// The CLI's modules name the crate as their users do.
extern crate self as poolsight;

#[cfg(feature = "cli")]
pub mod cli;
#[cfg(feature = "cli")]
mod demo;

// The examples of the README and of docs/rust.md, compiled and run as doc tests
// (`cargo test --doc -p poolsight`); python/tests/test_docs.py runs the pages' other examples.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/rust.md")]
pub struct RustGuideDoctests;
