//! The recorder's vocabulary: what kind of memory event, mark, frame or scope is recorded, and
//! in which phase. These mirror the enums of `schema/trace.fbs` (same values, so converting is
//! free) but are the recorder's own, so that callers and bindings never depend on generated
//! code; the writer converts them when it lays an event out.
//!
//! Each type converts `Into` the format's enum of the same name, for code that compares what it
//! recorded with what a reader returns.

use poolsight_schema::fb;

/// What a memory event says happened; fields per kind are described on [`crate::MemRecord`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum MemKind {
    /// A request to the allocator (`size` asked).
    MallocPre = 0,
    /// The answer to a request: `ptr` (0 when it failed), `size` asked, the block's id.
    MallocPost = 1,
    /// The allocator asks the device for memory (a cache miss).
    AllocPre = 2,
    /// The device's answer: `ptr` (0 when it failed) and the bytes acquired.
    AllocPost = 3,
    /// A block goes back to the allocator.
    FreePre = 4,
    FreePost = 5,
    /// The allocator returned `bytes` of cached memory to the device.
    Release = 6,
    /// A request failed for lack of memory: `bytes` asked, `ptr` the bytes held from the device.
    OutOfMemory = 7,
    /// The allocator's limit was set to `bytes` (0 = none).
    LimitSet = 8,
}

/// A rare event with an absolute timestamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum MarkKind {
    /// `aux` = epoch number, `a` = CPU bytes in use.
    EpochBegin = 0,
    /// `aux` = epoch number, `a` = CPU bytes in use, `b` = CPU peak bytes since the begin.
    EpochEnd = 1,
    /// `a` = CPU bytes in use.
    CpuSample = 2,
    /// A scope closed by an exception, not a completed call: `aux` = its stack, `a` = the
    /// ticks it opened at. Written by [`crate::Handle::abort`] and by guards dropped while
    /// unwinding or marked failed.
    ScopeAbort = 3,
}

/// What opened a frame of an interned stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameKind {
    /// An allocation's call site (`file:line`, named after the innermost open scope).
    Site = 0,
    /// A function scope (a Chainer `FunctionNode` call).
    Function = 1,
    /// A link scope (a Chainer `Link` call).
    Link = 2,
    /// A user scope.
    Scope = 3,
    /// A frame handed in by a foreign caller (a line of a Python traceback).
    Foreign = 4,
}

/// Whether a function scope is the forward or the backward computation; reports split by it as
/// Chainer's `CupyMemoryProfileHook` does. `None` for everything that is neither.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Phase {
    None = 0,
    Forward = 1,
    Backward = 2,
}

/// The kinds of scope a caller can open (see [`crate::Handle::enter`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScopeKind {
    Function,
    Link,
    Scope,
}

impl From<ScopeKind> for FrameKind {
    fn from(k: ScopeKind) -> FrameKind {
        match k {
            ScopeKind::Function => FrameKind::Function,
            ScopeKind::Link => FrameKind::Link,
            ScopeKind::Scope => FrameKind::Scope,
        }
    }
}

impl From<MemKind> for fb::MemKind {
    #[inline(always)]
    fn from(k: MemKind) -> fb::MemKind {
        fb::MemKind(k as u8)
    }
}

impl From<MarkKind> for fb::MarkKind {
    #[inline(always)]
    fn from(k: MarkKind) -> fb::MarkKind {
        fb::MarkKind(k as u8)
    }
}

impl From<FrameKind> for fb::FrameKind {
    #[inline(always)]
    fn from(k: FrameKind) -> fb::FrameKind {
        fb::FrameKind(k as u8)
    }
}

impl From<Phase> for fb::Phase {
    #[inline(always)]
    fn from(p: Phase) -> fb::Phase {
        fb::Phase(p as u8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The conversions are casts: they hold only while the values match the schema's.
    #[test]
    fn values_match_the_schema() {
        let mem = [
            (MemKind::MallocPre, fb::MemKind::MallocPre),
            (MemKind::MallocPost, fb::MemKind::MallocPost),
            (MemKind::AllocPre, fb::MemKind::AllocPre),
            (MemKind::AllocPost, fb::MemKind::AllocPost),
            (MemKind::FreePre, fb::MemKind::FreePre),
            (MemKind::FreePost, fb::MemKind::FreePost),
            (MemKind::Release, fb::MemKind::Release),
            (MemKind::OutOfMemory, fb::MemKind::OutOfMemory),
            (MemKind::LimitSet, fb::MemKind::LimitSet),
        ];
        for (ours, theirs) in mem {
            assert_eq!(fb::MemKind::from(ours), theirs, "{ours:?}");
        }
        let marks = [
            (MarkKind::EpochBegin, fb::MarkKind::EpochBegin),
            (MarkKind::EpochEnd, fb::MarkKind::EpochEnd),
            (MarkKind::CpuSample, fb::MarkKind::CpuSample),
            (MarkKind::ScopeAbort, fb::MarkKind::ScopeAbort),
        ];
        for (ours, theirs) in marks {
            assert_eq!(fb::MarkKind::from(ours), theirs, "{ours:?}");
        }
        let frames = [
            (FrameKind::Site, fb::FrameKind::Site),
            (FrameKind::Function, fb::FrameKind::Function),
            (FrameKind::Link, fb::FrameKind::Link),
            (FrameKind::Scope, fb::FrameKind::Scope),
            (FrameKind::Foreign, fb::FrameKind::Foreign),
        ];
        for (ours, theirs) in frames {
            assert_eq!(fb::FrameKind::from(ours), theirs, "{ours:?}");
        }
        let phases = [
            (Phase::None, fb::Phase::None),
            (Phase::Forward, fb::Phase::Forward),
            (Phase::Backward, fb::Phase::Backward),
        ];
        for (ours, theirs) in phases {
            assert_eq!(fb::Phase::from(ours), theirs, "{ours:?}");
        }
    }
}
