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
//! - Pinned host memory (`host_traces`, `host_segments`) is one more device, read by the same
//!   rules ([`host`]); `user_metadata` and `compile_context` are counted for `info`
//!   ([`metadata`]).
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
//!
//! The parts: [`entries`] (what the reader makes of each dict and list), [`host`] (pinned
//! host memory), [`metadata`] (the entries' strings no event holds), [`stacks`] (frames
//! and stacks as poolsight's), [`ranges`] (`record_function` ranges), [`phases`] (phases
//! inferred from stacks where there are none), [`categories`] (the inferred categories); this file puts them together, device by device.

mod categories;
mod entries;
mod host;
mod metadata;
mod phases;
mod ranges;
mod stacks;

use rustc_hash::FxHashMap;

use categories::{by_gradients, gradient_sizes, infer_categories, initial_label};
use entries::{block_extra, kind_name, Action, Entry, Made, Tables, KNOWN, NONE};
use phases::Inferred;
use ranges::{read_annotations, Phases};
use stacks::{held_before_stack, Label, Stacks, StreamIds};

use crate::events::{Ev, EvKind, Events, Stack};
use crate::frames::FrameFilter;
use crate::infer;
use crate::pickle::{self, Parsed, Progress, Value};
use crate::ImportError;

/// Counts of what was read but could not be mapped, reported by `info`.
#[derive(Default)]
pub(super) struct Unmapped(std::collections::BTreeMap<String, u64>);

