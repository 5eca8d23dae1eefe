//! PyTorch CUDA memory snapshots (`torch.cuda.memory._dump_snapshot`, OOM dumps) into
//! poolsight events, one rule at a time (docs/pytorch-files.md lists them):
//!
//! - `alloc` is a malloc of `size` bytes with its frames as the stack; `free_completed` is its
//!   free; `free_requested` is kept as [`MemKind::FreeRequested`] (the block waits for other
//!   streams; used bytes drop at the completion, as in PyTorch's viewer).
//! - `segment_alloc`/`segment_map` acquire device memory, `segment_free`/`segment_unmap`
//!   release it; segments held at the end that the trace does not account for were held from
//!   the start.
//! - `oom` is an out-of-memory of `size` bytes plus a `device_free` mark; `snapshot` and
//!   `annotate` are marks; external annotations named `ProfilerStep#N` are epochs.
//! - A free of an address never allocated in the trace, and a block `active_allocated` in
//!   `segments` that no entry allocated (at its `requested_size`), were live from the start:
//!   PyTorch's viewer (`MemoryViz.js`, `process_alloc_data`) counts them so, and the peaks
//!   agree with it.
//!
//! The pickle is read in one pass ([`crate::pickle`]) and converted as it is read: each frame
//! dict becomes a frame id as it completes, each list of frames an interned list of ids, each
//! trace entry a row of a table ([`Entry`]). What is kept of the tree is the rest: the
//! segments and their blocks, the lists that hold the entries, the annotations. So reading a
//! snapshot needs memory for its distinct frames and stacks and a row per entry, not for the
//! five million dicts of a large one.

use rustc_hash::FxHashMap;

use crate::events::{before_trace, label as label_frame, Ev, EvKind, Events, Stack};
use crate::frames::FrameFilter;
use crate::infer;
use crate::pickle::{self, Build, Parsed, Progress, Store, StrId, Value};
use crate::ImportError;
use poolsight_recorder::{Frame, FrameKind, Phase};

/// The strings a snapshot's many dicts are recognized by, interned first so that each is a
/// known [`StrId`]: the keys of trace entries and frames, then the actions in
/// [`ACTIONS`]' order.
const KNOWN: [&str; 22] = [
    "action",
    "addr",
    "size",
    "stream",
    "time_us",
    "frames",
    "user_metadata",
    "category",
    "device_free",
    "filename",
    "name",
    "line",
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "oom",
    "snapshot",
    "annotate",
];
const ACTION: StrId = 0;
const ADDR: StrId = 1;
const SIZE: StrId = 2;
const STREAM: StrId = 3;
const TIME_US: StrId = 4;
const FRAMES: StrId = 5;
const USER_METADATA: StrId = 6;
const CATEGORY: StrId = 7;
const DEVICE_FREE: StrId = 8;
const FILENAME: StrId = 9;
const NAME: StrId = 10;
const LINE: StrId = 11;
const FIRST_ACTION: StrId = 12;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Oom,
    Snapshot,
    Annotate,
}

/// The actions, in the order of their names in [`KNOWN`].
const ACTIONS: [Action; 10] = [
    Action::Alloc,
    Action::FreeRequested,
    Action::FreeCompleted,
    Action::SegmentAlloc,
    Action::SegmentFree,
    Action::SegmentMap,
    Action::SegmentUnmap,
    Action::Oom,
    Action::Snapshot,
    Action::Annotate,
];

/// No string, frame list or entry.
const NONE: u32 = u32::MAX;

/// One trace entry, as read.
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// The action, or the name of one this reader does not know (`NONE`: not a string).
    action: Result<Action, StrId>,
    addr: u64,
    size: u64,
    stream: u64,
    time_us: Option<u64>,
    /// Its frames, an index of [`Tables::lists`] (`NONE`: none).
    frames: u32,
    /// Its `user_metadata` string.
    note: StrId,
    /// Its `category` string (profiler snapshots).
    category: StrId,
    device_free: u64,
}

/// A frame, by its strings (`NONE`: absent or not a string, read as `?` and `??`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct FrameKey {
    name: StrId,
    file: StrId,
    line: u32,
}

/// What the reader makes of a complete dict or list of a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Made {
    /// A frame dict (a dict with `filename`): an index of [`Tables::frames`].
    Frame(u32),
    /// A list of frames: an index of [`Tables::lists`].
    Frames(u32),
    /// A trace entry (a dict with `action`): an index of [`Tables::entries`].
    Entry(u32),
}

