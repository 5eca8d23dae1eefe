//! Phases of a training step inferred from the stacks of a snapshot that has no
//! `record_function` ranges (docs/pytorch-files.md, "Phases", gives the rules and their
//! evidence): each allocation says which phase made it, and a phase is a stretch of the
//! allocations, in order, that say the same.
//!
//! 1. An allocation was made in the **backward** pass when its stack is the autograd engine's
//!    (its C++ frames, an autograd node such as `MmBackward0`, or `torch.autograd.backward` /
//!    `_engine_run_backward` in Python): whatever else the stack holds (a checkpointed
//!    module's forward recomputed in backward is backward).
//! 2. In an **optimizer step** when a frame of `torch/optim/` (not `lr_scheduler`) is in its
//!    stack with none of the user's own code inside it (a closure's forward is not the step's).
//! 3. In the **forward** pass when a module's `forward` is in its stack.
//! 4. Otherwise it says nothing (the loss computed outside every module, `zero_grad`, the
//!    data loader, the model built): it belongs to the stretch around it when the allocations
//!    on either side say the same phase, and to no phase between two different ones.
//!
//! A stretch runs from its first allocation to its last: each is a function scope named
//! `forward`, `backward` or `optimizer step` (so `functions` and `timers` count them), and the
//! allocations in it have its frame as the outermost of their stacks, as the ranges of a file
//! that records them do (so `lines` and the flamegraphs split by phase first, and every report
//! that reads a stack's innermost frames reads the same frames as before). Allocations are
//! placed by their order, not by their time (a clock of microseconds gives many allocations
//! one time).

use super::categories::evidence;
use super::entries::{Action, Entry, Made, Tables};
use crate::events::{Ev, Events, Stack};
use crate::infer;
use crate::pickle::Store;
use poolsight_recorder::{Frame, FrameKind, Phase};
use rustc_hash::FxHashMap;

/// What an allocation says of its phase (rules 1–3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Part {
    Forward,
    Backward,
    OptimizerStep,
}

impl Part {
    pub(super) fn of(e: &infer::Evidence) -> Option<Part> {
        if e.backward {
            Some(Part::Backward)
        } else if e.optimizer {
            Some(Part::OptimizerStep)
        } else if e.forward {
            Some(Part::Forward)
        } else {
            None
        }
    }

    /// The frame of a stretch of this part: a function frame whose file says it was inferred.
    fn frame(self) -> Frame {
        let (name, phase) = match self {
            Part::Forward => ("forward", Phase::Forward),
            Part::Backward => ("backward", Phase::Backward),
            Part::OptimizerStep => ("optimizer step", Phase::None),
        };
        Frame {
            kind: FrameKind::Function,
            phase,
            file: infer::INFERRED.to_owned(),
            line: 0,
            name: name.to_owned(),
        }
    }
}

/// One stretch: its part and its first and last allocation (indices among the allocations).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Stretch {
    pub(super) part: Part,
    pub(super) first: usize,
    pub(super) last: usize,
}

/// The stretches of a sequence of allocations' parts (rule 4), in order.
pub(super) fn stretches(parts: &[Option<Part>]) -> Vec<Stretch> {
    let mut out: Vec<Stretch> = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        let Some(p) = *p else { continue };
        match out.last_mut() {
            Some(s) if s.part == p => s.last = i,
            _ => out.push(Stretch {
                part: p,
                first: i,
                last: i,
            }),
        }
    }
    out
}

/// The inferred phases of one device's entries: per allocation, the stack prefix of its
/// stretch; and each stretch, to be written as a function scope.
pub(super) struct Inferred {
    /// (first allocation, last allocation, start ns, end ns, the stretch's frame id).
    spans: Vec<(usize, usize, u64, u64, u32)>,
    next: usize,
}

impl Inferred {
    /// The phases of `entries` (at `times`, ns).
    pub(super) fn new(
        entries: &[Entry],
        times: &[u64],
        t: &Tables,
        s: &Store<Made>,
        ev: &mut Events,
    ) -> Inferred {
        let mut by_frames: FxHashMap<u32, Option<Part>> = FxHashMap::default();
        let mut parts = Vec::new();
        let mut at = Vec::new();
        for (i, e) in entries.iter().enumerate() {
            if e.action == Ok(Action::Alloc) {
                let part = *by_frames
                    .entry(e.frames)
                    .or_insert_with(|| Part::of(&evidence(t, s, e.frames)));
                parts.push(part);
                at.push(times[i]);
            }
        }
        let spans = stretches(&parts)
            .into_iter()
            .map(|st| {
                let frame = ev.frame(st.part.frame());
                (st.first, st.last, at[st.first], at[st.last], frame)
            })
            .collect();
        Inferred { spans, next: 0 }
    }

    /// The prefix of the stack of allocation `i` (allocations asked for in order): its
    /// stretch's frame, or none between stretches.
    pub(super) fn prefix(&mut self, i: usize) -> &[u32] {
        while self.next < self.spans.len() && self.spans[self.next].1 < i {
            self.next += 1;
        }
        match self.spans.get(self.next) {
            Some(span) if span.0 <= i => std::slice::from_ref(&span.4),
            _ => &[],
        }
    }

    /// Writes each stretch as a function scope.
    pub(super) fn finish(self, ev: &mut Events) {
        for (_, _, start, end, frame) in self.spans {
            let stack: Stack = ev.stack(&[frame]);
            ev.push(end.max(start), Ev::scope(start, stack));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_reads_as_forward_backward_and_the_optimizers_step() {
        use Part::*;
        let f = Some(Forward);
        let b = Some(Backward);
        let o = Some(OptimizerStep);
        // Two micro-batches (gradient accumulation), the loss between forward and backward
        // outside every module, then the step; zero_grad after it says nothing.
        let parts = [
            None, f, None, f, None, b, b, f, f, None, b, o, None, o, None,
        ];
        let s = stretches(&parts);
        let got: Vec<(Part, usize, usize)> = s.iter().map(|s| (s.part, s.first, s.last)).collect();
        assert_eq!(
            got,
            [
                (Forward, 1, 3),
                (Backward, 5, 6),
                (Forward, 7, 8),
                (Backward, 10, 10),
                (OptimizerStep, 11, 13),
            ]
        );
    }

    #[test]
    fn the_engine_wins_over_a_recomputed_forward() {
        let e = infer::Evidence {
            backward: true,
            forward: true,
            ..Default::default()
        };
        assert_eq!(Part::of(&e), Some(Part::Backward));
        let closure = infer::Evidence {
            optimizer: false,
            forward: true,
            ..Default::default()
        };
        assert_eq!(Part::of(&closure), Some(Part::Forward));
        assert_eq!(Part::of(&infer::Evidence::default()), None);
    }
}
