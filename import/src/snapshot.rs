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

use rustc_hash::FxHashMap;

use crate::events::{Ev, EvKind, Events, Stack};
use crate::frames::FrameFilter;
use crate::pickle::{Pickle, Tag};
use crate::ImportError;

/// One device's trace entry, as read.
#[derive(Debug, Clone, Copy)]
struct Entry {
    action: Action,
    addr: u64,
    size: u64,
    stream: u64,
    time_us: Option<u64>,
    /// Node of the frames list (or `u32::MAX`: none).
    frames: u32,
    /// Node of the `user_metadata` string, or of the `category` (profiler snapshots).
    note: u32,
    category: u32,
    device_free: u64,
}

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

impl Action {
    fn parse(s: &str) -> Option<Action> {
        Some(match s {
            "alloc" => Action::Alloc,
            "free_requested" => Action::FreeRequested,
            "free_completed" => Action::FreeCompleted,
            "segment_alloc" => Action::SegmentAlloc,
            "segment_free" => Action::SegmentFree,
            "segment_map" => Action::SegmentMap,
            "segment_unmap" => Action::SegmentUnmap,
            "oom" => Action::Oom,
            "snapshot" => Action::Snapshot,
            "annotate" => Action::Annotate,
            _ => return None,
        })
    }
}

const NONE: u32 = u32::MAX;

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

