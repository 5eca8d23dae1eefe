//! Replay: turns a verified trace into a [`Profile`], the one summary every report is computed
//! from, in one pass over the file, parallel over windows of time (`windows.rs`):
//!
//! - **Per stack**: each chunk's events fold into a small map from interned stack id to
//!   counters (mallocs, used bytes, device allocs, acquired bytes, scope calls, scope time,
//!   first-seen times). Maps merge by addition and minimum, so the result does not depend on
//!   how the work was split.
//! - **In time order**: the pool's used and acquired bytes over time need the memory events of
//!   every thread merged by timestamp, with the epoch marks in between. Each window merges its
//!   stretch of time (a k-way merge that takes runs of one thread's events while no other
//!   thread's event is earlier), counting bytes from zero; the windows' figures are then
//!   combined in order (`Timeline::from_windows`, `window_fold.rs`). A trace the windows cannot
//!   stand for (a thread going back in time, bytes that would saturate) is merged on one thread
//!   instead, beside a per-stack pass parallel over chunks: the figures are the same either
//!   way, which `tests/integration/windows.rs` checks on traces cut into windows of every size.
//!
//! A window reads each chunk once: it checks the chunk's checksum (when the trace was opened
//! with [`Trace::open_deferred`]) and folds it by stack as it reads it, and the merge then
//! finds its bytes in the cache.
//!
//! Memory stays bounded by the number of distinct stacks, not events: nothing is copied out of
//! the mapping, and each pass gives a chunk's pages back to the kernel once it is done with
//! them (see [`Trace::release_pages`]), so a trace far larger than RAM replays in a few MB.
//!
//! Bytes: a malloc's `mem_size` is its requested size rounded up to the device's allocation
//! unit, as the pool rounds it. In the per-stack counters (the seed tables) every request
//! counts, failed ones (pointer 0) included, as Chainer's and CuPy's pre hooks count them, and
//! the failed part is kept apart; the time-ordered pass counts only what the pool handed out
//! or held (live bytes).

mod categories;
mod downsample;
mod fold;
mod live;
mod merge;
mod oom;
mod profile;
mod raised;
mod requests;
mod stacks;
mod timeline;
mod window_fold;
mod windows;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::read::{ChunkKind, Trace};

pub use fold::row_bytes;
pub use live::{live_over_time, LiveOverTime};
pub use oom::{oom_states, round_size, user_line, LineBytes, OomState, PoolState};
pub use profile::{
    binary_bytes, signed, Agg, CallBytes, CallTree, CategoryBytes, CategoryFigures, DevicePeak,
    EpochFigures, Frame, Memory, MemoryKind, ModuleBytes, Node, PoolFigures, Predicted, Profile,
    Raised, Seen, Series, Source, NEVER,
};
pub use requests::{memory_requests, request_line, MemRequest, RequestKind};
pub use timeline::Snapshot;

/// What to compute beyond the always-computed figures.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    /// Bytes live at the moment of the pool's peak, by stack (a second time-ordered pass).
    pub live_at_peak: bool,
    /// Points in the used/acquired-bytes series (for the timeline plot).
    pub series_points: usize,
    /// Bytes of chunks processed so far, for a progress bar; each pass adds each chunk's
    /// length once, so the total is [`progress_total`] of the trace.
    pub progress: Option<Arc<AtomicU64>>,
    /// When to compute bytes by memory category and by module ([`Source::categories`]): one
    /// more time-ordered walk, which also gives the live bytes at the peak.
    pub categories: CategoryPass,
    /// User categories (`--category NAME=REGEX`): the first rule whose expression matches a
    /// frame of an allocation's stack (`file:line:name`) names its category, before any label.
    pub category_rules: Arc<[CategoryRule]>,
}

/// A user category: allocations with a frame that `pattern` matches are `name`.
#[derive(Debug, Clone)]
pub struct CategoryRule {
    pub name: Arc<str>,
    pub pattern: regex::Regex,
}

impl std::str::FromStr for CategoryRule {
    type Err = String;