/// The frames, lists of frames and entries of a snapshot, each distinct frame and list once.
#[derive(Default)]
struct Tables {
    frames: Vec<FrameKey>,
    frame_ids: FxHashMap<FrameKey, u32>,
    lists: Vec<Box<[u32]>>,
    list_ids: FxHashMap<Box<[u32]>, u32>,
    entries: Vec<Entry>,
    scratch: Vec<u32>,
}

impl Build for Tables {
    type Made = Made;

    fn dict(&mut self, s: &Store<Made>, kv: &[Value<Made>]) -> Option<Made> {
        // One pass: a frame's fields are read on the way, in case it is one.
        let mut key = FrameKey {
            name: NONE,
            file: NONE,
            line: 0,
        };
        let mut frame = false;
        for p in kv.chunks_exact(2) {
            match p[0] {
                Value::Str(ACTION) => {
                    let e = self.entry(s, kv);
                    let id = u32::try_from(self.entries.len()).unwrap_or(NONE);
                    self.entries.push(e);
                    return Some(Made::Entry(id));
                }
                Value::Str(FILENAME) => {
                    frame = true;
                    key.file = str_id(p[1]);
                }
                Value::Str(NAME) => key.name = str_id(p[1]),
                Value::Str(LINE) => key.line = line(p[1]),
                _ => {}
            }
        }
        frame.then(|| Made::Frame(self.intern_frame(key)))
    }

    fn list(&mut self, _: &Store<Made>, items: &[Value<Made>]) -> Option<Made> {
        if items.is_empty() {
            return None;
        }
        let mut ids = std::mem::take(&mut self.scratch);
        ids.clear();
        for v in items {
            match v {
                Value::Made(Made::Frame(f)) => ids.push(*f),
                _ => {
                    self.scratch = ids;
                    return None;
                }
            }
        }
        let id = self.intern_list(&ids);
        self.scratch = ids;
        Some(Made::Frames(id))
    }
}

impl Tables {
    fn entry(&mut self, s: &Store<Made>, kv: &[Value<Made>]) -> Entry {
        let mut e = Entry {
            action: Err(NONE),
            addr: 0,
            size: 0,
            stream: 0,
            time_us: None,
            frames: NONE,
            note: NONE,
            category: NONE,
            device_free: 0,
        };
        for p in kv.chunks_exact(2) {
            let (Value::Str(k), v) = (p[0], p[1]) else {
                continue;
            };
            match k {
                ACTION => {
                    let id = str_id(v);
                    e.action = match id.checked_sub(FIRST_ACTION) {
                        Some(i) if (i as usize) < ACTIONS.len() => Ok(ACTIONS[i as usize]),
                        _ => Err(id),
                    };
                }
                ADDR => e.addr = v.u64().unwrap_or(0),
                SIZE => e.size = v.u64().unwrap_or(0),
                STREAM => e.stream = v.u64().unwrap_or(0),
                TIME_US => e.time_us = v.u64(),
                FRAMES => e.frames = self.frames_of(s, v),
                USER_METADATA => e.note = str_id(v),
                CATEGORY => e.category = str_id(v),
                DEVICE_FREE => e.device_free = v.u64().unwrap_or(0),
                _ => {}
            }
        }
        e
    }

    /// A frame dict's `name`, `filename` and `line` as a frame id.
    fn frame(&mut self, kv: &[Value<Made>]) -> u32 {
        let mut key = FrameKey {
            name: NONE,
            file: NONE,
            line: 0,
        };
        for p in kv.chunks_exact(2) {
            match p[0] {
                Value::Str(NAME) => key.name = str_id(p[1]),
                Value::Str(FILENAME) => key.file = str_id(p[1]),
                Value::Str(LINE) => key.line = line(p[1]),
                _ => {}
            }
        }
        self.intern_frame(key)
    }

    fn intern_frame(&mut self, key: FrameKey) -> u32 {
        if let Some(&id) = self.frame_ids.get(&key) {
            return id;
        }
        let id = u32::try_from(self.frames.len()).unwrap_or(NONE);
        self.frames.push(key);
        self.frame_ids.insert(key, id);
        id
    }

    fn intern_list(&mut self, ids: &[u32]) -> u32 {
        if let Some(&id) = self.list_ids.get(ids) {
            return id;
        }
        let id = u32::try_from(self.lists.len()).unwrap_or(NONE);
        self.lists.push(ids.into());
        self.list_ids.insert(ids.into(), id);
        id
    }

