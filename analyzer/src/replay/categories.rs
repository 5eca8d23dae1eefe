//! Bytes by memory category and by module: one more time-ordered walk over a trace's memory
//! events (the replay's merge, so its used bytes and its peak are the replay's), with the calls
//! of its link scopes opened and closed in between.
//!
//! - A **category** is the innermost `Label` frame of an allocation's stack (PyTorch's
//!   `parameter`, `activation`, ...). The walk tracks live blocks (the [`Timeline`]'s tracking)
//!   and the live bytes of each category: their value at the used peak (so the categories add
//!   up to it), each category's own highest, and at the end.
//! - A **module** is a chain of link frames (`Sequential` → `Linear`). A link scope event is one
//!   completed call, written when it closed, with its duration: its opening is known only then.
//!   The walk still sees each call open in time: scope chunks are loaded in the order of the
//!   earliest call they hold (found by a first read of the scope chunks), and their calls wait
//!   in a heap by opening time. A chunk is loaded when the walk reaches its earliest call, so
//!   the calls held are those of the chunks whose calls are open now: memory stays bounded by
//!   the nesting of calls, not by the trace's length. For each open call the walk keeps the
//!   live bytes when it opened and the highest since (a stack of running maxima, one per open
//!   call, only the newest updated per event); at its close it has the call's before, after and
//!   peak, exact.
//!
//! An event at the tick a call opened or closed counts inside the call.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use poolsight_schema::fb;
use rustc_hash::FxHashMap;

use super::merge::{walk, Sink};
use super::profile::{signed, CallBytes, CategoryBytes, CategoryFigures, Frame, ModuleBytes};
use super::stacks::frame_of;
use super::timeline::{Live, Timeline};
use super::{CategoryRule, Units};
use crate::read::names::FrameKind;
use crate::read::{ChunkKind, Trace};

/// Whether a trace labels its allocations: then `report` shows their categories.
pub(super) fn has_labels(trace: &Trace) -> bool {
    has_frames(trace, FrameKind::Label)
}

/// Whether a trace has link scopes (modules).
pub(super) fn has_links(trace: &Trace) -> bool {
    has_frames(trace, FrameKind::Link)
}

fn has_frames(trace: &Trace, kind: FrameKind) -> bool {
    trace
        .defs
        .frames
        .values()
        .any(|f| FrameKind::from(f.kind) == kind)
}

/// What the walk gives: the figures, and the bytes live at the peak by stack (what the
/// replay's walk to the peak gives, for the tree).
pub(super) struct Walked {
    pub(super) figures: CategoryFigures,
    pub(super) live_at_peak: HashMap<u32, u64>,
}

/// The walk (see the module documentation); `peak` is the merge ordinal of the memory event
/// that reached the used peak (the replay's).
pub(super) fn categories(
    trace: &Trace,
    peak: Option<u64>,
    rules: &[CategoryRule],
    progress: Option<&AtomicU64>,
) -> Walked {
    let mut w = Walk {
        tl: Timeline::new(
            trace.header.ticks0,
            0,
            peak.into_iter().collect(),
            usize::MAX,
        ),
        units: Units::of(trace),
        classes: Classes::new(trace, rules),
        live: Vec::new(),
        max: Vec::new(),
        at_peak: None,
        calls: LinkCalls::new(trace),
        module_seen: Vec::new(),
    };
    walk(trace, &mut w, progress);
    let used = w.tl.ledger.used;
    w.calls.finish(used);
    w.figures(trace)
}

/// The category and module of a stack.
#[derive(Debug, Clone, Copy)]
pub(super) struct Class {
    /// Index into [`Classes::categories`]; 0 is "no label".
    pub(super) category: u32,
    /// Index into [`Classes::modules`]; `None` outside every module.
    pub(super) module: Option<u32>,
}

