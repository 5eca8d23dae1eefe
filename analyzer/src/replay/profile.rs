//! The profile model: what a replay produces and every report reads. A calling-context tree
//! of counters ([`CallTree`] of [`Agg`]) and each trace's own figures ([`Source`]: the pool,
//! epochs, the used-bytes series).

use std::sync::Arc;

use serde::Serialize;

use crate::read::names::{FrameKind, Phase};
use crate::read::{DeviceDef, Trace};
use poolsight_schema::kinds::DeviceKind;

/// When something was first seen: (index of the trace among those merged, ns since its start).
/// Comparing these orders rows by trace first, then by time, deterministically.
pub type Seen = (u32, u64);
pub const NEVER: Seen = (u32::MAX, u64::MAX);

/// One frame of a calling context: `file:line:name`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Frame {
    pub kind: FrameKind,
    pub phase: Phase,
    pub file: Arc<str>,
    pub line: u32,
    pub name: Arc<str>,
}

impl Frame {
    /// A frame of `kind` at `file:line` named `name`, outside any phase.
    pub fn new(kind: FrameKind, file: &str, line: u32, name: &str) -> Frame {
        Frame {
            kind,
            phase: Phase::None,
            file: file.into(),
            line,
            name: name.into(),
        }
    }

    fn root() -> Frame {
        Frame {
            kind: FrameKind::Unknown,
            phase: Phase::None,
            file: "".into(),
            line: 0,
            name: "_root".into(),
        }
    }

    /// `file:line:name`, the stable key of a frame across traces.
    pub fn key(&self) -> String {
        format!("{}:{}:{}", self.file, self.line, self.name)
    }
}

/// Counters of one calling context (its own events, not its callees').
///
/// The per-stack pass of a replay counts in the trace's own clock: there `time_ns` and the
/// times of `first_mem` and `first_exit` are ticks (trace index 0), until [`Agg::in_ns`]
/// converts them for the tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Agg {
    /// Pool malloc requests whose stack is exactly this context, failed ones included:
    /// Chainer's `CupyMemoryCumulativeHook.malloc_preprocess` and CuPy's
    /// `LineProfileHook.malloc_preprocess` count a request before it succeeds or fails.
    pub mallocs: u64,
    /// Their `mem_size` sum.
    pub used_bytes: u64,
    /// Device allocation attempts (pool misses, each out-of-memory retry included: Chainer's
    /// `alloc_preprocess`) attributed to this context.
    pub allocs: u64,
    pub acquired_bytes: u64,
    /// Of `mallocs` and `used_bytes`: the requests that failed (pointer 0, size above 0).
    pub failed_mallocs: u64,
    pub failed_used_bytes: u64,
    /// Of `acquired_bytes`: the device attempts that failed.
    pub failed_acquired_bytes: u64,
    /// Closed scopes whose innermost frame is this node.
    pub calls: u64,
    pub time_ns: u64,
    /// First malloc or alloc here.
    pub first_mem: Seen,
    /// First scope exit here (Chainer appends a call to its history when the call ends).
    pub first_exit: Seen,
    /// Bytes allocated here still live at the pool's peak (with `ReplayOptions::live_at_peak`).
    pub live_at_peak_bytes: u64,
    /// Calls of this node's scope that raised, and what they allocated in the whole subtree
    /// meanwhile (in a node's `total`, summed over the subtree's raised calls).
    pub raised: Raised,
}

/// What the calls of one scope that did not complete (a `ScopeAbort` mark: they raised)
/// allocated between their open and their close, nested calls included: the functions table
/// leaves it out of that function's row, as Chainer never sees such a call return, while the
/// enclosing calls keep it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Raised {
    pub calls: u64,
    pub used_bytes: u64,
    pub acquired_bytes: u64,
    pub failed_used_bytes: u64,
    pub failed_acquired_bytes: u64,
    /// Of the bytes: those no function inside the call allocated (its exclusive part), which
    /// goes to the innermost function around it.
    pub self_used_bytes: u64,
    pub self_acquired_bytes: u64,
}