/// Reads a parsed snapshot into time-ordered events.
pub fn convert(p: &Pickle<'_>, filter: FrameFilter) -> Result<Events, ImportError> {
    let root = p.root;
    let (segments, traces, annotations) = match p.tag(root) {
        Tag::Dict => (
            p.get(root, "segments"),
            p.get(root, "device_traces"),
            p.get(root, "external_annotations"),
        ),
        // The oldest snapshots are the list of segments alone (`_memory_viz` reads them so).
        Tag::List => (Some(root), None, None),
        _ => {
            return Err(ImportError::NotSnapshot(format!(
                "the pickle holds {}, not a snapshot's dict",
                p.kind_name(root)
            )))
        }
    };
    if segments.is_none() && traces.is_none() {
        return Err(ImportError::NotSnapshot(
            "the pickle's dict has neither `segments` nor `device_traces`".into(),
        ));
    }
    let mut unmapped = Unmapped::default();
    if p.tag(root) == Tag::Dict {
        for (k, v) in p.pairs(root) {
            match p.str(k) {
                Some("segments" | "device_traces" | "external_annotations") => {}
                Some("allocator_settings") => {}
                Some("host_segments" | "host_traces") => {
                    let n = p.items(v).count();
                    if n > 0 {
                        unmapped.0.insert(
                            format!("{} (pinned host memory)", p.str(k).unwrap_or_default()),
                            n as u64,
                        );
                    }
                }
                Some(other) => unmapped.add(format!("snapshot key `{other}`")),
                None => unmapped.add("a snapshot key that is not a string"),
            }
        }
    }
    let mut ev = Events::new(filter);
    let mut streams = StreamIds::default();
    // Per device, its entries.
    let mut devices: Vec<Vec<Entry>> = Vec::new();
    if let Some(t) = traces {
        expect(p, t, Tag::List, "device_traces")?;
        for d in p.items(t) {
            expect(p, d, Tag::List, "a device trace")?;
            let mut entries = Vec::new();
            for e in p.items(d) {
                if p.tag(e) != Tag::Dict || p.get(e, "action").is_none() {
                    return Err(ImportError::NotSnapshot(format!(
                        "a device trace holds {}, not a trace entry (a dict with `action`)",
                        p.kind_name(e)
                    )));
                }
                match entry(p, e) {
                    Some(x) => entries.push(x),
                    None => unmapped.add(format!(
                        "trace entries with action `{}`",
                        p.get(e, "action").and_then(|a| p.str(a)).unwrap_or("?")
                    )),
                }
            }
            devices.push(entries);
        }
    }
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
    if let Some(segs) = segments {
        expect(p, segs, Tag::List, "segments")?;
        for s in p.items(segs) {
            if p.tag(s) != Tag::Dict || p.get(s, "blocks").is_none() {
                return Err(ImportError::NotSnapshot(format!(
                    "`segments` holds {}, not a segment (a dict with `blocks`)",
                    p.kind_name(s)
                )));
            }
            let device = p
                .get(s, "device")
                .and_then(|d| p.u64(d))
                .unwrap_or(0)
                .min(255) as u32;
            let total = p.get(s, "total_size").and_then(|v| p.u64(v)).unwrap_or(0);
            let stream = p.get(s, "stream").and_then(|v| p.u64(v)).unwrap_or(0);
            *final_reserved.entry(device).or_default() += total;
            let mut addr = p.get(s, "address").and_then(|v| p.u64(v)).unwrap_or(0);
            if let Some(blocks) = p.get(s, "blocks") {
                for b in p.items(blocks) {
                    let size = p.get(b, "size").and_then(|v| p.u64(v)).unwrap_or(0);
                    let state = p.get(b, "state").and_then(|v| p.str(v)).unwrap_or("");
                    if state == "active_allocated" {
                        let (frames, requested) = block_extra(p, b, size);
                        live_blocks.push((device, addr, requested, frames, stream));
                    }
                    addr = addr.wrapping_add(size);
                }
            }
        }
    }
    if let Some(a) = annotations {
        read_annotations(p, a, t0_us, &mut ev, &mut unmapped);
    }

    // Per device: what the trace leaves live at its end, what was live from the start, and the
    // events in trace order.
    let mut overflowed = false;
    for (dev, entries) in devices.iter().enumerate() {
        let device = dev.min(255) as u32;
        let mut live: FxHashMap<u64, ()> = FxHashMap::default();
        let mut seg_net: i128 = 0;
        let mut time_ns = 0u64;
        for (i, e) in entries.iter().enumerate() {
            let t = match e.time_us {
                Some(t) if has_time => t.saturating_sub(t0_us).saturating_mul(1000),
                _ => i as u64 * 1000,
            };
            // Entries keep the allocator's order; a clock that steps back is held level.
            time_ns = time_ns.max(t);
            let stream = streams.id(e.stream);
            match e.action {
                Action::Alloc => {
                    live.insert(e.addr, ());
                    let stack = ev.stack(p, e.frames, e.category);
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
                        let stack = ev.before_trace_stack(p, e.frames, e.category);
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
                    ev.push(
                        time_ns,
                        Ev::mem(EvKind::Acquire, device, stream, e.addr, e.size, Stack::NONE),
                    );
                }
                Action::SegmentFree | Action::SegmentUnmap => {
                    seg_net -= e.size as i128;
                    ev.push(
                        time_ns,
                        Ev::mem(EvKind::Release, device, stream, e.addr, e.size, Stack::NONE),
                    );
                }
                Action::Oom => {
                    let stack = ev.stack(p, e.frames, NONE);
                    ev.push(
                        time_ns,
                        Ev::oom(device, stream, e.size, e.device_free, stack),
                    );
                }
                Action::Snapshot => ev.push(time_ns, Ev::snapshot(device)),
                Action::Annotate => {
                    let text = p.str(e.note).unwrap_or("").to_owned();
                    ev.push(time_ns, Ev::annotation(device, e.addr, text));
                }
            }
        }
        // Blocks active at the end that the trace did not allocate: live from the start.
        for &(d, addr, requested, frames, stream) in &live_blocks {
            if d == device && !live.contains_key(&addr) {
                let stack = ev.stack(p, frames, NONE);
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
        // Device memory held at the end, less what the trace acquired: held from the start.
        let before = final_reserved.get(&device).copied().unwrap_or(0) as i128 - seg_net;
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
        ev.end = ev.end.max(time_ns);
    }
    // Devices that only the segments name.
    for &(d, addr, requested, frames, stream) in &live_blocks {
        if d as usize >= devices.len() {
            let stack = ev.stack(p, frames, NONE);
            let stream = streams.id(stream);
            ev.push_initial(Ev::mem(EvKind::Malloc, d, stream, addr, requested, stack));
        }
    }
    for (&d, &bytes) in &final_reserved {
        if d as usize >= devices.len() && bytes > 0 {
            ev.push_initial(Ev::mem(EvKind::Acquire, d, 0, 0, bytes, Stack::NONE));
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

fn expect(p: &Pickle<'_>, id: u32, tag: Tag, what: &str) -> Result<(), ImportError> {
    if p.tag(id) == tag {
        Ok(())
    } else {
        Err(ImportError::NotSnapshot(format!(
            "`{what}` is {}, not {}",
            p.kind_name(id),
            match tag {
                Tag::List => "a list",
                _ => "a dict",
            }
        )))
    }
}

fn entry(p: &Pickle<'_>, e: u32) -> Option<Entry> {
    let mut x = Entry {
        action: Action::Snapshot,
        addr: 0,
        size: 0,
        stream: 0,
        time_us: None,
        frames: NONE,
        note: NONE,
        category: NONE,
        device_free: 0,
    };
    let mut action = None;
    for (k, v) in p.pairs(e) {
        match p.str(k)? {
            "action" => action = Action::parse(p.str(v)?),
            "addr" => x.addr = p.u64(v).unwrap_or(0),
            "size" => x.size = p.u64(v).unwrap_or(0),
            "stream" => x.stream = p.u64(v).unwrap_or(0),
            "time_us" => x.time_us = p.u64(v),
            "frames" => x.frames = v,
            "user_metadata" => x.note = v,
            "category" => x.category = v,
            "device_free" => x.device_free = p.u64(v).unwrap_or(0),
            _ => {}
        }
    }
    x.action = action?;
    Some(x)
}

/// A block's frames and the bytes the viewer counts for it (`requested_size`; the legacy
/// layout keeps both in `history[0]`).
fn block_extra(p: &Pickle<'_>, b: u32, size: u64) -> (u32, u64) {
    if let Some(f) = p.get(b, "frames") {
        let req = p
            .get(b, "requested_size")
            .and_then(|v| p.u64(v))
            .unwrap_or(size);
        return (f, req);
    }
    if let Some(h) = p.get(b, "history").and_then(|h| p.items(h).next()) {
        let frames = p.get(h, "frames").unwrap_or(NONE);
        let req = p.get(h, "real_size").and_then(|v| p.u64(v)).unwrap_or(size);
        return (frames, req);
    }
    let req = p
        .get(b, "requested_size")
        .and_then(|v| p.u64(v))
        .unwrap_or(size);
    (NONE, req)
}

/// `external_annotations`: `{name, stage: START|END, device, time_us}` from
/// `record_function` ranges; `ProfilerStep#N` ranges become epochs, others marks.
fn read_annotations(p: &Pickle<'_>, a: u32, t0_us: u64, ev: &mut Events, unmapped: &mut Unmapped) {
    for x in p.items(a) {
        let name = p.get(x, "name").and_then(|v| p.str(v));
        let stage = p.get(x, "stage").and_then(|v| p.str(v)).unwrap_or("");
        let time = p.get(x, "time_us").and_then(|v| p.u64(v));
        let device = p
            .get(x, "device")
            .and_then(|v| p.u64(v))
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
            _ => ev.push(
                t,
                Ev::annotation(device, 0, format!("{stage} {name}").trim().to_owned()),
            ),
        }
    }
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
