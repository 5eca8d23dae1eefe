//! poolsight's exports: traces and their reports rewritten for other tools, over what
//! `poolsight-analyzer` reads and computes; only this crate links Arrow and Parquet.
//!
//! - [`chrome`]: the Chrome/Perfetto trace event JSON, so scopes, pool counters, epochs and
//!   out-of-memory events can be browsed in `ui.perfetto.dev` or `chrome://tracing`.
//! - [`jsonl`]: one JSON object per line (stacks first, then every event), for pandas and
//!   `jq` users who want the raw events rather than a report.
//!
//! Both stream: events are written as the chunks are walked, straight from the mapping, and each
//! chunk's pages are handed back to the kernel once written, so a trace of many GB exports in a
//! few MB of memory (what is kept is per interned stack, not per event). Both are deterministic:
//! chunks are walked in the order they were reserved and nothing comes from hash-map iteration,
//! so the same trace gives the same bytes, and exports can be diffed or kept as golden files.
//!
//! Times are integer nanoseconds since the trace started, taken from [`Trace::ns_since_start`];
//! a scope's start is its close time minus its duration, converted from ticks separately, so a
//! scope opened and closed within its parent stays within it after conversion.
//!
//! - [`dataset`]: the Parquet dataset of many runs and ranks, for SQL engines, the report
//!   tables' columns translated into Arrow arrays there.
//! - [`pack`] (written by `poolsight-reader`, re-exported here): the packed form of a trace (its event chunks encoded as columns and compressed),
//!   which every command reads as it reads the live file.

mod chrome;
pub mod dataset;
mod jsonl;

use std::borrow::Cow;
use std::io::{self, Write};

use poolsight_analyzer::read::names::{scope_category, FrameKind, Phase};
use poolsight_analyzer::read::Defs;
use poolsight_analyzer::read::Trace;

/// Packed traces are written by the reader's crate, which decodes them; found here as before.
pub use poolsight_reader::pack;

pub use chrome::{chrome, CPU_TRACK, EPOCHS_TID, HELD_TRACK, USED_TRACK};
pub use jsonl::jsonl;

/// Why an export stopped.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// Writing the output failed (disk full, closed pipe, ...).
    #[error("writing the export: {0}")]
    Io(#[from] io::Error),
    /// The profile handed in with a trace holds no figures for it.
    #[error("{path}: the profile given with this trace has no source for it")]
    NoSource { path: String },
}

/// What an export wrote, for the CLI's one-line confirmation and for tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExportSummary {
    /// Objects written: entries of `traceEvents` (chrome) or lines (jsonl).
    pub records: u64,
    /// Scope events (closed functions, links and user scopes).
    pub scopes: u64,
    /// Memory events: every one (jsonl), or the out-of-memory instants (chrome).
    pub mem_events: u64,
    /// Mark events (jsonl), or epoch slices (chrome).
    pub marks: u64,
    /// Interned stacks written (jsonl).
    pub stacks: u64,
    /// Counter samples of the pool's used and acquired bytes (chrome).
    pub counters: u64,
}

/// Output buffer: callers hand in any writer (a file, stdout, a `Vec`), and the small writes
/// of one event each must not each become a syscall.
pub(crate) const BUFFER_BYTES: usize = 1 << 16;

/// A scope's (start, end) in ns since the trace started. Each end is converted on its own, and
/// the conversion never decreases, so nesting in ticks is nesting in ns.
pub(crate) fn scope_span(trace: &Trace, end_ticks: u64, duration_ticks: u64) -> (u64, u64) {
    let end = trace.ns_since_start(end_ticks);
    let start = trace.ns_since_start(end_ticks.saturating_sub(duration_ticks));
    (start.min(end), end)
}

/// A JSON string literal. serde_json does the escaping: names come from the traced program and
/// may hold quotes, backslashes, control characters or any Unicode.
pub(crate) fn json_str(w: &mut dyn Write, s: &str) -> io::Result<()> {
    serde_json::to_writer(w, s).map_err(io::Error::from)
}

/// One frame as the exports print it. A damaged trace may name a frame or stack it never
/// defined; those print as `?` and `<undefined ...>` rather than stopping the export.
pub(crate) struct FrameText<'d> {
    pub(crate) kind: FrameKind,
    pub(crate) phase: Phase,
    pub(crate) file: &'d str,
    pub(crate) line: u32,
    pub(crate) name: Cow<'d, str>,
}

impl FrameText<'_> {
    pub(crate) fn category(&self) -> &'static str {
        scope_category(self.kind)
    }
}

pub(crate) fn frame_text(defs: &Defs, frame: u32) -> FrameText<'_> {
    match defs.frames.get(&frame) {
        Some(f) => FrameText {
            kind: f.kind.into(),
            phase: f.phase.into(),
            file: defs.string(f.file),
            line: f.line,
            name: Cow::Borrowed(defs.string(f.name)),
        },
        None => undefined(format!("<undefined frame {frame}>")),
    }
}

/// The innermost frame of a scope's stack: the scope itself.
pub(crate) fn scope_text(defs: &Defs, stack: u32) -> FrameText<'_> {
    match defs.stacks.get(&stack) {
        Some(&(_, frame)) => frame_text(defs, frame),
        None => undefined(format!("<undefined stack {stack}>")),
    }
}

fn undefined(name: String) -> FrameText<'static> {
    FrameText {
        kind: FrameKind::Unknown,
        phase: Phase::None,
        file: "?",
        line: 0,
        name: Cow::Owned(name),
    }
}