impl Raised {
    pub fn add(&mut self, o: &Raised) {
        self.calls += o.calls;
        self.used_bytes = self.used_bytes.saturating_add(o.used_bytes);
        self.acquired_bytes = self.acquired_bytes.saturating_add(o.acquired_bytes);
        self.failed_used_bytes = self.failed_used_bytes.saturating_add(o.failed_used_bytes);
        self.failed_acquired_bytes = self
            .failed_acquired_bytes
            .saturating_add(o.failed_acquired_bytes);
        self.self_used_bytes = self.self_used_bytes.saturating_add(o.self_used_bytes);
        self.self_acquired_bytes = self
            .self_acquired_bytes
            .saturating_add(o.self_acquired_bytes);
    }
}

impl Default for Agg {
    fn default() -> Self {
        Agg {
            mallocs: 0,
            used_bytes: 0,
            allocs: 0,
            acquired_bytes: 0,
            failed_mallocs: 0,
            failed_used_bytes: 0,
            failed_acquired_bytes: 0,
            calls: 0,
            time_ns: 0,
            first_mem: NEVER,
            first_exit: NEVER,
            live_at_peak_bytes: 0,
            raised: Raised::default(),
        }
    }
}

impl Agg {
    /// Times counted in `trace`'s ticks converted to ns since its start, first-seen times
    /// tagged with the trace's `index` among those merged.
    pub(super) fn in_ns(self, trace: &Trace, index: u32) -> Agg {
        let seen = |(_, ticks): Seen| {
            if ticks == u64::MAX {
                NEVER
            } else {
                (index, trace.ns_since_start(ticks))
            }
        };
        Agg {
            time_ns: trace.ticks_to_ns(self.time_ns),
            first_mem: seen(self.first_mem),
            first_exit: seen(self.first_exit),
            ..self
        }
    }

    pub(super) fn add(&mut self, o: &Agg) {
        self.mallocs += o.mallocs;
        self.used_bytes = self.used_bytes.saturating_add(o.used_bytes);
        self.allocs += o.allocs;
        self.acquired_bytes = self.acquired_bytes.saturating_add(o.acquired_bytes);
        self.failed_mallocs += o.failed_mallocs;
        self.failed_used_bytes = self.failed_used_bytes.saturating_add(o.failed_used_bytes);
        self.failed_acquired_bytes = self
            .failed_acquired_bytes
            .saturating_add(o.failed_acquired_bytes);
        self.calls += o.calls;
        self.time_ns = self.time_ns.saturating_add(o.time_ns);
        self.first_mem = self.first_mem.min(o.first_mem);
        self.first_exit = self.first_exit.min(o.first_exit);
        self.live_at_peak_bytes = self.live_at_peak_bytes.saturating_add(o.live_at_peak_bytes);
        self.raised.add(&o.raised);
    }
}

/// A node of the calling-context tree.
#[derive(Debug, Clone)]
pub struct Node {
    pub frame: Frame,
    /// Index of the parent (the root is its own parent).
    pub parent: usize,
    /// In first-seen order: by first malloc in the subtree, then first scope exit, then frame.
    pub children: Vec<usize>,
    pub agg: Agg,
    /// `agg` summed over the subtree (first-seen: minimum over it).
    pub total: Agg,
}

/// The calling-context tree: node 0 is `_root`, every recorded stack a path from it.
#[derive(Debug, Clone)]
pub struct CallTree {
    pub nodes: Vec<Node>,
}

impl Default for CallTree {
    fn default() -> Self {
        CallTree {
            nodes: vec![Node {
                frame: Frame::root(),
                parent: 0,
                children: Vec::new(),
                agg: Agg::default(),
                total: Agg::default(),
            }],
        }
    }
}

impl CallTree {
    pub fn root(&self) -> &Node {
        &self.nodes[0]
    }

    pub(super) fn child(&mut self, parent: usize, frame: &Frame) -> usize {
        if let Some(&c) = self.nodes[parent]
            .children
            .iter()
            .find(|&&c| self.nodes[c].frame == *frame)
        {
            return c;
        }
        let id = self.nodes.len();
        self.nodes.push(Node {
            frame: frame.clone(),
            parent,
            children: Vec::new(),
            agg: Agg::default(),
            total: Agg::default(),
        });
        self.nodes[parent].children.push(id);
        id
    }

