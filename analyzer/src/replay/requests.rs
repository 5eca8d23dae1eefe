//! A trace's memory events in time order as the requests an allocator model replays
//! (`poolsight whatif`): what was asked, freed, and what the recorded allocator took from and
//! gave back to the device. The same time-ordered merge as the replay's, so the order is the
//! one every report sees.

use crate::read::names::FrameKind;
use poolsight_schema::fb;

use super::fold::Effect;
use super::merge::{walk_decoding, Sink};
use super::stacks::frames_of_stack;
use super::Units;
use crate::read::Trace;

/// What a memory event asks of an allocator: the allocator models' own word for it (a
/// snapshot's `alloc`, `free_requested`, `free_completed`, `oom`, `segment_alloc`/`segment_map`,
/// `segment_free`/`segment_unmap`), so that a request replays through a model as it is.
pub use poolsight_alloc_models::replay::Op as RequestKind;

/// One memory event, in time order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemRequest {
    pub kind: RequestKind,
    pub device: u32,
    pub stream: u32,
    pub addr: u64,
    pub bytes: u64,
    /// The interned stack of the event (0: none).
    pub stack: u32,
    /// Nanoseconds since the trace began.
    pub ns: u64,
}

struct Collect<'t> {
    trace: &'t Trace,
    units: Units,
    out: Vec<MemRequest>,
}

impl Sink for Collect<'_> {
    fn mem(&mut self, ticks: u64, e: &fb::MemEvent) -> bool {
        let kind = match Effect::of(e, &self.units) {
            // A failed request (null pointer) is told by its out-of-memory event.
            Effect::Malloc { size } if size > 0 => RequestKind::Malloc,
            Effect::Free { .. } => RequestKind::Free,
            Effect::FreeRequested => RequestKind::FreeRequested,
            Effect::OutOfMemory { .. } => RequestKind::OutOfMemory,
            Effect::Acquire { .. } if e.ptr() != 0 => RequestKind::Acquire,
            Effect::Release { .. } => RequestKind::Release,
            _ => return true,
        };
        self.out.push(MemRequest {
            kind,
            device: e.device().into(),
            stream: e.stream().into(),
            addr: e.ptr(),
            bytes: e.bytes(),
            stack: e.stack(),
            ns: self.trace.ns_since_start(ticks),
        });
        true
    }

    fn mark(&mut self, _: &fb::MarkEvent) {}
}

/// Every request of `trace` (all devices), in time order.
pub fn memory_requests(trace: &Trace) -> Vec<MemRequest> {
    let mut sink = Collect {
        trace,
        units: Units::of(trace),
        out: Vec::new(),
    };
    walk_decoding(trace, &[], &mut sink, false, None);
    sink.out
}

/// The line that made a request, as the out-of-memory report says it ([`super::oom::user_line`]):
/// the innermost frame with a file and a line, with the operator or scope inside it, or `None`
/// for a request without a stack.
pub fn request_line(trace: &Trace, stack: u32) -> Option<String> {
    if stack == 0 {
        return None;
    }
    let frames = frames_of_stack(trace, stack);
    let refs: Vec<&super::profile::Frame> = frames.iter().collect();
    refs.iter()
        .any(|f| f.kind != FrameKind::Label)
        .then(|| super::oom::user_line(&refs))
}