    /// `NAME=REGEX`.
    fn from_str(s: &str) -> Result<CategoryRule, String> {
        let (name, pattern) = s
            .split_once('=')
            .ok_or_else(|| format!("{s:?} is not NAME=REGEX"))?;
        if name.trim().is_empty() {
            return Err(format!("{s:?} has no category name before `=`"));
        }
        let pattern = regex::Regex::new(pattern).map_err(|e| {
            format!(
                "{pattern:?} is not a regular expression: {}",
                one_line(&e.to_string())
            )
        })?;
        Ok(CategoryRule {
            name: name.trim().into(),
            pattern,
        })
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// When a replay computes bytes by memory category and by module.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CategoryPass {
    Never,
    /// For a trace whose allocations carry labels (memory categories): the default, so that
    /// every report of such a trace has its categories.
    #[default]
    IfLabelled,
    /// For every trace: its modules, and all its bytes as unlabelled.
    Always,
}

/// Whether the replay of `trace` with `opts` computes its categories.
fn wants_categories(trace: &Trace, opts: &ReplayOptions) -> bool {
    match opts.categories {
        CategoryPass::Never => false,
        CategoryPass::IfLabelled => {
            categories::has_labels(trace) || !opts.category_rules.is_empty()
        }
        CategoryPass::Always => true,
    }
}

/// What [`ReplayOptions::progress`] counts up to for a trace.
pub fn progress_total(trace: &Trace, opts: &ReplayOptions) -> u64 {
    let bytes: u64 = trace.chunks.iter().map(|c| c.len as u64).sum();
    bytes
        + if opts.live_at_peak || wants_categories(trace, opts) {
            mem_bytes(trace)
        } else {
            0
        }
}

/// Bytes of a trace's memory chunks: what the walk to the peak counts.
fn mem_bytes(trace: &Trace) -> u64 {
    trace
        .chunks
        .iter()
        .filter(|c| c.kind == ChunkKind::Mem)
        .map(|c| c.len as u64)
        .sum()
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            live_at_peak: false,
            series_points: 2000,
            progress: None,
            categories: CategoryPass::default(),
            category_rules: Arc::from(Vec::new()),
        }
    }
}

/// Replays one trace. `index` is its position among the traces being merged (0 for one).
pub fn replay(trace: &Trace, index: u32, opts: &ReplayOptions) -> Profile {
    replay_split(trace, index, opts, Split::Windows(windows::WINDOW_EVENTS))
        .expect("a replay in windows falls back to the one merge")
}

/// How [`replay_split`] divides the work. The figures never depend on it; tests compare.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// Windows of time of about this many memory events each, or the one merge where the
    /// windows cannot stand for it.
    Windows(u64),
    /// Windows only: `None` where the replay would fall back.
    WindowsOnly(u64),
    /// The one merge on one thread beside a parallel per-stack pass.
    OneMerge,
}

/// [`replay`], with the work divided as `split` says.
#[doc(hidden)]
pub fn replay_split(
    trace: &Trace,
    index: u32,
    opts: &ReplayOptions,
    split: Split,
) -> Option<Profile> {
    let (stacks, timeline) = match split {
        Split::OneMerge => one_merge(trace, opts),
        Split::Windows(n) | Split::WindowsOnly(n) => {
            match windows::replay(
                trace,
                opts.series_points,
                opts.progress.as_deref(),
                n.max(1),
            ) {
                Some((timeline, stacks)) => (stacks, timeline),
                None if matches!(split, Split::WindowsOnly(_)) => return None,
                // The windows counted every chunk already; counting them again would take the
                // bar past its total.
                None => one_merge(
                    trace,
                    &ReplayOptions {
                        progress: None,
                        ..opts.clone()
                    },
                ),
            }
        }
    };
    Some(assemble(trace, index, opts, stacks, timeline))
}

/// The per-stack pass (parallel over chunks) beside the one merge (on one thread).
fn one_merge(trace: &Trace, opts: &ReplayOptions) -> (stacks::PerStack, timeline::Timeline) {
    // The progress counts each chunk once: the per-stack pass reports it.
    let (stacks, (timeline, packed_mem)) = rayon::join(
        || stacks::per_stack(trace, true, opts.progress.as_deref()),
        || timeline::in_time_order_folding(trace, opts.series_points, Vec::new(), 0, true, None),
    );
    (stacks.merge(packed_mem), timeline)
}

