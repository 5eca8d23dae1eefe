//! The events a conversion produces, and how they are written: one poolsight trace through
//! the recorder, with the other tool's timestamps (ns from the run's first event).

use std::path::Path;

use poolsight_recorder::{
    ClockSource, Frame, FrameKind, ImportInfo, MarkKind, MemKind, MemRecord, Phase, Recorder,
    RecorderConfig,
};
use rustc_hash::FxHashMap;

use crate::device::pytorch_device;
use crate::frames::FrameFilter;
use crate::ImportError;

/// A stack of [`Events`] (`NONE`: no stack).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Stack(pub u32);

impl Stack {
    pub const NONE: Stack = Stack(u32::MAX);
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvKind {
    Malloc,
    Free,
    FreeRequested,
    Acquire,
    Release,
    Oom,
    Snapshot,
    Annotation,
    EpochBegin,
    EpochEnd,
    /// A scope that began at `addr` (ns) and ends at the event's time.
    Scope,
}

/// One event. Fields by kind: memory events use all but `text`; marks use `device` and
/// `text`/`addr`; scopes `addr` (their start) and `stack`.
#[derive(Debug, Clone)]
pub struct Ev {
    pub kind: EvKind,
    pub device: u32,
    pub stream: u32,
    pub addr: u64,
    pub bytes: u64,
    pub extra: u64,
    pub stack: Stack,
    pub text: Option<Box<str>>,
}

impl Ev {
    pub fn mem(kind: EvKind, device: u32, stream: u32, addr: u64, bytes: u64, stack: Stack) -> Ev {
        Ev {
            kind,
            device,
            stream,
            addr,
            bytes,
            extra: 0,
            stack,
            text: None,
        }
    }

    pub fn oom(device: u32, stream: u32, requested: u64, device_free: u64, stack: Stack) -> Ev {
        Ev {
            extra: device_free,
            ..Ev::mem(EvKind::Oom, device, stream, 0, requested, stack)
        }
    }

    pub fn snapshot(device: u32) -> Ev {
        Ev::mem(EvKind::Snapshot, device, 0, 0, 0, Stack::NONE)
    }

    pub fn annotation(device: u32, addr: u64, text: String) -> Ev {
        Ev {
            text: Some(text.into()),
            ..Ev::mem(EvKind::Annotation, device, 0, addr, 0, Stack::NONE)
        }
    }

    pub fn epoch(begin: bool, n: u32) -> Ev {
        let kind = if begin {
            EvKind::EpochBegin
        } else {
            EvKind::EpochEnd
        };
        Ev::mem(kind, n, 0, 0, 0, Stack::NONE)
    }

    pub fn scope(start_ns: u64, stack: Stack) -> Ev {
        Ev::mem(EvKind::Scope, 0, 0, start_ns, 0, stack)
    }
}

/// `ProfilerStep#N` -> N.
pub fn step_number(name: &str) -> Option<u32> {
    name.strip_prefix("ProfilerStep#")?.parse().ok()
}

/// Everything a conversion produced, ready to write.
pub struct Events {
    pub filter: FrameFilter,
    /// Events live from the start (at time 0, before every other).
    initial: Vec<Ev>,
    /// (ns, event), in the order pushed; written stably sorted by time.
    timed: Vec<(u64, Ev)>,
    /// Every distinct frame of the stacks.
    frames: Vec<Frame>,
    frame_ids: FxHashMap<Frame, u32>,
    /// The frames of each stack, outermost first, as indices of `frames`.
    stacks: Vec<Box<[u32]>>,
    stack_ids: FxHashMap<Box<[u32]>, Stack>,
    pub entries: u64,
    pub overflowed: bool,
    pub unmapped: Vec<String>,
    pub devices: Vec<u32>,
    /// The device that is host memory (a profiler trace's CPU); every other is a CUDA device.
    pub cpu_device: Option<u32>,
    /// That device's name (`cpu`; `pinned` for a snapshot's pinned host memory).
    pub cpu_name: &'static str,
    /// The events observe PyTorch's allocator from outside, with no segments (a profiler
    /// trace): each block is acquired when allocated and released when freed, as
    /// `poolsight.torch.track()` records it.
    pub observed: bool,
    /// Time of the last entry (ns).
    pub end: u64,
    pub unix_start_ns: u64,
    /// What a snapshot says of its allocator (settings, segments at its end), read in the same
    /// pass as its entries, for a model that replays the run (`poolsight whatif`).
    pub allocator: Option<crate::settings::AllocatorState>,
}

/// The label frame of a block whose allocation the trace does not hold.
pub const BEFORE_TRACE: &str = "<allocated before the trace: stack of its free>";

impl Events {
    pub fn new(filter: FrameFilter) -> Events {
        Events {
            filter,
            initial: Vec::new(),
            timed: Vec::new(),
            frames: Vec::new(),
            frame_ids: FxHashMap::default(),
            stacks: Vec::new(),
            stack_ids: FxHashMap::default(),
            entries: 0,
            overflowed: false,
            unmapped: Vec::new(),
            devices: Vec::new(),
            cpu_device: None,
            cpu_name: "cpu",
            observed: false,
            end: 0,
            unix_start_ns: 0,
            allocator: None,
        }
    }