/// Stacks classified by category and module, each stack once.
pub(super) struct Classes<'t> {
    trace: &'t Trace,
    rules: &'t [CategoryRule],
    /// Whether a category came from an inferred label (a label frame whose file is
    /// `inferred`: the importer's inference).
    pub(super) inferred: bool,
    of_stack: FxHashMap<u32, Class>,
    /// Category names by index; index 0 (`None`) is the allocations without a label.
    pub(super) categories: Vec<Option<Arc<str>>>,
    /// Per category index: what its labels say they were inferred from, other than stacks
    /// (`gradient sizes`: [`poolsight_schema::INFERRED_BY_GRADIENT_LABEL`]).
    pub(super) inferred_from: Vec<Vec<String>>,
    category_index: HashMap<Arc<str>, u32>,
    /// Modules by index: their link frame ids, outermost first.
    pub(super) modules: Vec<Vec<u32>>,
    module_index: HashMap<Vec<u32>, u32>,
}

impl<'t> Classes<'t> {
    pub(super) fn new(trace: &'t Trace, rules: &'t [CategoryRule]) -> Classes<'t> {
        Classes {
            trace,
            rules,
            inferred: false,
            of_stack: FxHashMap::default(),
            categories: vec![None],
            inferred_from: vec![Vec::new()],
            category_index: HashMap::new(),
            modules: Vec::new(),
            module_index: HashMap::new(),
        }
    }

    /// The category and module of an interned stack. Its chain is followed from the innermost
    /// frame; a damaged chain (a parent at or above its child, an undefined stack) ends there.
    pub(super) fn of(&mut self, stack: u32) -> Class {
        if let Some(&c) = self.of_stack.get(&stack) {
            return c;
        }
        let defs = &self.trace.defs;
        let mut label: Option<u32> = None;
        let mut links: Vec<u32> = Vec::new();
        let mut frames: Vec<u32> = Vec::new();
        let mut cur = stack;
        while let Some(&(parent, frame)) = defs.stacks.get(&cur) {
            if !self.rules.is_empty() {
                frames.push(frame);
            }
            match defs.frames.get(&frame).map(|f| FrameKind::from(f.kind)) {
                Some(FrameKind::Label) if label.is_none() => label = Some(frame),
                Some(FrameKind::Link) => links.push(frame),
                _ => {}
            }
            if parent >= cur {
                break;
            }
            cur = parent;
        }
        links.reverse();
        // User rules first (the first rule matching any frame), then the label.
        let ruled: Option<Arc<str>> = self.rules.iter().find_map(|r| {
            frames
                .iter()
                .any(|&f| r.pattern.is_match(&frame_of(self.trace, f).key()))
                .then(|| Arc::clone(&r.name))
        });
        let mut from: Option<String> = None;
        let named: Option<Arc<str>> = ruled.or_else(|| {
            label.map(|frame| {
                let f = frame_of(self.trace, frame);
                self.inferred |= poolsight_schema::is_inferred_label(&f.file);
                from = f.file.strip_prefix("inferred from ").map(str::to_string);
                f.name
            })
        });
        let category = match named {
            Some(name) => match self.category_index.get(&name) {
                Some(&i) => i,
                None => {
                    let i = self.categories.len() as u32;
                    self.categories.push(Some(Arc::clone(&name)));
                    self.inferred_from.push(Vec::new());
                    self.category_index.insert(name, i);
                    i
                }
            },
            None => 0,
        };
        if let Some(from) = from {
            let seen = &mut self.inferred_from[category as usize];
            if !seen.contains(&from) {
                seen.push(from);
            }
        }
        let module = (!links.is_empty()).then(|| self.module(links));
        let c = Class { category, module };
        self.of_stack.insert(stack, c);
        c
    }

    /// The index of the module whose link frames are `links`.
    pub(super) fn module(&mut self, links: Vec<u32>) -> u32 {
        if let Some(&i) = self.module_index.get(&links) {
            return i;
        }
        let i = self.modules.len() as u32;
        self.modules.push(links.clone());
        self.module_index.insert(links, i);
        i
    }

    /// The module and every module that called it, innermost first.
    pub(super) fn with_callers(&mut self, module: u32) -> Vec<u32> {
        let links = self.modules[module as usize].clone();
        (1..=links.len())
            .rev()
            .map(|n| self.module(links[..n].to_vec()))
            .collect()
    }

    /// A module's link frames.
    pub(super) fn path(&self, module: u32) -> Vec<Frame> {
        self.modules[module as usize]
            .iter()
            .map(|&f| frame_of(self.trace, f))
            .collect()
    }
}

