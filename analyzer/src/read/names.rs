//! The stable names of event kinds, frame kinds and phases: the strings `info`, the exports and
//! every JSON output use as keys and values. They are part of the JSON contract: scripts and CI
//! jobs match on them, so a name here changes only with a new major version.
//!
//! `info`'s `events` object counts events by these keys:
//!
//! - memory events by their kind: [`mem_kind_name`] (`malloc_pre`, `malloc_post`, ...);
//! - scope events (one per closed scope) split by the kind of the scope's innermost frame:
//!   `function`, `link`, `scope`, and `scope_other` for any other frame kind or a stack the
//!   trace never defined ([`scope_event_name`]);
//! - marks by their kind: [`mark_kind_name`] (`epoch_begin`, `epoch_end`, `cpu_sample`).
//!
//! Rebase records (which move a chunk's time base) are not events: they are left out of every
//! count and export.
//!
//! Other parts of the JSON contract, kept where they are computed:
//!
//! - `epochs`: the `*_mb` keys are as fastai prints them, each reading truncated to whole MB
//!   (`int(bytes / 2**20)`) before subtracting, and `gpu_peak_mb` alone carries fastai's
//!   adjustment (a negative peak reads 0, else a positive `gpu_used_mb` is subtracted from
//!   it); the `*_bytes` keys are the raw exact deltas in bytes, never truncated nor adjusted.
//! - Times (`peak_used_ns`, `peak_acquired_ns`, `duration_ns`, epoch bounds, ...) are ns since
//!   the trace's start, converted from the recorder's clock ticks and rounded down to whole ns.

use poolsight_schema::fb;
use serde::Serialize;

/// Kind of a frame, as recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FrameKind {
    Site,
    Function,
    Link,
    Scope,
    Foreign,
    Unknown,
}

impl From<fb::FrameKind> for FrameKind {
    fn from(k: fb::FrameKind) -> FrameKind {
        match k {
            fb::FrameKind::Site => FrameKind::Site,
            fb::FrameKind::Function => FrameKind::Function,
            fb::FrameKind::Link => FrameKind::Link,
            fb::FrameKind::Scope => FrameKind::Scope,
            fb::FrameKind::Foreign => FrameKind::Foreign,
            _ => FrameKind::Unknown,
        }
    }
}

impl FrameKind {
    /// The stable name exports and JSON use.
    pub fn as_str(self) -> &'static str {
        match self {
            FrameKind::Site => "site",
            FrameKind::Function => "function",
            FrameKind::Link => "link",
            FrameKind::Scope => "scope",
            FrameKind::Foreign => "foreign",
            FrameKind::Unknown => "unknown",
        }
    }
}

/// Whether a scope ran in the forward or the backward pass, as recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    None,
    Forward,
    Backward,
}

impl From<fb::Phase> for Phase {
    fn from(p: fb::Phase) -> Phase {
        match p {
            fb::Phase::Forward => Phase::Forward,
            fb::Phase::Backward => Phase::Backward,
            _ => Phase::None,
        }
    }
}

impl Phase {
    /// The stable name exports and JSON use.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::None => "none",
            Phase::Forward => "forward",
            Phase::Backward => "backward",
        }
    }
}

/// A memory event's name in `info` and in the JSON Lines export.
pub fn mem_kind_name(k: fb::MemKind) -> &'static str {
    match k {
        fb::MemKind::MallocPre => "malloc_pre",
        fb::MemKind::MallocPost => "malloc_post",
        fb::MemKind::AllocPre => "alloc_pre",
        fb::MemKind::AllocPost => "alloc_post",
        fb::MemKind::FreePre => "free_pre",
        fb::MemKind::FreePost => "free_post",
        fb::MemKind::Release => "release",
        fb::MemKind::OutOfMemory => "out_of_memory",
        fb::MemKind::LimitSet => "limit_set",
        _ => "unknown_mem",
    }
}

/// A mark's name in `info` and in the JSON Lines export.
pub fn mark_kind_name(k: fb::MarkKind) -> &'static str {
    match k {
        fb::MarkKind::EpochBegin => "epoch_begin",
        fb::MarkKind::EpochEnd => "epoch_end",
        fb::MarkKind::CpuSample => "cpu_sample",
        fb::MarkKind::ScopeAbort => "scope_abort",
        _ => "unknown_mark",
    }
}

/// A scope event's key in `info`, by its innermost frame's kind (`None`: a stack or frame the
/// trace never defined).
pub fn scope_event_name(innermost: Option<FrameKind>) -> &'static str {
    match innermost {
        Some(FrameKind::Function) => "function",
        Some(FrameKind::Link) => "link",
        Some(FrameKind::Scope) => "scope",
        _ => "scope_other",
    }
}

/// A scope's category in the exports (Chrome's `cat`, the JSON Lines `type`): `function`,
/// `link`, or `scope` for every other innermost frame kind.
pub fn scope_category(innermost: FrameKind) -> &'static str {
    match innermost {
        FrameKind::Function | FrameKind::Link => innermost.as_str(),
        _ => "scope",
    }
}

/// Every event key `info` may show, in the order it lists them: the pool's hooks in CuPy's
/// order, then scopes, then marks. Keys not listed here (unknown kinds of a newer writer)
/// come last.
pub const EVENT_KEYS: &[&str] = &[
    "malloc_pre",
    "malloc_post",
    "alloc_pre",
    "alloc_post",
    "free_pre",
    "free_post",
    "release",
    "out_of_memory",
    "limit_set",
    "function",
    "link",
    "scope",
    "scope_other",
    "epoch_begin",
    "epoch_end",
    "cpu_sample",
    "scope_abort",
];