    /// Adds an event at `ns`; at 0 for an event that was so from the start (it goes before
    /// the events the trace recorded at 0).
    pub fn push(&mut self, ns: u64, e: Ev) {
        self.timed.push((ns, e));
    }

    /// How many timed events were pushed: the index the next one gets.
    pub fn timed_len(&self) -> usize {
        self.timed.len()
    }

    /// Gives the timed event pushed `index`-th another stack (a label known only once every
    /// event was read: an inferred category).
    pub fn restack(&mut self, index: usize, stack: Stack) {
        if let Some((_, e)) = self.timed.get_mut(index) {
            e.stack = stack;
        }
    }

    pub fn push_initial(&mut self, e: Ev) {
        self.initial.push(e);
    }

    pub fn len(&self) -> usize {
        self.initial.len() + self.timed.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The stack of `frames` (outermost first).
    pub fn intern(&mut self, frames: Vec<Frame>) -> Stack {
        let ids: Vec<u32> = frames.into_iter().map(|f| self.frame(f)).collect();
        self.stack(&ids)
    }

    /// The id of a frame, for [`Events::stack`].
    pub fn frame(&mut self, frame: Frame) -> u32 {
        if let Some(&id) = self.frame_ids.get(&frame) {
            return id;
        }
        let id = self.frames.len() as u32;
        self.frames.push(frame.clone());
        self.frame_ids.insert(frame, id);
        id
    }

    /// The stack of frames given by their ids ([`Events::frame`]), outermost first.
    pub fn stack(&mut self, frames: &[u32]) -> Stack {
        if frames.is_empty() {
            return Stack::NONE;
        }
        if let Some(&s) = self.stack_ids.get(frames) {
            return s;
        }
        let s = Stack(self.stacks.len() as u32);
        self.stacks.push(frames.into());
        self.stack_ids.insert(frames.into(), s);
        s
    }

    /// The stack of `s`'s frames with `frame` innermost.
    pub fn with_frame(&mut self, s: Stack, frame: Frame) -> Stack {
        let mut ids: Vec<u32> = self
            .stacks
            .get(s.0 as usize)
            .map_or_else(Vec::new, |b| b.to_vec());
        ids.push(self.frame(frame));
        self.stack(&ids)
    }

    /// The frames of a stack, outermost first.
    pub fn frames_of(&self, s: Stack) -> impl Iterator<Item = &Frame> + '_ {
        let ids = self.stacks.get(s.0 as usize).map_or(&[][..], |b| &b[..]);
        ids.iter().filter_map(|&f| self.frames.get(f as usize))
    }

    /// How many distinct stacks there are.
    pub fn stack_count(&self) -> usize {
        self.stacks.len()
    }