    /// Adds every node of `other` (a tree of another trace) into this one, matching by frame.
    pub fn merge(&mut self, other: &CallTree) {
        let mut map = vec![0usize; other.nodes.len()];
        // Parents come before children in `nodes` of a finished tree (DFS order).
        for (i, n) in other.nodes.iter().enumerate() {
            let at = if i == 0 {
                0
            } else {
                self.child(map[n.parent], &n.frame)
            };
            map[i] = at;
            let agg = n.agg;
            self.nodes[at].agg.add(&agg);
        }
        self.finish();
    }

    /// Computes subtree totals, orders children, and renumbers nodes in DFS order.
    pub(super) fn finish(&mut self) {
        for i in (0..self.nodes.len()).rev() {
            let mut total = self.nodes[i].agg;
            for &c in &self.nodes[i].children {
                total.add(&self.nodes[c].total);
            }
            self.nodes[i].total = total;
        }
        let nodes = &self.nodes;
        let mut order: Vec<Vec<usize>> = nodes.iter().map(|n| n.children.clone()).collect();
        for ch in order.iter_mut() {
            ch.sort_by(|&a, &b| {
                let (a, b) = (&nodes[a], &nodes[b]);
                (a.total.first_mem, a.total.first_exit, &a.frame).cmp(&(
                    b.total.first_mem,
                    b.total.first_exit,
                    &b.frame,
                ))
            });
        }
        // Renumber in DFS preorder so that parents precede children and a walk is a scan.
        let mut new_id = vec![usize::MAX; nodes.len()];
        let mut dfs = Vec::with_capacity(nodes.len());
        let mut stack = vec![0usize];
        while let Some(i) = stack.pop() {
            new_id[i] = dfs.len();
            dfs.push(i);
            stack.extend(order[i].iter().rev());
        }
        let mut out = Vec::with_capacity(dfs.len());
        for &old in &dfs {
            let n = &nodes[old];
            out.push(Node {
                frame: n.frame.clone(),
                parent: new_id[n.parent],
                children: order[old].iter().map(|&c| new_id[c]).collect(),
                agg: n.agg,
                total: n.total,
            });
        }
        self.nodes = out;
    }

    /// Depth-first preorder walk: (node index, depth), the root at depth 0.
    pub fn walk(&self) -> Vec<(usize, usize)> {
        let mut out = Vec::with_capacity(self.nodes.len());
        let mut stack = vec![(0usize, 0usize)];
        while let Some((i, d)) = stack.pop() {
            out.push((i, d));
            for &c in self.nodes[i].children.iter().rev() {
                stack.push((c, d + 1));
            }
        }
        out
    }

    /// Frames from the root's child down to `i`.
    pub fn path(&self, mut i: usize) -> Vec<&Frame> {
        let mut out = Vec::new();
        while i != 0 {
            out.push(&self.nodes[i].frame);
            i = self.nodes[i].parent;
        }
        out.reverse();
        out
    }
}

/// The pool's figures over the whole trace, exact from its events.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PoolFigures {
    pub peak_used_bytes: u64,
    pub peak_used_ns: u64,
    pub peak_acquired_bytes: u64,
    pub peak_acquired_ns: u64,
    pub used_at_end_bytes: i64,
    pub acquired_at_end_bytes: i64,
    pub mallocs: u64,
    pub frees: u64,
    pub device_allocs: u64,
    pub releases: u64,
    pub out_of_memory: u64,
}

/// One epoch as recorded: absolute figures at its boundaries, fastai's deltas are computed by
/// the `epochs` report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EpochFigures {
    pub epoch: u32,
    pub begin_ns: u64,
    pub end_ns: u64,
    /// False when the trace ended before the epoch did (then `end` is the trace's end).
    pub complete: bool,
    /// Live bytes (handed out by the pool) at the epoch's begin and end, and their maximum.
    pub gpu_begin_bytes: i64,
    pub gpu_end_bytes: i64,
    pub gpu_max_bytes: i64,
    /// Bytes the pool held from the device (cached blocks included: what NVML reports to
    /// fastai) at the epoch's begin and end, and their maximum, exact from the events.
    pub held_begin_bytes: i64,
    pub held_end_bytes: i64,
    pub held_max_bytes: i64,
    pub cpu_begin_bytes: u64,
    pub cpu_end_bytes: u64,
    pub cpu_peak_bytes: u64,
}

