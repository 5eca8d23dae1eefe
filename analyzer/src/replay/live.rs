//! Bytes live over time, for the HTML report's timeline: one more time-ordered walk over a
//! trace's memory events (the replay's merge, so its ordinals are the replay's), tracking live
//! blocks, with a snapshot right after each event that reached a point's used maximum. Each
//! snapshot groups the live bytes three ways, so that the timeline can be stacked by any of
//! them and every way adds up to the same used bytes: by allocating stack, by memory category
//! (the innermost `Label` frame, for a trace whose allocations carry labels) and by module (the
//! innermost chain of link frames, for a trace with link scopes).
//!
//! A grouping is computed from every live stack at the snapshot's instant (never from the
//! stacks a snapshot keeps), so a category's or module's bytes are exact. Memory is bounded by
//! the live blocks and the series' points times the groups kept per point.

use std::collections::HashMap;

use poolsight_schema::fb;
use rustc_hash::FxHashMap;

use super::categories::{has_labels, has_links, Classes};
use super::merge::{sorted_marks, walk_decoding, Sink};
use super::profile::{Frame, Series};
use super::stacks::frames_of_stack;
use super::timeline::{Snapshot, Timeline};
use super::{CategoryRule, Units};
use crate::read::Trace;

/// What [`live_over_time`] gives.
#[derive(Debug, Clone, Default)]
pub struct LiveOverTime {
    /// By allocating stack (ids: interned stack ids), one per point of the series.
    pub points: Vec<Snapshot>,
    /// The frames of every stack the snapshots name, outermost first.
    pub stacks: HashMap<u32, Vec<Frame>>,
    /// By memory category (ids index [`LiveOverTime::categories`]), one per point; empty for a
    /// trace whose allocations carry no label.
    pub by_category: Vec<Snapshot>,
    /// Category names; `None` for the allocations without a label.
    pub categories: Vec<Option<String>>,
    /// By module (ids index [`LiveOverTime::modules`]), one per point; empty for a trace
    /// without link scopes.
    pub by_module: Vec<Snapshot>,
    /// Modules: their link frames, outermost first; an empty path stands for the allocations
    /// made outside every module.
    pub modules: Vec<Vec<Frame>>,
}

/// Bytes live over time (see the module documentation): one [`Snapshot`] per point of `series`
/// (a replay of `trace`) for each grouping, taken right after the memory event that reached
/// the point's used maximum, so each snapshot's bytes add up to that maximum exactly. Each keeps
/// its `keep_stacks` largest stacks, or its `keep_groups` largest categories or modules; the
/// rest are summed in its `other`.
pub fn live_over_time(
    trace: &Trace,
    series: &Series,
    keep_stacks: usize,
    keep_groups: usize,
    rules: &[CategoryRule],
) -> LiveOverTime {
    let mut stops = series.used_max_ordinals.clone();
    stops.sort_unstable();
    stops.dedup();
    let mut walk = Walk {
        tl: Timeline::new(trace.header.ticks0, 0, stops.clone(), keep_stacks),
        units: Units::of(trace),
        classes: Classes::new(trace, rules),
        labels: has_labels(trace),
        links: has_links(trace),
        keep: keep_groups,
        by_category: Vec::new(),
        by_module: Vec::new(),
    };
    if !stops.is_empty() {
        walk_decoding(trace, &sorted_marks(trace), &mut walk, false, None);
    }
    // Snapshot k was taken at stops[k]; a point whose stop was never reached (the walk ended
    // first, in a damaged trace) reads empty.
    let at: HashMap<u64, usize> = stops.iter().enumerate().map(|(k, &o)| (o, k)).collect();
    let per_point = |snapshots: &[Snapshot]| -> Vec<Snapshot> {
        series
            .used_max_ordinals
            .iter()
            .map(|o| {
                at.get(o)
                    .and_then(|&k| snapshots.get(k))
                    .cloned()
                    .unwrap_or_default()
            })
            .collect()
    };
    let points = per_point(&walk.tl.snapshots);
    let by_category = if walk.labels {
        per_point(&walk.by_category)
    } else {
        Vec::new()
    };
    let mut by_module = if walk.links {
        per_point(&walk.by_module)
    } else {
        Vec::new()
    };

    let mut ids: Vec<u32> = points
        .iter()
        .flat_map(|p| p.stacks.iter().map(|s| s.0))
        .collect();
    ids.sort_unstable();
    ids.dedup();
    let stacks = ids
        .into_iter()
        .map(|id| (id, frames_of_stack(trace, id)))
        .collect();
    let categories = if walk.labels {
        walk.classes
            .categories
            .iter()
            .map(|c| c.as_deref().map(str::to_string))
            .collect()
    } else {
        Vec::new()
    };
    let modules = if walk.links {
        let outside = walk.classes.modules.len() as u32;
        for p in &mut by_module {
            for s in &mut p.stacks {
                if s.0 == OUTSIDE {
                    s.0 = outside;
                }
            }
        }
        (0..outside)
            .map(|m| walk.classes.path(m))
            .chain([Vec::new()])
            .collect()
    } else {
        Vec::new()
    };
    LiveOverTime {
        points,
        stacks,
        by_category,
        categories,
        by_module,
        modules,
    }
}

/// The module id of allocations outside every module while walking (the last id after).
const OUTSIDE: u32 = u32::MAX;

/// The walk's sink: the replay's live-block tracking, and the groupings of each snapshot.
struct Walk<'t> {
    tl: Timeline,
    units: Units,
    classes: Classes<'t>,
    /// Whether to group by category (the trace has labels) and by module (it has links).
    labels: bool,
    links: bool,
    /// Categories and modules kept per snapshot.
    keep: usize,
    by_category: Vec<Snapshot>,
    by_module: Vec<Snapshot>,
}

impl Walk<'_> {
    /// Groups the live stacks of the snapshot just taken.
    fn group(&mut self) {
        let mut categories: FxHashMap<u32, u64> = FxHashMap::default();
        let mut modules: FxHashMap<u32, u64> = FxHashMap::default();
        for (&stack, &bytes) in &self.tl.live {
            let class = self.classes.of(stack);
            if self.labels {
                let c = categories.entry(class.category).or_default();
                *c = c.saturating_add(bytes);
            }
            if self.links {
                let m = modules.entry(class.module.unwrap_or(OUTSIDE)).or_default();
                *m = m.saturating_add(bytes);
            }
        }
        if self.labels {
            let s = Snapshot::largest(categories.into_iter(), self.keep);
            self.by_category.push(s);
        }
        if self.links {
            let s = Snapshot::largest(modules.into_iter(), self.keep);
            self.by_module.push(s);
        }
    }
}

impl Sink for Walk<'_> {
    #[inline]
    fn mem(&mut self, ticks: u64, e: &fb::MemEvent) -> bool {
        let taken = self.tl.snapshots.len();
        self.tl.mem(ticks, e, &self.units, true);
        for _ in taken..self.tl.snapshots.len() {
            self.group();
        }
        !self.tl.stopped()
    }

    fn mark(&mut self, m: &fb::MarkEvent) {
        self.tl.mark(m)
    }
}
