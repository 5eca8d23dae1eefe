//! `record_function` ranges (`external_annotations`): function scopes that prefix the stacks of
//! what was allocated in them; `ProfilerStep#N` ranges are epochs.

use rustc_hash::FxHashMap;

use super::entries::{Entry, Made, Tables, NONE};
use super::Unmapped;
use crate::events::{Ev, Events};
use crate::pickle::{Store, Value};
use poolsight_recorder::{Frame, FrameKind, Phase};

/// A `record_function` range of `external_annotations`: a function scope (a phase).
#[derive(Debug, Clone)]
pub(super) struct Range {
    pub(super) device: u32,
    pub(super) start: u64,
    pub(super) end: u64,
    pub(super) name: String,
}

/// One `record_function` annotation, whichever way the snapshot holds it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Annotation<'s> {
    pub(super) name: Option<&'s str>,
    pub(super) stage: &'s str,
    pub(super) time_us: Option<u64>,
    pub(super) device: u32,
}

/// `external_annotations` (PyTorch 2.5 and later): `{name, stage: START|END, device,
/// time_us}`.
pub(super) fn external<'s>(s: &'s Store<Made>, a: Value<Made>) -> Vec<Annotation<'s>> {
    s.items(a)
        .iter()
        .map(|&x| Annotation {
            name: s.get(x, "name").and_then(|v| s.str(v)),
            stage: s.get(x, "stage").and_then(|v| s.str(v)).unwrap_or(""),
            time_us: s.get(x, "time_us").and_then(|v| v.u64()),
            device: s
                .get(x, "device")
                .and_then(|v| v.u64())
                .unwrap_or(0)
                .min(255) as u32,
        })
        .collect()
}

/// A `user_defined` trace entry of a device's trace (PyTorch 2.4, before annotations moved to
/// `external_annotations`): its one frame names the range as its `filename` and the stage as
/// its `name` (`{name: "START", filename: "## forward ##", line: 0}`).
pub(super) fn user_defined<'s>(
    t: &Tables,
    s: &'s Store<Made>,
    e: &Entry,
    device: u32,
) -> Annotation<'s> {
    let frame = t
        .lists
        .get(e.frames as usize)
        .and_then(|l| l.first())
        .and_then(|&f| t.frames.get(f as usize));
    let text = |id: u32| (id != NONE).then(|| s.text(id));
    Annotation {
        name: frame.and_then(|k| text(k.file)),
        stage: frame.and_then(|k| text(k.name)).unwrap_or(""),
        time_us: e.time_us,
        device,
    }
}

/// `record_function` ranges from their annotations, in time order. `ProfilerStep#N` ranges
/// become epochs; other ranges are returned, to become function scopes, each START paired
/// with the next END of its name (a START never ended runs to the end of the trace); an END
/// without its START is a mark.
pub(super) fn read_annotations(
    annotations: &[Annotation],
    t0_us: u64,
    ev: &mut Events,
    unmapped: &mut Unmapped,
) -> Vec<Range> {
    let mut ranges: Vec<Range> = Vec::new();
    let mut open: FxHashMap<(u32, String), Vec<usize>> = FxHashMap::default();
    for a in annotations {
        let (stage, device) = (a.stage, a.device);
        let (Some(name), Some(time)) = (a.name, a.time_us) else {
            unmapped.add("record_function annotations without a name or time");
            continue;
        };
        let t = time.saturating_sub(t0_us).saturating_mul(1000);
        match (crate::events::step_number(name), stage) {
            (Some(n), "START") => ev.push(t, Ev::epoch(true, n)),
            (Some(n), "END") => ev.push(t, Ev::epoch(false, n)),
            (None, "START") => {
                open.entry((device, name.to_owned()))
                    .or_default()
                    .push(ranges.len());
                ranges.push(Range {
                    device,
                    start: t,
                    end: u64::MAX,
                    name: name.to_owned(),
                });
            }
            (None, "END") => match open
                .get_mut(&(device, name.to_owned()))
                .and_then(|v| v.pop())
            {
                Some(i) => ranges[i].end = t.max(ranges[i].start),
                None => ev.push(t, Ev::annotation(device, 0, format!("END {name}"))),
            },
            _ => ev.push(
                t,
                Ev::annotation(device, 0, format!("{stage} {name}").trim().to_owned()),
            ),
        }
    }
    ranges.sort_by_key(|r| r.start);
    ranges
}

/// The ranges open at each moment of one device's entries (times never go back), as a prefix
/// of function frames for the stacks of the allocations made in them; each range is also
/// written as a function scope when [`Phases::finish`] is called.
pub(super) struct Phases {
    /// (start, end, frame id, the stack of the range itself), by start.
    pub(super) ranges: Vec<(u64, u64, u32, Vec<u32>)>,
    /// Per range: whether it is an optimizer's ([`crate::infer::is_optimizer_range`]).
    pub(super) optimizer: Vec<bool>,
    pub(super) next: usize,
    pub(super) open: Vec<usize>,
    pub(super) prefix: Vec<u32>,
}

impl Phases {
    pub(super) fn new(ranges: &[Range], device: u32, only_device: bool, ev: &mut Events) -> Phases {
        let mut out: Vec<(u64, u64, u32, Vec<u32>)> = Vec::new();
        let mut optimizer = Vec::new();
        for r in ranges.iter().filter(|r| only_device || r.device == device) {
            optimizer.push(crate::infer::is_optimizer_range(&r.name));
            let frame = ev.frame(Frame {
                kind: FrameKind::Function,
                phase: Phase::None,
                file: poolsight_schema::RANGE_FILE.to_owned(),
                line: 0,
                name: r.name.clone(),
            });
            // Its own stack: the ranges it lies in, outermost first, then itself.
            let mut stack: Vec<u32> = out
                .iter()
                .filter(|o| o.0 <= r.start && r.end <= o.1)
                .map(|o| o.2)
                .collect();
            stack.push(frame);
            out.push((r.start, r.end, frame, stack));
        }
        Phases {
            ranges: out,
            optimizer,
            next: 0,
            open: Vec::new(),
            prefix: Vec::new(),
        }
    }

    /// Whether no range is open at any time (then phases are inferred: [`super::phases`]).
    pub(super) fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Back to the first entry, for a second pass.
    pub(super) fn rewind(&mut self) {
        self.next = 0;
        self.open.clear();
        self.prefix.clear();
    }

    /// The frames of the ranges open at `t` (start <= t <= end), outermost first.
    pub(super) fn at(&mut self, t: u64) -> &[u32] {
        let before = self.open.len();
        let mut changed = false;
        self.open.retain(|&i| self.ranges[i].1 >= t);
        changed |= self.open.len() != before;
        while self.next < self.ranges.len() && self.ranges[self.next].0 <= t {
            if self.ranges[self.next].1 >= t {
                self.open.push(self.next);
                changed = true;
            }
            self.next += 1;
        }
        if changed {
            self.prefix.clear();
            self.prefix
                .extend(self.open.iter().map(|&i| self.ranges[i].2));
        }
        &self.prefix
    }

    /// Whether an optimizer's range is open (as of the last [`Phases::at`]).
    pub(super) fn in_optimizer_step(&self) -> bool {
        self.open.iter().any(|&i| self.optimizer[i])
    }

    /// Writes each range as a function scope (a range never ended ends with the trace).
    pub(super) fn finish(self, ev: &mut Events, end: u64) {
        for (start, stop, _, stack) in self.ranges {
            let stack = ev.stack(&stack);
            let stop = if stop == u64::MAX { end } else { stop };
            ev.push(stop.max(start), Ev::scope(start, stack));
        }
    }
}
