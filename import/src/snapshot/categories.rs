//! The inferred categories of a snapshot's allocations ([`crate::infer`]): the evidence of
//! each one's frames, then the rules over the order of events.

use rustc_hash::FxHashMap;

use super::entries::{raw_frame, Action, Entry, Made, Tables};
use super::ranges::Phases;
use super::stacks::Label;
use crate::infer;
use crate::pickle::Store;

/// What an allocation's frames say ([`infer::Evidence`]), without its lifetime.
pub(super) fn evidence(t: &Tables, s: &Store<Made>, frames: u32) -> infer::Evidence {
    let list = t.lists.get(frames as usize).map_or(&[][..], |l| &l[..]);
    let raw: Vec<(&str, &str, u32)> = list.iter().rev().map(|&f| raw_frame(t, s, f)).collect();
    infer::evidence_of(&raw)
}

/// The category of a block live from the start to the end (a segment's block no entry
/// allocated): a gradient or optimizer state by its frames, else a parameter; `before
/// recording` when it has no frames.
pub(super) fn initial_category(t: &Tables, s: &Store<Made>, frames: u32) -> &'static str {
    infer::initial(evidence(t, s, frames))
}

/// The label of a segment's block live from the start: its inferred category, when the file's
/// categories are inferred.
pub(super) fn initial_label(infer: bool, t: &Tables, s: &Store<Made>, frames: u32) -> Label {
    if infer {
        Label::Inferred(initial_category(t, s, frames))
    } else {
        Label::None
    }
}

/// The inferred category of each `alloc` entry of one device, in order ([`infer`]).
pub(super) fn infer_categories(
    entries: &[Entry],
    times: &[u64],
    t: &Tables,
    s: &Store<Made>,
    phases: &mut Phases,
) -> Vec<&'static str> {
    let mut by_frames: FxHashMap<u32, infer::Evidence> = FxHashMap::default();
    let mut lives: Vec<infer::Life> = Vec::new();
    let mut live: FxHashMap<u64, usize> = FxHashMap::default();
    // The last free: (address, size, the version it ended), for an allocation made right
    // where it was (the next version of the same storage).
    let mut last_free: Option<(u64, u64, infer::Prev)> = None;
    for (i, e) in entries.iter().enumerate() {
        phases.at(times[i]);
        let just_freed = last_free.take();
        match e.action {
            Ok(Action::Alloc) => {
                let mut ev = *by_frames
                    .entry(e.frames)
                    .or_insert_with(|| evidence(t, s, e.frames));
                ev.optimizer |= !ev.python && !ev.backward && phases.in_optimizer_step();
                live.insert(e.addr, lives.len());
                let prev = just_freed
                    .filter(|&(addr, size, _)| addr == e.addr && size == e.size)
                    .map(|(_, _, p)| p);
                lives.push(infer::Life {
                    evidence: ev,
                    freed_before: None,
                    prev,
                });
            }
            Ok(Action::FreeCompleted) => {
                let prev = match live.remove(&e.addr) {
                    Some(k) => {
                        lives[k].freed_before = Some(lives.len());
                        infer::Prev::Life(k)
                    }
                    None => infer::Prev::Before,
                };
                last_free = Some((e.addr, e.size, prev));
            }
            Ok(Action::FreeRequested) => last_free = just_freed,
            _ => {}
        }
    }
    infer::categories(&lives)
}