/// A call of a link scope: when it opened and closed, and its stack.
type Call = (u64, u64, u32);

/// One open call (see the module documentation).
struct OpenCall {
    serial: u64,
    stack: u32,
    begin: u64,
    end: u64,
    before: i64,
    /// The highest live bytes from its opening until the next open call opened (the newest:
    /// until now).
    max: i64,
}

/// A link stack's calls so far, and the one with the highest peak.
#[derive(Default)]
struct Calls {
    calls: u64,
    first: u64,
    peak: Option<(u64, u64, i64, i64, i64)>,
}

/// The calls of link scopes, opened and closed in time (see the module documentation).
struct LinkCalls<'t> {
    trace: &'t Trace,
    /// Scope chunks holding link calls, latest earliest-call first: the next to load is last.
    pending: Vec<(u64, usize)>,
    /// Calls of loaded chunks not open yet, by opening tick.
    to_open: BinaryHeap<Reverse<Call>>,
    /// Open calls by closing tick, with their serial.
    to_close: BinaryHeap<Reverse<(u64, u64)>>,
    /// Open calls, in the order they opened.
    open: Vec<OpenCall>,
    serial: u64,
    is_link: FxHashMap<u32, bool>,
    by_stack: FxHashMap<u32, Calls>,
}

impl<'t> LinkCalls<'t> {
    fn new(trace: &'t Trace) -> LinkCalls<'t> {
        let mut c = LinkCalls {
            trace,
            pending: Vec::new(),
            to_open: BinaryHeap::new(),
            to_close: BinaryHeap::new(),
            open: Vec::new(),
            serial: 0,
            is_link: FxHashMap::default(),
            by_stack: FxHashMap::default(),
        };
        for (i, chunk) in trace.chunks.iter().enumerate() {
            if chunk.kind != ChunkKind::Scope {
                continue;
            }
            let earliest = c.calls_of(i).map(|(begin, _, _)| begin).min();
            if let Some(begin) = earliest {
                c.pending.push((begin, i));
            }
        }
        c.pending.sort_unstable_by(|a, b| b.cmp(a));
        c
    }

    /// The link calls of chunk `i` (a scope chunk).
    fn calls_of(&mut self, i: usize) -> impl Iterator<Item = Call> + '_ {
        let trace = self.trace;
        let is_link = &mut self.is_link;
        trace
            .scope_timeline(&trace.chunks[i])
            .filter_map(move |(end, e)| {
                let stack = e.stack();
                let link = *is_link.entry(stack).or_insert_with(|| {
                    let defs = &trace.defs;
                    defs.stacks
                        .get(&stack)
                        .and_then(|(_, f)| defs.frames.get(f))
                        .is_some_and(|f| FrameKind::from(f.kind) == FrameKind::Link)
                });
                link.then(|| (end.saturating_sub(e.duration()), end, stack))
            })
    }

    /// Opens the calls that opened at or before `ticks` and closes those that closed before
    /// it, in time order (an opening first at equal ticks); `used` is the live bytes now.
    fn advance(&mut self, ticks: u64, used: i64) {
        loop {
            while let Some(&(begin, i)) = self.pending.last() {
                if begin > ticks {
                    break;
                }
                self.pending.pop();
                let calls: Vec<Call> = self.calls_of(i).collect();
                self.to_open.extend(calls.into_iter().map(Reverse));
            }
            let open = self.to_open.peek().map(|r| r.0 .0).filter(|&b| b <= ticks);
            let close = self.to_close.peek().map(|r| r.0 .0).filter(|&e| e < ticks);
            match (open, close) {
                (Some(b), Some(e)) if b <= e => self.open_next(used),
                (Some(_), None) => self.open_next(used),
                (_, Some(_)) => self.close_next(used),
                (None, None) => return,
            }
        }
    }

    fn open_next(&mut self, used: i64) {
        let Some(Reverse((begin, end, stack))) = self.to_open.pop() else {
            return;
        };
        self.serial += 1;
        self.to_close.push(Reverse((end, self.serial)));
        self.open.push(OpenCall {
            serial: self.serial,
            stack,
            begin,
            end,
            before: used,
            max: used,
        });
    }

