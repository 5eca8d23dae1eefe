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

use poolsight_schema::{fb, kinds};
use serde::Serialize;

/// Kind of a frame, as recorded ([`kinds::FrameKind`]), or `Unknown` for a frame a damaged
/// trace names but never defined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FrameKind {
    Site,
    Function,
    Link,
    Scope,
    Foreign,
    Label,
    Unknown,
}

impl From<kinds::FrameKind> for FrameKind {
    fn from(k: kinds::FrameKind) -> FrameKind {
        match k {
            kinds::FrameKind::Site => FrameKind::Site,
            kinds::FrameKind::Function => FrameKind::Function,
            kinds::FrameKind::Link => FrameKind::Link,
            kinds::FrameKind::Scope => FrameKind::Scope,
            kinds::FrameKind::Foreign => FrameKind::Foreign,
            kinds::FrameKind::Label => FrameKind::Label,
        }
    }
}

impl From<fb::FrameKind> for FrameKind {
    fn from(k: fb::FrameKind) -> FrameKind {
        kinds::FrameKind::try_from(k).map_or(FrameKind::Unknown, FrameKind::from)
    }
}

impl FrameKind {
    /// The stable name exports and JSON use ([`kinds::FrameKind::name`]).
    pub fn as_str(self) -> &'static str {
        match self {
            FrameKind::Site => kinds::FrameKind::Site.name(),
            FrameKind::Function => kinds::FrameKind::Function.name(),
            FrameKind::Link => kinds::FrameKind::Link.name(),
            FrameKind::Scope => kinds::FrameKind::Scope.name(),
            FrameKind::Foreign => kinds::FrameKind::Foreign.name(),
            FrameKind::Label => kinds::FrameKind::Label.name(),
            FrameKind::Unknown => "unknown",
        }
    }
}

/// Whether a scope ran in the forward or the backward pass, as recorded; a value the format
/// does not know reads as `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub struct Phase(#[serde(serialize_with = "phase_name")] pub kinds::Phase);

fn phase_name<S: serde::Serializer>(p: &kinds::Phase, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(p.name())
}

#[allow(non_upper_case_globals)]
impl Phase {
    pub const None: Phase = Phase(kinds::Phase::None);
    pub const Forward: Phase = Phase(kinds::Phase::Forward);
    pub const Backward: Phase = Phase(kinds::Phase::Backward);

    /// The stable name exports and JSON use.
    pub fn as_str(self) -> &'static str {
        self.0.name()
    }
}

impl From<fb::Phase> for Phase {
    fn from(p: fb::Phase) -> Phase {
        Phase(kinds::Phase::try_from(p).unwrap_or(kinds::Phase::None))
    }
}

/// A memory event's name in `info` and in the JSON Lines export.
pub fn mem_kind_name(k: fb::MemKind) -> &'static str {
    kinds::MemKind::try_from(k).map_or("unknown_mem", kinds::MemKind::name)
}

/// A mark's name in `info` and in the JSON Lines export.
pub fn mark_kind_name(k: fb::MarkKind) -> &'static str {
    kinds::MarkKind::try_from(k).map_or("unknown_mark", kinds::MarkKind::name)
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
pub fn event_keys() -> Vec<&'static str> {
    kinds::MemKind::ALL
        .iter()
        .map(|k| k.name())
        .chain(["function", "link", "scope", "scope_other"])
        .chain(kinds::MarkKind::ALL.iter().map(|k| k.name()))
        .collect()
}