    /// The frames of a `frames` value: a list of frames as read, or any other list (an empty
    /// one, or one with items that are not frame dicts: each is a frame with what it has of
    /// `name`, `filename` and `line`). `NONE` for anything but a list.
    fn frames_of(&mut self, s: &Store<Made>, v: Value<Made>) -> u32 {
        match v {
            Value::Made(Made::Frames(id)) => id,
            Value::List(_) => {
                let mut ids = Vec::new();
                for &item in s.items(v) {
                    let id = match item {
                        Value::Made(Made::Frame(f)) => f,
                        Value::Dict(_) => self.frame(s.items(item)),
                        _ => self.frame(&[]),
                    };
                    ids.push(id);
                }
                self.intern_list(&ids)
            }
            _ => NONE,
        }
    }
}

/// The string a value is, or `NONE`.
fn str_id(v: Value<Made>) -> StrId {
    match v {
        Value::Str(id) => id,
        _ => NONE,
    }
}

/// A frame's line number.
fn line(v: Value<Made>) -> u32 {
    v.u64().unwrap_or(0).min(u32::MAX as u64) as u32
}

/// What a value is, for error messages.
fn kind_name(v: Value<Made>) -> &'static str {
    match v {
        Value::Made(Made::Frame(_)) => "a frame (a dict with `filename`)",
        Value::Made(Made::Frames(_)) => "a list of frames",
        Value::Made(Made::Entry(_)) => "a trace entry (a dict with `action`)",
        other => other.kind_name(),
    }
}

/// Counts of what was read but could not be mapped, reported by `info`.
#[derive(Default)]
struct Unmapped(std::collections::BTreeMap<String, u64>);

impl Unmapped {
    fn add(&mut self, what: impl Into<String>) {
        *self.0.entry(what.into()).or_default() += 1;
    }

    fn lines(self) -> Vec<String> {
        self.0
            .into_iter()
            .map(|(k, n)| format!("{k}: {n}"))
            .collect()
    }
}

/// Reads a snapshot pickle into time-ordered events. `progress` is called with the bytes
/// read so far.
pub fn read(
    data: &[u8],
    filter: FrameFilter,
    progress: Option<Progress<'_>>,
) -> Result<Events, ImportError> {
    let mut tables = Tables::default();
    let parsed = pickle::parse(data, &KNOWN, &mut tables, progress)?;
    let allocator = crate::settings::state_of(&parsed.store, parsed.root);
    let mut events = convert(&parsed, tables, filter)?;
    events.allocator = Some(allocator);
    Ok(events)
}