    fn close_next(&mut self, used: i64) {
        let Some(Reverse((_, serial))) = self.to_close.pop() else {
            return;
        };
        let Some(at) = self.open.iter().rposition(|c| c.serial == serial) else {
            return;
        };
        let peak = self.open[at..].iter().map(|c| c.max).max().unwrap_or(used);
        let call = self.open.remove(at);
        // The calls opened before it now run their maxima through its stretch too.
        if let Some(prev) = at.checked_sub(1).and_then(|i| self.open.get_mut(i)) {
            prev.max = prev.max.max(call.max);
        }
        let calls = self.by_stack.entry(call.stack).or_default();
        if calls.calls == 0 {
            calls.first = call.begin;
        }
        calls.calls += 1;
        if calls.peak.is_none_or(|p| peak > p.4) {
            calls.peak = Some((call.begin, call.end, call.before, used, peak));
        }
    }

    /// Live bytes changed to `used`: the newest open call's maximum follows.
    #[inline]
    fn used(&mut self, used: i64) {
        if let Some(c) = self.open.last_mut() {
            c.max = c.max.max(used);
        }
    }

    /// Opens and closes every call left (the trace's last memory event is behind).
    fn finish(&mut self, used: i64) {
        self.advance(u64::MAX, used);
        // Calls closing at the last tick there is (only in a damaged trace).
        while !self.to_close.is_empty() {
            self.close_next(used);
        }
    }
}

/// The walk's sink: the replay's live-block tracking, plus categories and calls.
struct Walk<'t> {
    tl: Timeline,
    units: Units,
    classes: Classes<'t>,
    /// Live bytes by category index, and each one's highest (bytes, ticks).
    live: Vec<i64>,
    max: Vec<(i64, u64)>,
    /// `live` right after the peak's event.
    at_peak: Option<Vec<i64>>,
    calls: LinkCalls<'t>,
    /// First tick each module was seen at (called or allocated under), by module index.
    module_seen: Vec<u64>,
}