/// Used and acquired bytes over time, at most `series_points` buckets of equal width, each
/// holding the maximum reached in it (so no peak falls between two points).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Series {
    pub bucket_ns: f64,
    /// (ns at bucket start, max used bytes, max acquired bytes)
    pub points: Vec<(u64, i64, i64)>,
    /// Per point, the merge ordinal of the memory event that first reached its used maximum
    /// (what [`crate::replay::live_over_time`] takes its snapshots after).
    #[serde(skip)]
    pub used_max_ordinals: Vec<u64>,
}

/// What memory a trace's events are about, from its devices (format 1.4's `DeviceDef.kind` and
/// `observed`): the words the reports use for it. A trace that does not say (an older file, a
/// pool over the simulated host device) is spoken of as a GPU pool, as before 1.4.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Memory {
    pub kind: MemoryKind,
    /// No pool of poolsight's: the events observe an allocator from outside (PyTorch's), each
    /// block acquired when allocated and released when freed, so held bytes are live bytes.
    pub observed: bool,
}

/// The memory of every device of a trace (or of several merged traces).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryKind {
    /// Not said: a GPU pool, in the words reports used before format 1.4.
    #[default]
    Unspecified,
    Cpu,
    Gpu,
    /// Devices of both kinds (their bytes add up in one series).
    CpuAndGpu,
}

impl Memory {
    /// The memory of `devices`: unspecified if any device does not say (or there is none),
    /// observed only if every device is.
    pub fn of(devices: &[DeviceDef]) -> Memory {
        let kinds = devices.iter().map(|d| match d.kind {
            DeviceKind::Cpu => MemoryKind::Cpu,
            DeviceKind::Gpu => MemoryKind::Gpu,
            DeviceKind::Unspecified => MemoryKind::Unspecified,
        });
        Memory::combine(devices.iter().zip(kinds).map(|(d, kind)| Memory {
            kind,
            observed: d.observed,
        }))
    }

    /// The memory of several traces (or devices) together.
    pub fn combine(all: impl IntoIterator<Item = Memory>) -> Memory {
        let mut out: Option<Memory> = None;
        for m in all {
            out = Some(match out {
                None => m,
                Some(o) => Memory {
                    kind: match (o.kind, m.kind) {
                        (MemoryKind::Unspecified, _) | (_, MemoryKind::Unspecified) => {
                            MemoryKind::Unspecified
                        }
                        (a, b) if a == b => a,
                        _ => MemoryKind::CpuAndGpu,
                    },
                    observed: o.observed && m.observed,
                },
            });
        }
        match out {
            Some(m) if m.kind != MemoryKind::Unspecified => m,
            _ => Memory::default(),
        }
    }

    /// Whether the trace says nothing of its memory: reports keep their pre-1.4 words.
    pub fn unspecified(&self) -> bool {
        self.kind == MemoryKind::Unspecified
    }

    /// What the live bytes are, in a sentence: `CPU memory`, `GPU memory`, `CPU and GPU
    /// memory`, or `device memory` when the trace does not say.
    pub fn what(&self) -> &'static str {
        match self.kind {
            MemoryKind::Unspecified => "device memory",
            MemoryKind::Cpu => "CPU memory",
            MemoryKind::Gpu => "GPU memory",
            MemoryKind::CpuAndGpu => "CPU and GPU memory",
        }
    }

    /// Where a pool takes its memory from, in a sentence: `the device`, or `host memory` for
    /// a pool over CPU memory.
    pub fn pool_source(&self) -> &'static str {
        match self.kind {
            MemoryKind::Cpu => "host memory",
            _ => "the device",
        }
    }

    /// The first word of the `epochs` table's device columns (`gpu used`, `peak`): fastai's
    /// `gpu` where the memory is a GPU's (or not said), `tensor` for memory observed from
    /// outside on the CPU, `pool` for a pool over CPU memory.
    pub fn epoch_column(&self) -> &'static str {
        match (self.kind, self.observed) {
            (MemoryKind::Unspecified | MemoryKind::Gpu, _) => "gpu",
            (_, true) => "tensor",
            (_, false) => "pool",
        }
    }
}

