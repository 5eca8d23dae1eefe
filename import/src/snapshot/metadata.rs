//! The strings newer PyTorch puts on trace entries, which no poolsight event holds:
//! `user_metadata` (`torch.cuda.memory._set_memory_metadata`, stamped on every entry the
//! thread makes while set) and `compile_context` (torch.compile's frame, `N/A` outside it).
//! `info` shows how many entries carry each and the most common values; an `annotate`
//! entry's `user_metadata` is its annotation mark's text (`_annotate_memory`), which `info`
//! lists the same way, as no report shows marks' texts yet.

use rustc_hash::FxHashMap;

use super::entries::{Action, Entry, Made, NONE};
use super::Unmapped;
use crate::pickle::{Store, StrId};

/// How many values of each are named.
const SHOWN: usize = 3;

pub(super) fn summarize<'a>(
    entries: impl Iterator<Item = &'a Entry>,
    s: &Store<Made>,
    unmapped: &mut Unmapped,
) {
    let mut notes: FxHashMap<StrId, u64> = FxHashMap::default();
    let mut contexts: FxHashMap<StrId, u64> = FxHashMap::default();
    let mut annotations: FxHashMap<StrId, u64> = FxHashMap::default();
    for e in entries {
        if e.action == Ok(Action::Annotate) {
            *annotations.entry(e.note).or_default() += 1;
        } else if e.note != NONE && !s.text(e.note).is_empty() {
            *notes.entry(e.note).or_default() += 1;
        }
        if e.context != NONE && !matches!(s.text(e.context), "" | "N/A") {
            *contexts.entry(e.context).or_default() += 1;
        }
    }
    let kept_by_none = "kept by no event";
    line(
        "entries with `user_metadata`",
        kept_by_none,
        notes,
        s,
        unmapped,
    );
    line(
        "entries with `compile_context`",
        kept_by_none,
        contexts,
        s,
        unmapped,
    );
    let marks = "annotation marks";
    line("`annotate` entries", marks, annotations, s, unmapped);
}

/// `what (how; "a" n, "b" m, ...): N`, the most common first.
fn line(
    what: &str,
    how: &str,
    counts: FxHashMap<StrId, u64>,
    s: &Store<Made>,
    unmapped: &mut Unmapped,
) {
    if counts.is_empty() {
        return;
    }
    let total: u64 = counts.values().sum();
    let mut by_count: Vec<(StrId, u64)> = counts.into_iter().collect();
    by_count.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| s.text(a.0).cmp(s.text(b.0))));
    let mut shown: Vec<String> = by_count
        .iter()
        .take(SHOWN)
        .map(|&(id, n)| {
            let text = if id == NONE { "" } else { s.text(id) };
            format!("{text:?} {n}")
        })
        .collect();
    if by_count.len() > SHOWN {
        shown.push(format!("{} more", by_count.len() - SHOWN));
    }
    unmapped
        .0
        .insert(format!("{what} ({how}; {})", shown.join(", ")), total);
}