/// The profile from the passes' results (and, with `live_at_peak`, one more walk).
fn assemble(
    trace: &Trace,
    index: u32,
    opts: &ReplayOptions,
    stacks: stacks::PerStack,
    timeline: timeline::Timeline,
) -> Profile {
    let progress = opts.progress.as_deref();
    let before = progress.map(|p| p.load(Ordering::Relaxed));
    // The categories' walk goes through every memory event and passes the peak: it gives the
    // live bytes there too, so the walk to the peak is needed only without it.
    let walked = wants_categories(trace, opts).then(|| {
        categories::categories(
            trace,
            timeline.peak_ordinal(),
            &opts.category_rules,
            progress,
        )
    });
    let live: HashMap<u32, u64> = match (&walked, timeline.peak_ordinal()) {
        (Some(w), _) if opts.live_at_peak => w.live_at_peak.clone(),
        (None, Some(peak)) if opts.live_at_peak => {
            timeline::in_time_order(trace, 0, vec![peak], usize::MAX, progress)
                .snapshots
                .pop()
                .map(|s| s.stacks.into_iter().collect())
                .unwrap_or_default()
        }
        _ => HashMap::new(),
    };
    // The walk to the peak stops there (or never runs): what it left unread still counts, so
    // that the progress ends at its total.
    if let (Some(p), Some(before), true) = (progress, before, opts.live_at_peak || walked.is_some())
    {
        let walked = p.load(Ordering::Relaxed).saturating_sub(before);
        p.fetch_add(mem_bytes(trace).saturating_sub(walked), Ordering::Relaxed);
    }
    let (events, last_ticks) = (stacks.events, stacks.last_ticks);
    let tree = stacks::build_tree(
        trace,
        index,
        &stacks.into_map(),
        &live,
        &raised::raised(trace),
    );
    let end_ticks = trace.footer.map_or(last_ticks, |f| f.end_ticks);
    let source = Source {
        path: trace.path.display().to_string(),
        rank: trace.header.rank,
        events,
        duration_ns: trace.ns_since_start(end_ticks),
        sealed: trace.footer.is_some(),
        dropped_events: trace.footer.map_or(0, |f| f.dropped_events),
        torn_chunks: trace.torn_chunks() + trace.decode_failures().len(),
        warnings: trace
            .warnings
            .iter()
            .chain(&trace.decode_failures())
            .map(|w| w.to_string())
            .collect(),
        pool: timeline.pool(trace),
        epochs: timeline.epochs(trace, end_ticks),
        series: timeline.series(trace),
        memory: Memory::of(&trace.defs.devices),
        categories: walked.map(|w| w.figures),
        device_peaks: timeline.device_peaks(trace),
        prediction: Predicted::of(&trace.defs.devices),
    };
    Profile {
        sources: vec![source],
        tree,
    }
}

/// Rounding of malloc sizes, per device id (the pool rounds to the device's allocation unit):
/// what every pass that reports `mem_size` uses.
pub struct Units([u64; 256]);

impl Units {
    pub fn of(trace: &Trace) -> Units {
        let mut u = [DEFAULT_UNIT; 256];
        for d in &trace.defs.devices {
            if let Some(slot) = u.get_mut(d.id as usize) {
                *slot = d.allocation_unit.max(1);
            }
        }
        Units(u)
    }

    #[inline]
    pub fn mem_size(&self, device: u8, size: u64) -> u64 {
        let unit = self.0[device as usize];
        if unit.is_power_of_two() {
            // Every real unit is a power of two; a mask spares a 64-bit division per event.
            let mask = unit - 1;
            size.saturating_add(mask) & !mask
        } else {
            size.div_ceil(unit).saturating_mul(unit)
        }
    }
}

/// CuPy's allocation unit, for devices a damaged trace never defined.
const DEFAULT_UNIT: u64 = 512;