/// Bytes by memory category and by module, from one more time-ordered walk over a trace's
/// memory events with its link scopes' calls in between (`replay/categories.rs`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CategoryFigures {
    /// Every category something was allocated under, in the order of their first allocation,
    /// the allocations without a label last.
    pub categories: Vec<CategoryBytes>,
    /// Every module (a chain of link frames) that was called or allocated under, in the order
    /// first seen, a module before the modules it calls.
    pub modules: Vec<ModuleBytes>,
    /// The categories were inferred (labels written by an importer's inference, not recorded).
    pub inferred: bool,
}

/// One memory category's live bytes: a category is the innermost `Label` frame of an
/// allocation's stack (PyTorch's `parameter`, `activation`, ...).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CategoryBytes {
    /// `None`: allocations whose stack has no label.
    pub name: Option<String>,
    /// Live at the moment of the trace's peak of live bytes (the categories add up to it).
    pub at_peak_bytes: u64,
    /// The category's own highest live bytes, and when (ns since the trace's start).
    pub max_bytes: u64,
    pub max_ns: u64,
    /// Live when the trace ends.
    pub at_end_bytes: u64,
    /// What some of its labels were inferred from other than their stacks (`gradient sizes`:
    /// blocks live from the start matched one to one by gradients).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub inferred_from: Vec<String>,
}

/// One module's calls and bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModuleBytes {
    /// Its link frames, outermost first: the module and the modules that called it.
    #[serde(skip)]
    pub path: Vec<Frame>,
    /// Its completed calls (link scope events whose innermost frame is its own).
    pub calls: u64,
    /// Of those, the call whose peak of live bytes was highest (the first of equal ones).
    pub peak_call: Option<CallBytes>,
    /// Bytes allocated under it (its submodules included) still live at the trace's peak.
    pub live_at_peak_bytes: u64,
}

/// One call's live bytes, the trace's whole (every thread and category): as it began, as it
/// ended, and the highest in between (exact, from the events).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CallBytes {
    pub begin_ns: u64,
    pub end_ns: u64,
    pub before_bytes: i64,
    pub after_bytes: i64,
    pub peak_bytes: i64,
}

/// One replayed trace's own figures.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Source {
    pub path: String,
    pub rank: Option<u32>,
    pub events: u64,
    pub duration_ns: u64,
    /// Whether the writer sealed the file (false: killed, crashed or still running).
    pub sealed: bool,
    /// Events the writer counted as dropped (its footer's figure).
    pub dropped_events: u64,
    /// Chunks lost to torn or corrupt writes.
    pub torn_chunks: usize,
    pub warnings: Vec<String>,
    pub pool: PoolFigures,
    pub epochs: Vec<EpochFigures>,
    pub series: Series,
    /// What memory its events are about.
    pub memory: Memory,
    /// Bytes by memory category and by module, when the replay computed them
    /// ([`crate::replay::ReplayOptions::categories`]).
    pub categories: Option<CategoryFigures>,
    /// Each device's own peak of live bytes, for every device that had blocks (with one, it is
    /// the pool's peak).
    pub device_peaks: Vec<DevicePeak>,
    /// Set when the events are a prediction (format 1.7, `poolsight.torch.fake_cuda`): what
    /// the predicted device says, and the bytes its allocator may hold.
    pub prediction: Option<Predicted>,
}

/// A predicted device of a trace (`DeviceDef.prediction`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Predicted {
    #[serde(flatten)]
    pub prediction: crate::read::Prediction,
    /// The bytes the caching allocator may hold on it (its total less the CUDA context).
    pub capacity_bytes: u64,
}

impl Predicted {
    /// The first predicted device of `devices`.
    pub fn of(devices: &[DeviceDef]) -> Option<Predicted> {
        devices.iter().find_map(|d| {
            d.prediction.as_ref().map(|p| Predicted {
                prediction: p.clone(),
                capacity_bytes: d.capacity,
            })
        })
    }