    /// Writes the events as a poolsight trace at `out`.
    pub fn write(
        mut self,
        out: &Path,
        info: ImportInfo,
        overwrite: bool,
        rank: Option<u32>,
        world_size: Option<u32>,
        file_time_ns: u64,
    ) -> Result<WriteSummary, ImportError> {
        let mut devices = std::mem::take(&mut self.devices);
        devices.sort_unstable();
        devices.dedup();
        let config = RecorderConfig {
            devices: devices
                .iter()
                .map(|&id| {
                    let cpu = self.cpu_device == Some(id);
                    let kind = if cpu { "cpu" } else { "cuda" };
                    let mut d = pytorch_device(id, kind, Some(id), self.observed);
                    if cpu {
                        d.name = self.cpu_name.to_owned();
                    }
                    d
                })
                .collect(),
            // The same for every rank of a job, so that they merge as one run's.
            command_line: Some(vec!["poolsight".into(), "import".into(), info.kind.clone()]),
            clock: ClockSource::Explicit {
                unix_ns: if self.unix_start_ns > 0 {
                    self.unix_start_ns
                } else {
                    // A snapshot's clock is not wall-clock time: its run is taken to end when
                    // the file was written (which also tells two snapshots apart).
                    file_time_ns.saturating_sub(self.end)
                },
            },
            import: Some(info),
            overwrite,
            rank,
            world_size: world_size.or(rank.map(|r| r + 1)),
            ..RecorderConfig::default()
        };
        let rec = Recorder::create(out, config)?;
        let h = rec.handle();
        let ids = h.intern_stacks(&self.frames, &self.stacks);
        let stack_id = |s: Stack| ids.get(s.0 as usize).copied().unwrap_or(0);
        let mut strings: FxHashMap<Box<str>, u32> = FxHashMap::default();
        self.timed.sort_by_key(|(t, _)| *t);
        // Scopes are written at their end, in order of their ends.
        let mut scopes: Vec<(u64, u64, u32)> = Vec::new();
        let mut end = self.end;
        let mut held: i128 = 0;
        let mut events = 0u64;
        let initial = std::mem::take(&mut self.initial);
        let timed = std::mem::take(&mut self.timed);
        for (t, e) in initial.into_iter().map(|e| (0, e)).chain(timed) {
            end = end.max(t);
            events += 1;
            let mem = |kind: MemKind, ptr: u64, bytes: u64, stack: u32| MemRecord {
                ptr,
                bytes,
                stack,
                ..MemRecord::new(kind, e.device, e.stream)
            };
            match e.kind {
                EvKind::Malloc => h.record_mem_at(
                    mem(MemKind::MallocPost, e.addr, e.bytes, stack_id(e.stack)),
                    t,
                ),
                EvKind::Free => h.record_mem_at(mem(MemKind::FreePost, e.addr, e.bytes, 0), t),
                EvKind::FreeRequested => {
                    h.record_mem_at(mem(MemKind::FreeRequested, e.addr, e.bytes, 0), t)
                }
                EvKind::Acquire => {
                    held += e.bytes as i128;
                    // A served allocation needs a pointer; held-from-the-start memory has none.
                    h.record_mem_at(
                        mem(
                            MemKind::AllocPost,
                            e.addr.max(1),
                            e.bytes,
                            stack_id(e.stack),
                        ),
                        t,
                    )
                }
                EvKind::Release => {
                    held -= e.bytes as i128;
                    h.record_mem_at(mem(MemKind::Release, e.addr, e.bytes, 0), t)
                }
                EvKind::Oom => {
                    let held = held.clamp(0, u64::MAX as i128) as u64;
                    h.record_mem_at(
                        mem(MemKind::OutOfMemory, held, e.bytes, stack_id(e.stack)),
                        t,
                    );
                    h.record_mark_at(MarkKind::DeviceFree, e.device, e.extra, e.bytes, t);
                    events += 1;
                }
                EvKind::Snapshot => h.record_mark_at(MarkKind::Snapshot, e.device, 0, 0, t),
                EvKind::Annotation => {
                    let text = e.text.unwrap_or_default();
                    let id = match strings.get(&text) {
                        Some(&id) => id,
                        None => {
                            let id = h.intern_string(&text);
                            strings.insert(text, id);
                            id
                        }
                    };
                    h.record_mark_at(MarkKind::Annotation, id, e.addr, e.device as u64, t);
                }
                EvKind::EpochBegin => h.record_mark_at(MarkKind::EpochBegin, e.device, 0, 0, t),
                EvKind::EpochEnd => h.record_mark_at(MarkKind::EpochEnd, e.device, 0, 0, t),
                EvKind::Scope => scopes.push((t, e.addr, stack_id(e.stack))),
            }
        }
        scopes.sort_by_key(|s| s.0);
        for (t, start, stack) in scopes {
            h.record_scope_at(stack, start, t);
        }
        drop(h);
        let summary = rec.finish_at(end)?;
        Ok(WriteSummary {
            events,
            file_bytes: summary.file_bytes,
            dropped: summary.dropped_events,
        })
    }
}

/// A memory category (PyTorch's `parameter`, `activation`, ...) as the innermost frame of an
/// allocation's stack: a label, as `poolsight.torch.track()` writes it.
pub fn label(name: &str) -> Frame {
    Frame {
        kind: FrameKind::Label,
        phase: Phase::None,
        file: String::new(),
        line: 0,
        name: name.to_owned(),
    }
}

/// The outermost frame of a block live from the start ([`BEFORE_TRACE`]): a scope with no file,
/// not a label, so that it is no memory category.
pub fn before_trace() -> Frame {
    Frame {
        kind: FrameKind::Scope,
        phase: Phase::None,
        file: String::new(),
        line: 0,
        name: BEFORE_TRACE.to_owned(),
    }
}

/// The frame of a segment held from before the trace began (a snapshot's segment that no
/// entry acquired): the stack of its acquisition at the start, so that a replay of the
/// allocator (`whatif --check`) tells it from the segments the trace recorded.
pub const HELD_BEFORE: &str = "<held before the trace>";

/// The frame [`HELD_BEFORE`] names: a scope with no file.
pub fn held_before() -> Frame {
    Frame {
        name: HELD_BEFORE.to_owned(),
        ..before_trace()
    }
}

/// What [`Events::write`] wrote.
#[derive(Debug, Clone, Copy)]
pub struct WriteSummary {
    pub events: u64,
    pub file_bytes: u64,
    pub dropped: u64,
}