/// The snapshot's events, from its pickle as read.
fn convert(p: &Parsed<Made>, mut t: Tables, filter: FrameFilter) -> Result<Events, ImportError> {
    let (s, root) = (&p.store, p.root);
    let (segments, traces, annotations) = match root {
        Value::Dict(_) => (
            s.get(root, "segments"),
            s.get(root, "device_traces"),
            s.get(root, "external_annotations"),
        ),
        // The oldest snapshots are the list of segments alone (`_memory_viz` reads them so).
        Value::List(_) => (Some(root), None, None),
        _ => {
            return Err(ImportError::NotSnapshot(format!(
                "the pickle holds {}, not a snapshot's dict",
                kind_name(root)
            )))
        }
    };
    if segments.is_none() && traces.is_none() {
        return Err(ImportError::NotSnapshot(
            "the pickle's dict has neither `segments` nor `device_traces`".into(),
        ));
    }
    let mut unmapped = Unmapped::default();
    for (k, v) in s.pairs(root) {
        match s.str(k) {
            Some("segments" | "device_traces" | "external_annotations") => {}
            Some("allocator_settings") => {}
            Some(key @ ("host_segments" | "host_traces")) => {
                let n = s.items(v).len();
                if n > 0 {
                    unmapped
                        .0
                        .insert(format!("{key} (pinned host memory)"), n as u64);
                }
            }
            Some(other) => unmapped.add(format!("snapshot key `{other}`")),
            None => unmapped.add("a snapshot key that is not a string"),
        }
    }
    let mut ev = Events::new(filter);
    let mut stacks = Stacks::new(filter, &t, s);
    let mut streams = StreamIds::default();
    let entries = std::mem::take(&mut t.entries);
    // Per device, its entries.
    let mut devices: Vec<Vec<Entry>> = Vec::new();
    if let Some(traces) = traces {
        expect_list(traces, "device_traces")?;
        for &d in s.items(traces) {
            expect_list(d, "a device trace")?;
            let mut list = Vec::with_capacity(s.items(d).len());
            for &e in s.items(d) {
                let entry = match e {
                    Value::Made(Made::Entry(i)) => entries.get(i as usize),
                    _ => None,
                };
                let Some(entry) = entry else {
                    return Err(ImportError::NotSnapshot(format!(
                        "a device trace holds {}, not a trace entry (a dict with `action`)",
                        kind_name(e)
                    )));
                };
                match entry.action {
                    Ok(_) => list.push(*entry),
                    Err(name) => unmapped.add(format!(
                        "trace entries with action `{}`",
                        if name == NONE { "?" } else { s.text(name) }
                    )),
                }
            }
            devices.push(list);
        }
    }
    drop(entries);
    ev.entries = devices.iter().map(|d| d.len() as u64).sum();
    let has_time = devices.iter().flatten().any(|e| e.time_us.is_some());
    let t0_us = devices
        .iter()
        .flatten()
        .filter_map(|e| e.time_us)
        .min()
        .unwrap_or(0);
    if !has_time && ev.entries > 0 {
        unmapped.0.insert(
            "entries without `time_us` (an older layout): placed 1 µs apart, in trace order".into(),
            ev.entries,
        );
    }
    // Segments by device: their held bytes and live blocks.
    let mut final_reserved: FxHashMap<u32, u64> = FxHashMap::default();
    let mut live_blocks: Vec<(u32, u64, u64, u32, u64)> = Vec::new(); // device, addr, size, frames, stream
    let mut final_segments: Vec<(u32, u64, u64, u64)> = Vec::new(); // device, addr, size, stream
    if let Some(segs) = segments {
        expect_list(segs, "segments")?;
        for &seg in s.items(segs) {
            let Some(blocks) = s.get(seg, "blocks") else {
                return Err(ImportError::NotSnapshot(format!(
                    "`segments` holds {}, not a segment (a dict with `blocks`)",
                    kind_name(seg)
                )));
            };
            let int = |key: &str| s.get(seg, key).and_then(|v| v.u64());
            let device = int("device").unwrap_or(0).min(255) as u32;
            let total = int("total_size").unwrap_or(0);
            let stream = int("stream").unwrap_or(0);
            *final_reserved.entry(device).or_default() += total;
            let mut addr = int("address").unwrap_or(0);
            final_segments.push((device, addr, total, stream));
            for &b in s.items(blocks) {
                let size = s.get(b, "size").and_then(|v| v.u64()).unwrap_or(0);
                let state = s.get(b, "state").and_then(|v| s.str(v)).unwrap_or("");
                if state == "active_allocated" {
                    let (frames, requested) = block_extra(s, &mut t, b, size);
                    live_blocks.push((device, addr, requested, frames, stream));
                }
                addr = addr.wrapping_add(size);
            }
        }
    }
    let ranges = match annotations {
        Some(a) => read_annotations(s, a, t0_us, &mut ev, &mut unmapped),
        None => Vec::new(),
    };
    // Categories are inferred when no entry has one of its own (profiler-made snapshots do).
    let infer = !devices.iter().flatten().any(|e| e.category != NONE);

    // Per device: what the trace leaves live at its end, what was live from the start, and the
    // events in trace order.
    let mut overflowed = false;
    for (dev, entries) in devices.iter().enumerate() {
        let device = dev.min(255) as u32;
        let mut live: FxHashMap<u64, ()> = FxHashMap::default();
        let mut held: FxHashMap<u64, ()> = FxHashMap::default();
        let mut seg_net: i128 = 0;
        // Entries keep the allocator's order; a clock that steps back is held level.
        let mut time_ns = 0u64;
        let times: Vec<u64> = entries
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let t_ns = match e.time_us {
                    Some(t) if has_time => t.saturating_sub(t0_us).saturating_mul(1000),
                    _ => i as u64 * 1000,
                };
                time_ns = time_ns.max(t_ns);
                time_ns
            })
            .collect();
        let mut phases = Phases::new(&ranges, device, devices.len() == 1, &mut ev);
        let inferred = if infer {
            infer_categories(entries, &times, &t, s, &mut phases)
        } else {
            Vec::new()
        };
        phases.rewind();
        let mut allocs = 0usize;
        for (i, e) in entries.iter().enumerate() {
            let Ok(action) = e.action else { continue };
            let time_ns = times[i];
            let stream = streams.id(e.stream);
            let prefix = phases.at(time_ns);
            match action {
                Action::Alloc => {
                    live.insert(e.addr, ());
                    let label = match inferred.get(allocs) {
                        Some(name) => Label::Inferred(name),
                        None => Label::of(e.category),
                    };
                    allocs += 1;
                    let stack = stacks.get(&mut ev, &t, s, e.frames, label, false, prefix);
                    ev.push(
                        time_ns,
                        Ev::mem(EvKind::Malloc, device, stream, e.addr, e.size, stack),
                    );
                }
                Action::FreeRequested => {
                    ev.push(
                        time_ns,
                        Ev::mem(
                            EvKind::FreeRequested,
                            device,
                            stream,
                            e.addr,
                            e.size,
                            Stack::NONE,
                        ),
                    );
                }
                Action::FreeCompleted => {
                    if live.remove(&e.addr).is_none() {
                        // Allocated before the trace began (or before the ring's oldest entry).
                        overflowed = true;
                        let label = match infer {
                            true => Label::Inferred(infer::BEFORE_RECORDING),
                            false => Label::of(e.category),
                        };
                        let stack = stacks.get(&mut ev, &t, s, e.frames, label, true, &[]);
                        ev.push_initial(Ev::mem(
                            EvKind::Malloc,
                            device,
                            stream,
                            e.addr,
                            e.size,
                            stack,
                        ));
                    }
                    ev.push(
                        time_ns,
                        Ev::mem(EvKind::Free, device, stream, e.addr, e.size, Stack::NONE),
                    );
                }
                Action::SegmentAlloc | Action::SegmentMap => {
                    seg_net += e.size as i128;
                    held.insert(e.addr, ());
                    ev.push(
                        time_ns,
                        Ev::mem(EvKind::Acquire, device, stream, e.addr, e.size, Stack::NONE),
                    );
                }
                Action::SegmentFree | Action::SegmentUnmap => {
                    seg_net -= e.size as i128;
                    held.remove(&e.addr);
                    ev.push(
                        time_ns,
                        Ev::mem(EvKind::Release, device, stream, e.addr, e.size, Stack::NONE),
                    );
                }
                Action::Oom => {
                    let stack = stacks.get(&mut ev, &t, s, e.frames, Label::None, false, prefix);
                    ev.push(
                        time_ns,
                        Ev::oom(device, stream, e.size, e.device_free, stack),
                    );
                }
                Action::Snapshot => ev.push(time_ns, Ev::snapshot(device)),
                Action::Annotate => {
                    let text = if e.note == NONE { "" } else { s.text(e.note) };
                    ev.push(time_ns, Ev::annotation(device, e.addr, text.to_owned()));
                }
            }
        }
        // Blocks active at the end that the trace did not allocate: live from the start.
        for &(d, addr, requested, frames, stream) in &live_blocks {
            if d == device && !live.contains_key(&addr) {
                let label = initial_label(infer, &t, s, frames);
                let stack = stacks.get(&mut ev, &t, s, frames, label, false, &[]);
                let stream = streams.id(stream);
                ev.push_initial(Ev::mem(
                    EvKind::Malloc,
                    device,
                    stream,
                    addr,
                    requested,
                    stack,
                ));
            }
        }
        // Device memory held at the end, less what the trace acquired: held from the start,
        // segment by segment where the segments tell (so that `oom` sees them), the rest as one.
        let mut before = final_reserved.get(&device).copied().unwrap_or(0) as i128 - seg_net;
        let held_stack = held_before_stack(&mut ev);
        for &(d, addr, size, stream) in &final_segments {
            if d == device && !held.contains_key(&addr) && size as i128 <= before && size > 0 {
                before -= size as i128;
                let stream = streams.id(stream);
                ev.push_initial(Ev::mem(
                    EvKind::Acquire,
                    device,
                    stream,
                    addr,
                    size,
                    held_stack,
                ));
            }
        }
        if before > 0 {
            ev.push_initial(Ev::mem(
                EvKind::Acquire,
                device,
                0,
                0,
                before as u64,
                Stack::NONE,
            ));
        }
        phases.finish(&mut ev, time_ns);
        ev.end = ev.end.max(time_ns);
    }
    // Devices that only the segments name.
    for &(d, addr, requested, frames, stream) in &live_blocks {
        if d as usize >= devices.len() {
            let label = initial_label(infer, &t, s, frames);
            let stack = stacks.get(&mut ev, &t, s, frames, label, false, &[]);
            let stream = streams.id(stream);
            ev.push_initial(Ev::mem(EvKind::Malloc, d, stream, addr, requested, stack));
        }
    }
    for &(d, addr, size, stream) in &final_segments {
        if d as usize >= devices.len() && size > 0 {
            let stream = streams.id(stream);
            let held_stack = held_before_stack(&mut ev);
            ev.push_initial(Ev::mem(EvKind::Acquire, d, stream, addr, size, held_stack));
        }
    }
    ev.overflowed = overflowed;
    ev.unmapped = unmapped.lines();
    ev.devices = (0..devices.len().max(1) as u32)
        .chain(final_reserved.keys().copied())
        .collect();
    ev.unix_start_ns = 0;
    Ok(ev)
}