    /// The line reports begin with: what was predicted, for which GPU, by what.
    pub fn line(&self) -> String {
        let p = &self.prediction;
        let model = if p.model.is_empty() || p.model == p.gpu {
            String::new()
        } else {
            format!(" ({})", p.model)
        };
        format!(
            "prediction: a CUDA run on {}{model}, made without a GPU by {}; \
             the allocator may hold {} of its {}",
            p.gpu,
            if p.made_by.is_empty() {
                "fake_cuda"
            } else {
                &p.made_by
            },
            binary_bytes(self.capacity_bytes),
            binary_bytes(p.total_bytes),
        )
    }
}

/// Bytes in binary units with two decimals, as `poolsight predict` says them: `512 B`,
/// `17.25 MiB`, `79.19 GiB`.
pub fn binary_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if b < 1024 {
        return format!("{b} B");
    }
    let mut v = b as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.2} {}", UNITS[u])
}

/// One device's own peak of live bytes, exact from the events in time order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DevicePeak {
    pub device: u32,
    pub name: String,
    /// `gpu`, `cpu` or `unspecified` (a pool's device).
    pub kind: &'static str,
    pub peak_used_bytes: u64,
    pub peak_used_ns: u64,
    pub used_at_end_bytes: i64,
}

/// Everything the reports need, from one trace or merged from several (ranks of one job).
#[derive(Debug, Clone)]
pub struct Profile {
    pub sources: Vec<Source>,
    pub tree: CallTree,
}

impl Profile {
    /// Merges profiles of several traces (in the given order) into one.
    pub fn merge(parts: Vec<Profile>) -> Profile {
        let mut it = parts.into_iter();
        let Some(mut first) = it.next() else {
            return Profile {
                sources: Vec::new(),
                tree: CallTree::default(),
            };
        };
        for p in it {
            first.tree.merge(&p.tree);
            first.sources.extend(p.sources);
        }
        first
    }

    /// What memory the merged traces' events are about.
    pub fn memory(&self) -> Memory {
        Memory::combine(self.sources.iter().map(|s| s.memory))
    }

    /// What the first predicted trace predicted (`None`: the traces are recordings).
    pub fn prediction(&self) -> Option<&Predicted> {
        self.sources.iter().find_map(|s| s.prediction.as_ref())
    }

    /// Wall time of the longest of the merged traces.
    pub fn duration_ns(&self) -> u64 {
        self.sources
            .iter()
            .map(|s| s.duration_ns)
            .max()
            .unwrap_or(0)
    }
}

/// A byte count or other figure from the file as a signed figure (running totals, deltas):
/// values past `i64::MAX` (8 EiB), which only a damaged trace holds, saturate instead of
/// wrapping.
#[inline]
pub fn signed(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(kind: DeviceKind, observed: bool) -> DeviceDef {
        DeviceDef {
            id: 0,
            name: String::new(),
            capacity: 0,
            allocation_unit: 1,
            kind,
            observed,
            prediction: None,
        }
    }

    #[test]
    fn the_memory_of_devices_is_said_only_when_every_device_says_it() {
        let of = |ds: &[DeviceDef]| Memory::of(ds);
        assert_eq!(of(&[]), Memory::default());
        let cpu = Memory {
            kind: MemoryKind::Cpu,
            observed: true,
        };
        assert_eq!(of(&[device(DeviceKind::Cpu, true)]), cpu);
        assert_eq!(
            of(&[device(DeviceKind::Cpu, true), device(DeviceKind::Gpu, true)]),
            Memory {
                kind: MemoryKind::CpuAndGpu,
                observed: true
            }
        );
        assert_eq!(
            of(&[
                device(DeviceKind::Gpu, false),
                device(DeviceKind::Gpu, true)
            ]),
            Memory {
                kind: MemoryKind::Gpu,
                observed: false
            }
        );
        // One device that does not say makes the whole unspecified (pre-1.4 words).
        assert_eq!(
            of(&[
                device(DeviceKind::Cpu, true),
                device(DeviceKind::Unspecified, false)
            ]),
            Memory::default()
        );
        assert_eq!(Memory::combine([cpu, Memory::default()]), Memory::default());
        assert_eq!(Memory::combine([cpu, cpu]), cpu);
    }
}