impl Walk<'_> {
    fn add(&mut self, stack: u32, bytes: i64, ticks: u64) {
        let class = self.classes.of(stack);
        let c = class.category as usize;
        if self.live.len() <= c {
            self.live.resize(c + 1, 0);
            self.max.resize(c + 1, (i64::MIN, 0));
        }
        self.live[c] = self.live[c].saturating_add(bytes);
        if bytes > 0 {
            if self.live[c] > self.max[c].0 {
                self.max[c] = (self.live[c], ticks);
            }
            if let Some(m) = class.module {
                self.seen(m, ticks);
            }
        }
    }

    fn seen(&mut self, module: u32, ticks: u64) {
        let m = module as usize;
        if self.module_seen.len() <= m {
            self.module_seen.resize(m + 1, u64::MAX);
        }
        self.module_seen[m] = self.module_seen[m].min(ticks);
    }

    fn figures(mut self, trace: &Trace) -> Walked {
        let live_at_peak: HashMap<u32, u64> = self
            .tl
            .snapshots
            .first()
            .map(|s| s.stacks.iter().copied().collect())
            .unwrap_or_default();
        let at_peak = self.at_peak.take().unwrap_or_default();
        let nonneg = |v: i64| v.max(0) as u64;
        let mut categories: Vec<CategoryBytes> = (0..self.live.len())
            .filter(|&c| self.max[c].0 > i64::MIN)
            .map(|c| CategoryBytes {
                name: self.classes.categories[c].as_deref().map(str::to_string),
                at_peak_bytes: nonneg(at_peak.get(c).copied().unwrap_or(0)),
                max_bytes: nonneg(self.max[c].0),
                max_ns: trace.ns_since_start(self.max[c].1),
                at_end_bytes: nonneg(self.live[c]),
                inferred_from: self.classes.inferred_from[c].clone(),
            })
            .collect();
        // The allocations without a label (index 0) last.
        if categories.first().is_some_and(|c| c.name.is_none()) {
            categories.rotate_left(1);
        }

        // Calls, by module: a module's stacks differ by the frames above it (a call site).
        let mut calls: Vec<(u32, Calls)> = std::mem::take(&mut self.calls.by_stack)
            .into_iter()
            .collect();
        calls.sort_unstable_by_key(|(stack, _)| *stack);
        let mut by_module: FxHashMap<u32, Calls> = FxHashMap::default();
        for (stack, c) in calls {
            let Some(m) = self.classes.of(stack).module else {
                continue;
            };
            self.seen(m, c.first);
            let into = by_module.entry(m).or_default();
            into.calls += c.calls;
            if let Some(p) = c.peak {
                let better = match into.peak {
                    None => true,
                    Some(q) => (p.4, Reverse(p.0)) > (q.4, Reverse(q.0)),
                };
                if better {
                    into.peak = Some(p);
                }
            }
        }
        let mut live_by_module: FxHashMap<u32, u64> = FxHashMap::default();
        let mut live: Vec<(u32, u64)> = live_at_peak.iter().map(|(&s, &b)| (s, b)).collect();
        live.sort_unstable();
        for (stack, bytes) in live {
            if let Some(m) = self.classes.of(stack).module {
                for m in self.classes.with_callers(m) {
                    let e = live_by_module.entry(m).or_default();
                    *e = e.saturating_add(bytes);
                }
            }
        }
        // Callers of a module seen are seen no later than it.
        for m in 0..self.classes.modules.len() as u32 {
            let first = self
                .module_seen
                .get(m as usize)
                .copied()
                .unwrap_or(u64::MAX);
            for caller in self.classes.with_callers(m) {
                self.seen(caller, first);
            }
        }
        let mut order: Vec<u32> = (0..self.classes.modules.len() as u32)
            .filter(|m| {
                by_module.contains_key(m)
                    || live_by_module.contains_key(m)
                    || self
                        .module_seen
                        .get(*m as usize)
                        .is_some_and(|&t| t < u64::MAX)
            })
            .collect();
        let path_len = |c: &Classes, m: u32| c.modules[m as usize].len();
        order.sort_by_key(|&m| {
            (
                self.module_seen
                    .get(m as usize)
                    .copied()
                    .unwrap_or(u64::MAX),
                path_len(&self.classes, m),
                m,
            )
        });
        let modules = order
            .into_iter()
            .map(|m| {
                let c = by_module.remove(&m).unwrap_or_default();
                ModuleBytes {
                    path: self.classes.path(m),
                    calls: c.calls,
                    peak_call: c.peak.map(|(begin, end, before, after, peak)| CallBytes {
                        begin_ns: trace.ns_since_start(begin),
                        end_ns: trace.ns_since_start(end),
                        before_bytes: before,
                        after_bytes: after,
                        peak_bytes: peak,
                    }),
                    live_at_peak_bytes: live_by_module.get(&m).copied().unwrap_or(0),
                }
            })
            .collect();
        Walked {
            figures: CategoryFigures {
                categories,
                modules,
                inferred: self.classes.inferred,
            },
            live_at_peak,
        }
    }
}

impl Sink for Walk<'_> {
    #[inline]
    fn mem(&mut self, ticks: u64, e: &fb::MemEvent) -> bool {
        self.calls.advance(ticks, self.tl.ledger.used);
        let taken = self.tl.snapshots.len();
        match self.tl.mem(ticks, e, &self.units, true) {
            Some(Live::Added {
                stack,
                size,
                replaced,
            }) => {
                // As the tracking does: a pointer handed out twice counts once.
                if let Some((old, old_stack)) = replaced {
                    self.add(old_stack, -signed(old), ticks);
                }
                self.add(stack, signed(size), ticks);
            }
            Some(Live::Removed { stack, size }) => self.add(stack, -signed(size), ticks),
            Some(Live::Moved { from, to, size }) => {
                self.add(from, -signed(size), ticks);
                self.add(to, signed(size), ticks);
            }
            None => {}
        }
        self.calls.used(self.tl.ledger.used);
        if self.tl.snapshots.len() > taken && self.at_peak.is_none() {
            self.at_peak = Some(self.live.clone());
        }
        true
    }

    fn mark(&mut self, m: &fb::MarkEvent) {
        self.tl.mark(m)
    }
}
