//! poolsight's C ABI: record scopes, epochs and pool events from C, C++ or any language with a
//! C FFI, into the same trace files the Rust recorder writes. The header is
//! `capi/include/poolsight.h` (generated from this crate by cbindgen; a test fails when it is
//! stale, `POOLSIGHT_BLESS=1` rewrites it).
//!
//! - [`session`]: the binding-neutral core, also used by the Python package;
//! - [`ffi`]: the `extern "C"` functions over it;
//! - [`constants`]: the header's `PS_SCOPE_*` and `PS_PHASE_*`, from the schema's kinds.
//!
//! Conventions: functions that make an object return NULL on failure; others return 0 (or a
//! value) on success and -1 (or 0) on failure; `ps_last_error()` says why, per thread. No call
//! panics or aborts the process on bad input.

pub mod constants;
pub mod ffi;
pub mod session;

pub use session::{Session, SessionError, SessionPool};