impl Unmapped {
    pub(super) fn add(&mut self, what: impl Into<String>) {
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
    let (host_segments, host_traces) = match root {
        Value::Dict(_) => (s.get(root, "host_segments"), s.get(root, "host_traces")),
        _ => (None, None),
    };
    if segments.is_none() && traces.is_none() && host_traces.is_none() {
        return Err(ImportError::NotSnapshot(
            "the pickle's dict has neither `segments` nor `device_traces`".into(),
        ));
    }
    let mut unmapped = Unmapped::default();
    for (k, _) in s.pairs(root) {
        match s.str(k) {
            Some("segments" | "device_traces" | "external_annotations") => {}
            Some("allocator_settings" | "host_segments" | "host_traces") => {}
            Some(other) => unmapped.add(format!("snapshot key `{other}`")),
            None => unmapped.add("a snapshot key that is not a string"),
        }
    }
    let mut ev = Events::new(filter);
    let mut stacks = Stacks::new(filter, &t, s);
    let mut streams = StreamIds::default();
    let entries = std::mem::take(&mut t.entries);
    // Per device, its entries; `record_function` annotations, wherever the file keeps them.
    let mut devices: Vec<Vec<Entry>> = Vec::new();
    let mut annotations = annotations.map_or_else(Vec::new, |a| ranges::external(s, a));
    let external = annotations.len();
    let device_of = |devices: &Vec<Vec<Entry>>| devices.len().min(255) as u32;
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
                    Err(name) if name != NONE && s.text(name) == "user_defined" => {
                        annotations.push(ranges::user_defined(&t, s, entry, device_of(&devices)));
                    }
                    Err(name) => unmapped.add(format!(
                        "trace entries with action `{}`",
                        if name == NONE { "?" } else { s.text(name) }
                    )),
                }
            }
            devices.push(list);
        }
    }
    let host_entries = host_traces.map(|h| host::entries(s, h, &entries, &mut unmapped));
    drop(entries);
    // Pinned host memory is the device after every CUDA device the file names.
    let cuda_devices = devices.len();
    let host = (host_entries.is_some() || host_segments.is_some()).then(|| {
        let last_segment = segments.map_or(0, |segs| {
            s.items(segs)
                .iter()
                .filter_map(|&seg| s.get(seg, "device").and_then(|v| v.u64()))
                .map(|d| d.min(254) + 1)
                .max()
                .unwrap_or(0)
        });
        (cuda_devices.max(1) as u64).max(last_segment).min(255) as u32
    });
    if let Some(h) = host {
        devices.resize(h as usize, Vec::new());
        devices.push(host_entries.unwrap_or_default());
    }
    // Entries of the device traces, `user_defined` ones too.
    ev.entries =
        devices.iter().map(|d| d.len() as u64).sum::<u64>() + (annotations.len() - external) as u64;
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
    let lists = segments
        .map(|v| (v, None))
        .into_iter()
        .chain(host_segments.zip(host).map(|(v, h)| (v, Some(h))));
    for (segs, host_device) in lists {
        if host_device.is_none() {
            expect_list(segs, "segments")?;
        }
        for &seg in s.items(segs) {
            let blocks = match s.get(seg, "blocks") {
                Some(b) => b,
                // The host allocator's layout is new: what is not a segment is counted.
                None if host_device.is_some() => {
                    unmapped.add(format!("`host_segments` items that are {}", kind_name(seg)));
                    continue;
                }
                None => {
                    return Err(ImportError::NotSnapshot(format!(
                        "`segments` holds {}, not a segment (a dict with `blocks`)",
                        kind_name(seg)
                    )))
                }
            };
            let int = |key: &str| s.get(seg, key).and_then(|v| v.u64());
            let device = host_device.unwrap_or_else(|| int("device").unwrap_or(0).min(255) as u32);
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
    metadata::summarize(devices.iter().flatten(), s, &mut unmapped);
    let ranges = read_annotations(&annotations, t0_us, &mut ev, &mut unmapped);
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
        // Ranges are the CUDA devices'; the host's blocks are named by their stacks alone.
        let on_host = host == Some(device);
        let here = if on_host { &[][..] } else { &ranges[..] };
        let mut phases = Phases::new(here, device, cuda_devices == 1, &mut ev);
        let inferred = if infer {
            infer_categories(entries, &times, &t, s, &mut phases)
        } else {
            Vec::new()
        };
        phases.rewind();
        let mut inferred_phases =
            (phases.is_empty() && !on_host).then(|| Inferred::new(entries, &times, &t, s, &mut ev));
        let mut allocs = 0usize;
        for (i, e) in entries.iter().enumerate() {
            let Ok(action) = e.action else { continue };
            let time_ns = times[i];
            let stream = streams.id(e.stream);
            let prefix = match inferred_phases.as_mut() {
                Some(p) if action == Action::Alloc => p.prefix(allocs),
                _ => phases.at(time_ns),
            };
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
        // Blocks active at the end that the trace did not allocate: live from the start; those
        // nothing names, parameters where gradients of their sizes match them one to one.
        let from_start: Vec<(u64, u64, u32, u64, Label)> = live_blocks
            .iter()
            .filter(|b| b.0 == device && !live.contains_key(&b.1))
            .map(|&(_, addr, requested, frames, stream)| {
                let label = initial_label(infer, &t, s, frames);
                (addr, requested, frames, stream, label)
            })
            .collect();
        let unnamed = Label::Inferred(infer::BEFORE_RECORDING);
        let candidates: Vec<(u64, u64, u64)> = from_start
            .iter()
            .filter(|b| b.4 == unnamed)
            .map(|b| (b.0, b.1, b.3))
            .collect();
        // Each gradient's parameter may be named already (by its frames, or made in the
        // trace): those take their gradients first.
        let mut gradients = gradient_sizes(entries, &inferred);
        let known = Label::Inferred(infer::PARAMETER);
        let named = from_start
            .iter()
            .filter(|b| b.4 == known)
            .map(|b| (b.1, b.3))
            .chain(
                entries
                    .iter()
                    .filter(|e| matches!(e.action, Ok(Action::Alloc)))
                    .zip(inferred.iter())
                    .filter(|(_, c)| **c == infer::PARAMETER)
                    .map(|(e, _)| (e.size, e.stream)),
            );
        for key in named {
            if let Some(n) = gradients.get_mut(&key) {
                *n = n.saturating_sub(1);
            }
        }
        let mut matched = by_gradients(&candidates, gradients).into_iter();
        for &(addr, requested, frames, stream, label) in &from_start {
            // `matched` answers the candidates, in their order.
            let label = match label == unnamed && matched.next() == Some(true) {
                true => Label::ByGradient,
                false => label,
            };
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
        if let Some(p) = inferred_phases {
            p.finish(&mut ev);
        }
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
    if let Some(h) = host {
        ev.cpu_device = Some(h);
        ev.cpu_name = host::PINNED_HOST;
    }
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