fn expect_list(v: Value<Made>, what: &str) -> Result<(), ImportError> {
    match v {
        Value::List(_) => Ok(()),
        other => Err(ImportError::NotSnapshot(format!(
            "`{what}` is {}, not a list",
            kind_name(other)
        ))),
    }
}

/// A block's frames and the bytes the viewer counts for it (`requested_size`; the legacy
/// layout keeps both in `history[0]`).
fn block_extra(s: &Store<Made>, t: &mut Tables, b: Value<Made>, size: u64) -> (u32, u64) {
    let requested = |d: Value<Made>, key: &str| s.get(d, key).and_then(|v| v.u64()).unwrap_or(size);
    if let Some(f) = s.get(b, "frames") {
        return (t.frames_of(s, f), requested(b, "requested_size"));
    }
    if let Some(h) = s
        .get(b, "history")
        .and_then(|h| s.items(h).first().copied())
    {
        let frames = s.get(h, "frames").map_or(NONE, |f| t.frames_of(s, f));
        return (frames, requested(h, "real_size"));
    }
    (NONE, requested(b, "requested_size"))
}

/// A `record_function` range of `external_annotations`: a function scope (a phase).
#[derive(Debug, Clone)]
struct Range {
    device: u32,
    start: u64,
    end: u64,
    name: String,
}

