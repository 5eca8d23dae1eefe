//! The inferred categories of a snapshot's allocations ([`crate::infer`]): the evidence of
//! each one's frames, then the rules over the order of events.

use rustc_hash::FxHashMap;

use std::collections::BTreeMap;

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
                if phases.in_optimizer_step() {
                    ev = ev.in_optimizer_range();
                }
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

/// The gradients of one device: for each (size, stream), the most gradients of that size live
/// at once ([`infer_categories`]' `gradient`s, made in a backward pass and outliving it). Each
/// parameter has one `.grad`: so many parameters at least have that size, whatever the steps.
pub(super) fn gradient_sizes(entries: &[Entry], inferred: &[&str]) -> BTreeMap<(u64, u64), usize> {
    let mut most: BTreeMap<(u64, u64), usize> = BTreeMap::new();
    let mut now: BTreeMap<(u64, u64), usize> = BTreeMap::new();
    let mut live: FxHashMap<u64, (u64, u64)> = FxHashMap::default();
    let mut allocs = 0usize;
    for e in entries {
        match e.action {
            Ok(Action::Alloc) => {
                let gradient = inferred.get(allocs) == Some(&infer::GRADIENT);
                allocs += 1;
                if gradient {
                    let key = (e.size, e.stream);
                    let n = now.entry(key).or_default();
                    *n += 1;
                    let m = most.entry(key).or_default();
                    *m = (*m).max(*n);
                    live.insert(e.addr, key);
                }
            }
            Ok(Action::FreeCompleted) => {
                if let Some(key) = live.remove(&e.addr) {
                    if let Some(n) = now.get_mut(&key) {
                        *n = n.saturating_sub(1);
                    }
                }
            }
            _ => {}
        }
    }
    most
}

/// Which blocks live from the start that nothing else names (`before recording`) are
/// parameters: as many of each (size, stream) as the gradients of that size ([`gradient_sizes`]),
/// the lowest addresses first; the others stay `before recording` (a frozen parameter has no
/// gradient). `blocks`: (address, size, stream) of the candidates; the answer is per block.
pub(super) fn by_gradients(
    blocks: &[(u64, u64, u64)],
    mut gradients: BTreeMap<(u64, u64), usize>,
) -> Vec<bool> {
    let mut order: Vec<usize> = (0..blocks.len()).collect();
    order.sort_by_key(|&i| blocks[i].0);
    let mut out = vec![false; blocks.len()];
    for i in order {
        let (_, size, stream) = blocks[i];
        if let Some(n) = gradients.get_mut(&(size, stream)).filter(|n| **n > 0) {
            *n -= 1;
            out[i] = true;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_parameters_one_gradient_each() {
        let gradients = BTreeMap::from([((4096, 0), 2), ((512, 0), 1)]);
        // Three blocks of a gradient's size, one on another stream, one of another size.
        let blocks = [
            (30, 4096, 0),
            (10, 4096, 0),
            (20, 4096, 0),
            (40, 4096, 7),
            (50, 1024, 0),
        ];
        assert_eq!(
            by_gradients(&blocks, gradients),
            [false, true, true, false, false]
        );
    }
}