/// `external_annotations`: `{name, stage: START|END, device, time_us}` from
/// `record_function` ranges. `ProfilerStep#N` ranges become epochs; other ranges are returned,
/// to become function scopes, each START paired with the next END of its name (a START never
/// ended runs to the end of the trace); an END without its START is a mark.
fn read_annotations(
    s: &Store<Made>,
    a: Value<Made>,
    t0_us: u64,
    ev: &mut Events,
    unmapped: &mut Unmapped,
) -> Vec<Range> {
    let mut ranges: Vec<Range> = Vec::new();
    let mut open: FxHashMap<(u32, String), Vec<usize>> = FxHashMap::default();
    for &x in s.items(a) {
        let name = s.get(x, "name").and_then(|v| s.str(v));
        let stage = s.get(x, "stage").and_then(|v| s.str(v)).unwrap_or("");
        let time = s.get(x, "time_us").and_then(|v| v.u64());
        let device = s
            .get(x, "device")
            .and_then(|v| v.u64())
            .unwrap_or(0)
            .min(255) as u32;
        let (Some(name), Some(time)) = (name, time) else {
            unmapped.add("external annotations without a name or time");
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
struct Phases {
    /// (start, end, frame id, the stack of the range itself), by start.
    ranges: Vec<(u64, u64, u32, Vec<u32>)>,
    /// Per range: whether it is an optimizer's step (`Optimizer.step#AdamW.step`).
    optimizer: Vec<bool>,
    next: usize,
    open: Vec<usize>,
    prefix: Vec<u32>,
}

impl Phases {
    fn new(ranges: &[Range], device: u32, only_device: bool, ev: &mut Events) -> Phases {
        let mut out: Vec<(u64, u64, u32, Vec<u32>)> = Vec::new();
        let mut optimizer = Vec::new();
        for r in ranges.iter().filter(|r| only_device || r.device == device) {
            optimizer.push(r.name.starts_with("Optimizer.step"));
            let frame = ev.frame(Frame {
                kind: FrameKind::Function,
                phase: Phase::None,
                file: String::new(),
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

    /// Back to the first entry, for a second pass.
    fn rewind(&mut self) {
        self.next = 0;
        self.open.clear();
        self.prefix.clear();
    }

    /// The frames of the ranges open at `t` (start <= t <= end), outermost first.
    fn at(&mut self, t: u64) -> &[u32] {
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

    /// Whether an optimizer's step range is open (as of the last [`Phases::at`]).
    fn in_optimizer_step(&self) -> bool {
        self.open.iter().any(|&i| self.optimizer[i])
    }

    /// Writes each range as a function scope (a range never ended ends with the trace).
    fn finish(self, ev: &mut Events, end: u64) {
        for (start, stop, _, stack) in self.ranges {
            let stack = ev.stack(&stack);
            let stop = if stop == u64::MAX { end } else { stop };
            ev.push(stop.max(start), Ev::scope(start, stack));
        }
    }
}

/// What an allocation's frames say ([`infer::Evidence`]), without its lifetime.
fn evidence(t: &Tables, s: &Store<Made>, frames: u32) -> infer::Evidence {
    let list = t.lists.get(frames as usize).map_or(&[][..], |l| &l[..]);
    let raw: Vec<(&str, &str, u32)> = list.iter().rev().map(|&f| raw_frame(t, s, f)).collect();
    let mut e = infer::Evidence {
        backward: crate::frames::in_backward(&raw),
        has_stack: !raw.is_empty(),
        ..Default::default()
    };
    for &(name, file, _) in &raw {
        if !file.ends_with(".py") {
            continue;
        }
        e.python = true;
        // The optimizer's, unless the user's own code runs inside it (a closure).
        if infer::in_optimizer(file) {
            e.optimizer = true;
        } else if crate::frames::is_user_file(file) {
            e.optimizer = false;
        }
        e.forward |= name == "forward";
        e.parameter |= infer::makes_parameter(file, name);
    }
    e
}

/// The category of a block live from the start to the end (a segment's block no entry
/// allocated): a gradient or optimizer state by its frames, else a parameter; `before
/// recording` when it has no frames.
fn initial_category(t: &Tables, s: &Store<Made>, frames: u32) -> &'static str {
    let e = infer::Evidence {
        before: true,
        ..evidence(t, s, frames)
    };
    infer::categories(&[infer::Life {
        evidence: e,
        freed_before: None,
        prev: None,
    }])[0]
}

/// The stack of a segment held from before the trace ([`crate::events::HELD_BEFORE`]).
fn held_before_stack(ev: &mut Events) -> Stack {
    let f = ev.frame(crate::events::held_before());
    ev.stack(&[f])
}

/// The label of a segment's block live from the start: its inferred category, when the file's
/// categories are inferred.
fn initial_label(infer: bool, t: &Tables, s: &Store<Made>, frames: u32) -> Label {
    if infer {
        Label::Inferred(initial_category(t, s, frames))
    } else {
        Label::None
    }
}

/// The inferred category of each `alloc` entry of one device, in order ([`infer`]).
fn infer_categories(
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

/// The memory category an allocation's stack ends with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Label {
    None,
    /// The entry's own `category` (profiler-made snapshots).
    Recorded(StrId),
    /// Inferred ([`infer`]): a label frame whose file says so.
    Inferred(&'static str),
}

impl Label {
    fn of(category: StrId) -> Label {
        if category == NONE {
            Label::None
        } else {
            Label::Recorded(category)
        }
    }
}

/// The stacks of the entries: a list of frames, filtered ([`FrameFilter`]), outermost first,
/// with a category label innermost when the entry has one, under the [`before_trace`] frame
/// for a block the trace did not allocate. Each frame is filtered and made once, each list
/// of frames made a stack once.
struct Stacks {
    filter: FrameFilter,
    /// The common directory of the user's files ([`crate::frames::common_dir`]), for `user`.
    prefix: String,
    /// Per frame of [`Tables::frames`], its role in the `user` view, once judged.
    roles: Vec<Option<crate::frames::FrameRole>>,
    /// Per frame of [`Tables::frames`]: not seen yet (`None`), dropped by the filter
    /// (`Some(NONE)`), or its id in [`Events`].
    frames: Vec<Option<u32>>,
    by_list: FxHashMap<(u32, Label, bool, Vec<u32>), Stack>,
    ids: Vec<u32>,
}

impl Stacks {
    fn new(filter: FrameFilter, t: &Tables, s: &Store<Made>) -> Stacks {
        let prefix = if filter == FrameFilter::User {
            crate::frames::common_dir(
                (0..t.frames.len() as u32)
                    .map(|f| raw_frame(t, s, f).1)
                    .filter(|f| {
                        f.starts_with('/') && crate::frames::is_user_file(f) && f.ends_with(".py")
                    }),
            )
        } else {
            String::new()
        };
        Stacks {
            filter,
            prefix,
            roles: Vec::new(),
            frames: Vec::new(),
            by_list: FxHashMap::default(),
            ids: Vec::new(),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn get(
        &mut self,
        ev: &mut Events,
        t: &Tables,
        s: &Store<Made>,
        frames: u32,
        label: Label,
        before: bool,
        prefix: &[u32],
    ) -> Stack {
        let key = (frames, label, before, prefix.to_vec());
        if let Some(&st) = self.by_list.get(&key) {
            return st;
        }
        self.ids.clear();
        if before {
            self.ids.push(ev.frame(before_trace()));
        }
        self.ids.extend_from_slice(prefix);
        // PyTorch stores a stack innermost first.
        let list = t.lists.get(frames as usize).map_or(&[][..], |l| &l[..]);
        if self.filter == FrameFilter::User {
            // Each distinct frame is judged once, each stack put together from the judgements.
            for &f in list {
                let i = f as usize;
                if self.roles.len() <= i {
                    self.roles.resize(i + 1, None);
                }
                if self.roles[i].is_none() {
                    let (name, file, line) = raw_frame(t, s, f);
                    self.roles[i] = Some(crate::frames::classify(name, file, line, &self.prefix));
                }
            }
            let roles = list
                .iter()
                .rev()
                .filter_map(|&f| self.roles[f as usize].as_ref());
            for f in crate::frames::assemble(roles) {
                let frame = match f.op_backward {
                    None => Frame {
                        kind: FrameKind::Foreign,
                        phase: Phase::None,
                        file: f.file,
                        line: f.line,
                        name: f.name,
                    },
                    Some(back) => Frame {
                        kind: FrameKind::Function,
                        phase: if back {
                            Phase::Backward
                        } else {
                            Phase::Forward
                        },
                        file: String::new(),
                        line: 0,
                        name: f.name,
                    },
                };
                self.ids.push(ev.frame(frame));
            }
        } else {
            for &f in list.iter().rev() {
                let id = self.frame(ev, t, s, f);
                if id != NONE {
                    self.ids.push(id);
                }
            }
        }
        match label {
            Label::None => {}
            Label::Recorded(c) => self.ids.push(ev.frame(label_frame(s.text(c)))),
            Label::Inferred(name) => self.ids.push(ev.frame(Frame {
                file: infer::INFERRED.to_owned(),
                ..label_frame(name)
            })),
        }
        let stack = ev.stack(&self.ids);
        self.by_list.insert(key, stack);
        stack
    }

    /// The id in `ev` of a frame of [`Tables::frames`], `NONE` when the filter drops it.
    fn frame(&mut self, ev: &mut Events, t: &Tables, s: &Store<Made>, f: u32) -> u32 {
        if let Some(&Some(id)) = self.frames.get(f as usize) {
            return id;
        }
        if t.frames.get(f as usize).is_none() {
            return NONE;
        }
        let (name, file, line) = raw_frame(t, s, f);
        let id = if self.filter.keeps(name, file) {
            ev.frame(Frame {
                kind: FrameKind::Foreign,
                phase: Phase::None,
                file: file.to_owned(),
                line,
                name: name.to_owned(),
            })
        } else {
            NONE
        };
        if self.frames.len() <= f as usize {
            self.frames.resize(f as usize + 1, None);
        }
        self.frames[f as usize] = Some(id);
        id
    }
}

/// A frame of [`Tables::frames`] as `(name, file, line)`: absent strings read `?` and `??`;
/// `_memory_viz._profile_to_snapshot` writes a profiler's Python call as
/// {filename: "none", line: 0, name: "file.py(18): function"}: its file and line.
fn raw_frame<'s>(t: &Tables, s: &'s Store<Made>, f: u32) -> (&'s str, &'s str, u32) {
    let Some(k) = t.frames.get(f as usize) else {
        return ("?", "??", 0);
    };
    let text = |id: StrId, absent: &'static str| if id == NONE { absent } else { s.text(id) };
    let (name, file, line) = (text(k.name, "?"), text(k.file, "??"), k.line);
    if file == "none" && line == 0 {
        if let Some((f, l, n)) = crate::frames::profiler_location(name) {
            return (n, f, l);
        }
    }
    (name, file, line)
}

/// Streams as the viewer numbers them: 0 is the default stream, others 1, 2, ... in order of
/// first appearance.
#[derive(Default)]
struct StreamIds(FxHashMap<u64, u32>);

impl StreamIds {
    fn id(&mut self, s: u64) -> u32 {
        if s == 0 {
            return 0;
        }
        let n = self.0.len() as u32 + 1;
        *self.0.entry(s).or_insert(n)
    }
}
