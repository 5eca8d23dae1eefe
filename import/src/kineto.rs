//! `torch.profiler` Chrome/Kineto JSON traces (`prof.export_chrome_trace(...)`, the
//! TensorBoard handler's `*.pt.trace.json`) into poolsight events:
//!
//! - `[memory]` instant events (`Addr`, `Bytes`, `Device Type`, `Device Id`): a positive
//!   `Bytes` is a malloc, a negative one the free of that address; a free of an address the
//!   trace never allocated was live from the start;
//! - complete (`X`) events on CPU threads are scopes, nested by time on their thread:
//!   `cpu_op` (ATen operators) are functions, `python_function` events `nn.Module: Name_N`
//!   are links (`Name`), other Python calls (`file.py(line): name`, C functions named without
//!   their object's address) are user scopes, `record_function` ranges (`user_annotation`)
//!   function scopes with a snapshot's range file (phases); a memory event's stack is the
//!   scopes open on its thread at its time; a free of a block never allocated (in time order
//!   over every thread) was live from the start;
//! - `ProfilerStep#N` annotations are epoch `N`.

use std::borrow::Cow;

use poolsight_recorder::{Frame, FrameKind, Phase};
use rustc_hash::FxHashMap;
use serde::Deserialize;

use crate::events::{before_trace, label, step_number, Ev, EvKind, Events, Stack};
use crate::frames::FrameFilter;
use crate::infer;
use crate::ImportError;

/// A profiler trace as `export_chrome_trace` writes it: an object with `traceEvents`. (Chrome's
/// trace format also allows a bare list of events, read by [`parse`].)
#[derive(Deserialize)]
struct File<'a> {
    #[serde(rename = "traceEvents", borrow)]
    events: Vec<Event<'a>>,
    #[serde(rename = "baseTimeNanoseconds", default)]
    base_ns: Option<u64>,
}

/// The events and base time of a trace. The form is chosen by the first character, so that a
/// damaged file gets the error of the form it has (`invalid type: integer, expected a
/// sequence at line 1 column 18`), not serde's word that it matched neither.
fn parse(data: &[u8]) -> Result<(Vec<Event<'_>>, Option<u64>), ImportError> {
    let bad = |e: serde_json::Error| ImportError::NotProfile(e.to_string());
    match data.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => {
            let file: File<'_> = serde_json::from_slice(data).map_err(bad)?;
            Ok((file.events, file.base_ns))
        }
        Some(b'[') => Ok((serde_json::from_slice(data).map_err(bad)?, None)),
        _ => Err(ImportError::NotProfile(
            "expected a JSON object with \"traceEvents\" (or a list of trace events)".into(),
        )),
    }
}

#[derive(Deserialize)]
struct Event<'a> {
    #[serde(borrow, default)]
    ph: Cow<'a, str>,
    #[serde(borrow, default)]
    cat: Cow<'a, str>,
    #[serde(borrow, default)]
    name: Cow<'a, str>,
    #[serde(default)]
    ts: Option<f64>,
    #[serde(default)]
    dur: Option<f64>,
    #[serde(default)]
    pid: Option<Id>,
    #[serde(default)]
    tid: Option<Id>,
    #[serde(default)]
    args: Option<Args>,
}

#[derive(Debug, Deserialize, Clone, PartialEq, Eq, Hash)]
#[serde(untagged)]
enum Id {
    N(i64),
    S(String),
    F(serde_json::Number),
}

#[derive(Deserialize, Default)]
struct Args {
    #[serde(rename = "Bytes", default)]
    bytes: Option<i64>,
    #[serde(rename = "Addr", default)]
    addr: Option<u64>,
    #[serde(rename = "Device Type", default)]
    device_type: Option<i64>,
    #[serde(rename = "Device Id", default)]
    device_id: Option<i64>,
}

/// One category per allocation, from `poolsight.torch.from_profile` (PyTorch's memory
/// profile): the allocation of `addr` nearest to `ts_us` gets `category`.
#[derive(Debug, Clone)]
pub struct Category {
    pub addr: u64,
    pub ts_us: f64,
    pub category: String,
}

struct Item {
    ts: f64,
    /// 0: a scope opening, 1: a memory event (a scope opening at the same time comes first).
    class: u8,
    end: f64,
    index: usize,
}

pub fn convert(data: &[u8], filter: FrameFilter) -> Result<Events, ImportError> {
    convert_with(data, filter, &[])
}

pub fn convert_with(
    data: &[u8],
    filter: FrameFilter,
    categories: &[Category],
) -> Result<Events, ImportError> {
    let (events, base_ns) = parse(data)?;
    let mut ev = Events::new(filter);
    ev.entries = events.len() as u64;
    let t0 = events
        .iter()
        .filter(|e| matches!(&*e.ph, "X" | "i" | "I"))
        .filter_map(|e| e.ts)
        .filter(|t| t.is_finite())
        .fold(f64::INFINITY, f64::min);
    if !t0.is_finite() {
        return Err(ImportError::NotProfile(
            "it has no timed events (`traceEvents` with `ts`)".into(),
        ));
    }
    let ns = |t: f64| -> u64 { ((t - t0) * 1000.0).round().max(0.0) as u64 };
    ev.unix_start_ns = base_ns.map_or(0, |b| b.saturating_add((t0 * 1000.0).max(0.0) as u64));
    let any_cuda = events
        .iter()
        .filter(|e| e.name == "[memory]")
        .any(|e| e.args.as_ref().and_then(|a| a.device_type) == Some(1));
    let cuda_max = events
        .iter()
        .filter(|e| e.name == "[memory]")
        .filter_map(|e| e.args.as_ref())
        .filter(|a| a.device_type == Some(1))
        .filter_map(|a| a.device_id)
        .max()
        .unwrap_or(-1);
    let cpu_device = if any_cuda {
        (cuda_max + 1).clamp(0, 255) as u32
    } else {
        0
    };
    // Items per thread.
    let mut threads: FxHashMap<(Option<Id>, Option<Id>), Vec<Item>> = FxHashMap::default();
    let mut unmapped: std::collections::BTreeMap<String, u64> = Default::default();
    for (i, e) in events.iter().enumerate() {
        let Some(ts) = e.ts.filter(|t| t.is_finite()) else {
            continue;
        };
        let key = (e.pid.clone(), e.tid.clone());
        match (&*e.ph, &*e.cat) {
            ("i" | "I", _) if e.name == "[memory]" => threads.entry(key).or_default().push(Item {
                ts,
                class: 1,
                end: ts,
                index: i,
            }),
            ("X", "cpu_op" | "python_function" | "user_annotation") => {
                let dur = e.dur.filter(|d| d.is_finite() && *d >= 0.0).unwrap_or(0.0);
                threads.entry(key).or_default().push(Item {
                    ts,
                    class: 0,
                    end: ts + dur,
                    index: i,
                })
            }
            ("M", _) => {}
            (ph, cat) => {
                *unmapped
                    .entry(format!("events of phase `{ph}`, category `{cat}`"))
                    .or_default() += 1;
            }
        }
    }
    let mut by_addr: FxHashMap<u64, Vec<(f64, &str)>> = FxHashMap::default();
    for c in categories {
        by_addr
            .entry(c.addr)
            .or_default()
            .push((c.ts_us, &c.category));
    }
    let device_of = |a: &Args| match a.device_type {
        Some(1) => a.device_id.unwrap_or(0).clamp(0, 255) as u32,
        _ => cpu_device,
    };
    // The frees of blocks the trace never allocated (live from the start), found in time order
    // over every thread: a block is often freed on another thread than the one that made it
    // (CUDA's backward pass runs on the autograd engine's device threads).
    let mut memory: Vec<(f64, usize)> = events
        .iter()
        .enumerate()
        .filter(|(_, e)| matches!(&*e.ph, "i" | "I") && e.name == "[memory]")
        .filter_map(|(i, e)| e.ts.filter(|t| t.is_finite()).map(|t| (t, i)))
        .collect();
    memory.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    // Without categories of its own (`from_profile`'s), a trace's are inferred ([`infer`]):
    // each allocation's life, in time order, its evidence filled in below from its stack.
    let inferring = categories.is_empty();
    let mut lives: Vec<infer::Life> = Vec::new();
    let mut life_of: FxHashMap<usize, usize> = FxHashMap::default();
    let mut held: FxHashMap<(u32, u64), Option<usize>> = FxHashMap::default();
    let mut from_start: FxHashMap<usize, ()> = FxHashMap::default();
    for &(_, i) in &memory {
        let Some(a) = events[i].args.as_ref() else {
            continue;
        };
        let (Some(bytes), Some(addr)) = (a.bytes, a.addr) else {
            continue;
        };
        let key = (device_of(a), addr);
        if bytes > 0 {
            let life = inferring.then_some(lives.len());
            if let Some(k) = life {
                life_of.insert(i, k);
                lives.push(infer::Life {
                    evidence: infer::Evidence::default(),
                    freed_before: None,
                    prev: None,
                });
            }
            held.insert(key, life);
        } else if bytes < 0 {
            match held.remove(&key) {
                Some(Some(k)) => lives[k].freed_before = Some(lives.len()),
                Some(None) => {}
                None => {
                    from_start.insert(i, ());
                }
            }
        }
    }
    drop((memory, held));
    // Allocations whose label waits for the inference: (life, index of its malloc event, its
    // stack); each distinct stack's evidence, once.
    let mut pending: Vec<(usize, usize, Stack)> = Vec::new();
    let mut evidence_of: FxHashMap<Stack, infer::Evidence> = FxHashMap::default();
    let mut overflowed = false;
    let mut devices: Vec<u32> = Vec::new();
    let mut keys: Vec<_> = threads.keys().cloned().collect();
    keys.sort_by_key(|k| format!("{k:?}"));
    for key in keys {
        let mut items = threads.remove(&key).unwrap_or_default();
        items.sort_by(|a, b| {
            a.ts.total_cmp(&b.ts)
                .then(a.class.cmp(&b.class))
                .then(b.end.total_cmp(&a.end))
        });
        // Open scopes: (end, stack, frames).
        let mut open: Vec<(f64, Stack, Vec<Frame>)> = Vec::new();
        for it in items {
            let e = &events[it.index];
            if it.class == 0 {
                while open.last().is_some_and(|o| o.0 <= it.ts) {
                    open.pop();
                }
            } else {
                while open.last().is_some_and(|o| o.0 < it.ts) {
                    open.pop();
                }
            }
            let parent = open.last().map(|o| (o.1, o.2.clone()));
            if it.class == 0 {
                if let Some(n) = step_number(&e.name) {
                    ev.push(ns(it.ts), Ev::epoch(true, n));
                    ev.push(ns(it.end), Ev::epoch(false, n));
                    continue;
                }
                let mut frames = parent.map(|p| p.1).unwrap_or_default();
                frames.push(scope_frame(&e.cat, &e.name));
                let stack = ev.intern(frames.clone());
                ev.push(ns(it.end), Ev::scope(ns(it.ts), stack));
                open.push((it.end, stack, frames));
                continue;
            }
            let a = e.args.as_ref();
            let (Some(bytes), Some(addr)) = (a.and_then(|a| a.bytes), a.and_then(|a| a.addr))
            else {
                *unmapped
                    .entry("memory events without `Bytes` or `Addr`".into())
                    .or_default() += 1;
                continue;
            };
            let device = a.map_or(cpu_device, device_of);
            devices.push(device);
            let t = ns(it.ts);
            let size = bytes.unsigned_abs();
            if bytes > 0 {
                let mut frames = parent.map(|p| p.1).unwrap_or_default();
                let waits = match nearest(&by_addr, addr, it.ts) {
                    Some(c) => {
                        frames.push(label(c));
                        None
                    }
                    None => life_of.get(&it.index).copied(),
                };
                let stack = ev.intern(frames);
                if let Some(k) = waits {
                    lives[k].evidence = *evidence_of.entry(stack).or_insert_with(|| {
                        let frames: Vec<Frame> = ev.frames_of(stack).cloned().collect();
                        evidence(&frames)
                    });
                    pending.push((k, ev.timed_len(), stack));
                }
                ev.push(t, Ev::mem(EvKind::Malloc, device, 0, addr, size, stack));
                ev.push(t, Ev::mem(EvKind::Acquire, device, 0, addr, size, stack));
            } else if bytes < 0 {
                if from_start.contains_key(&it.index) {
                    overflowed = true;
                    let mut frames = vec![before_trace()];
                    let scopes = parent.map(|p| p.1).unwrap_or_default();
                    if inferring {
                        let category = infer::initial(evidence(&scopes));
                        frames.extend(scopes);
                        frames.push(inferred(category));
                    } else {
                        frames.extend(scopes);
                    }
                    let stack = ev.intern(frames);
                    ev.push_initial(Ev::mem(EvKind::Malloc, device, 0, addr, size, stack));
                    ev.push_initial(Ev::mem(EvKind::Acquire, device, 0, addr, size, stack));
                }
                ev.push(t, Ev::mem(EvKind::Free, device, 0, addr, size, Stack::NONE));
                ev.push(
                    t,
                    Ev::mem(EvKind::Release, device, 0, addr, size, Stack::NONE),
                );
            }
            ev.end = ev.end.max(t);
        }
    }
    if !pending.is_empty() {
        let found = infer::categories(&lives);
        let mut labelled: FxHashMap<(Stack, &str), Stack> = FxHashMap::default();
        for (k, at, stack) in pending {
            let category = found[k];
            let stack = *labelled
                .entry((stack, category))
                .or_insert_with(|| ev.with_frame(stack, inferred(category)));
            // The malloc and the acquire pushed with it.
            ev.restack(at, stack);
            ev.restack(at + 1, stack);
        }
    }
    devices.sort_unstable();
    devices.dedup();
    if devices.is_empty() {
        devices.push(cpu_device);
    }
    ev.devices = devices;
    ev.cpu_device = Some(cpu_device);
    ev.observed = true;
    ev.overflowed = overflowed;
    ev.unmapped = unmapped
        .into_iter()
        .map(|(k, n)| format!("{k}: {n}"))
        .collect();
    Ok(ev)
}

/// What an allocation's stack (its open scopes, outermost first) says ([`infer::evidence_of`]):
/// a module's scope is a forward (the model's, also inside an optimizer's step); an
/// optimizer's range open ([`infer::is_optimizer_range`]) an optimizer's work.
fn evidence(frames: &[Frame]) -> infer::Evidence {
    let raw: Vec<(&str, &str, u32)> = frames
        .iter()
        .filter(|f| f.kind != FrameKind::Label)
        .map(|f| (f.name.as_str(), f.file.as_str(), f.line))
        .collect();
    let mut e = infer::evidence_of(&raw);
    if frames.iter().any(|f| f.kind == FrameKind::Link) {
        e.forward = true;
        e.model = true;
        e.optimizer = false;
    }
    if frames.iter().any(|f| {
        f.kind != FrameKind::Label
            && f.file == poolsight_schema::RANGE_FILE
            && infer::is_optimizer_range(&f.name)
    }) {
        e = e.in_optimizer_range();
    }
    e
}

/// The label frame of an inferred category.
fn inferred(category: &str) -> Frame {
    Frame {
        file: infer::INFERRED.to_owned(),
        ..label(category)
    }
}

fn nearest<'c>(
    by_addr: &FxHashMap<u64, Vec<(f64, &'c str)>>,
    addr: u64,
    ts: f64,
) -> Option<&'c str> {
    by_addr
        .get(&addr)?
        .iter()
        .min_by(|a, b| (a.0 - ts).abs().total_cmp(&(b.0 - ts).abs()))
        .map(|c| c.1)
}

/// The frame of a complete event: operators are functions, `nn.Module: Name_N` links,
/// `file.py(line): name` calls user scopes at their file and line.
fn scope_frame(cat: &str, name: &str) -> Frame {
    let frame = |kind, file: &str, line, name: &str| Frame {
        kind,
        phase: Phase::None,
        file: file.to_owned(),
        line,
        name: name.to_owned(),
    };
    if cat == "cpu_op" {
        return frame(FrameKind::Function, "", 0, name);
    }
    // A `record_function` range (`Optimizer.step#AdamW.step`, the user's own): a phase, as a
    // snapshot's ranges are.
    if cat == "user_annotation" {
        return frame(FrameKind::Function, poolsight_schema::RANGE_FILE, 0, name);
    }
    if let Some(m) = name.strip_prefix("nn.Module: ") {
        let class = match m.rsplit_once('_') {
            Some((c, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => c,
            _ => m,
        };
        return frame(FrameKind::Link, "", 0, class);
    }
    if let Some((file, line, func)) = crate::frames::profiler_location(name) {
        return frame(FrameKind::Scope, file, line, func);
    }
    // A C function called from Python, named without its object's address (which differs
    // from run to run: two runs' same call would be two rows, two `diff` keys).
    if let Some(b) = crate::frames::builtin_name(name) {
        return frame(FrameKind::Scope, "", 0, &b);
    }
    frame(FrameKind::Scope, "", 0, name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_of_ranges() {
        let f = scope_frame("python_function", "nn.Module: Linear_0");
        assert_eq!((f.kind, f.name.as_str()), (FrameKind::Link, "Linear"));
        let f = scope_frame(
            "python_function",
            "torch/nn/modules/linear.py(130): forward",
        );
        assert_eq!(
            (f.file.as_str(), f.line, f.name.as_str()),
            ("torch/nn/modules/linear.py", 130, "forward")
        );
        let f = scope_frame("cpu_op", "aten::addmm");
        assert_eq!(f.kind, FrameKind::Function);
        let f = scope_frame("user_annotation", "Optimizer.step#AdamW.step");
        assert_eq!(
            (f.kind, f.file.as_str()),
            (FrameKind::Function, poolsight_schema::RANGE_FILE)
        );
        let f = scope_frame(
            "python_function",
            "<built-in method dropout of type object at 0x7fde9bcbc100>",
        );
        assert_eq!(
            (f.kind, f.name.as_str()),
            (FrameKind::Scope, "<built-in method dropout>")
        );
    }

    /// CUDA's backward pass runs on the autograd engine's device threads: what the forward
    /// made on the main thread is freed there. Whichever thread is read first, such a block was
    /// allocated in the file, not live from its start.
    #[test]
    fn a_block_freed_on_another_thread_was_allocated_in_the_file() {
        for (made, freed) in [(1, 2), (2, 1)] {
            let json = format!(
                r#"{{"traceEvents": [
                {{"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": {made}, "ts": 10.0, "args": {{"Bytes": 1000, "Addr": 4096, "Device Type": 1, "Device Id": 0}}}},
                {{"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": {freed}, "ts": 20.0, "args": {{"Bytes": -1000, "Addr": 4096, "Device Type": 1, "Device Id": 0}}}},
                {{"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": {made}, "ts": 30.0, "args": {{"Bytes": 500, "Addr": 8192, "Device Type": 1, "Device Id": 0}}}}
            ]}}"#
            );
            let ev = convert(json.as_bytes(), FrameFilter::Viewer).unwrap();
            assert!(!ev.overflowed, "tids {made} -> {freed}");
            // Two allocations (a malloc and its acquire each) and one free (and its release):
            // no block live from the start.
            assert_eq!(ev.len(), 6, "tids {made} -> {freed}");
        }
    }

    /// A damaged trace is told what is wrong where, in the form it has.
    #[test]
    fn a_damaged_trace_says_what_is_wrong_where() {
        let message = |json: &str| match convert(json.as_bytes(), FrameFilter::Viewer) {
            Err(ImportError::NotProfile(m)) => m,
            Err(e) => panic!("{json}: another error: {e}"),
            Ok(_) => panic!("{json}: read"),
        };
        let m = message(r#"{"traceEvents": 5}"#);
        assert!(
            m.contains("expected a sequence") && m.contains("column 17"),
            "{m}"
        );
        let m = message(r#"{"displayTimeUnit": "ms"}"#);
        assert!(m.contains("missing field `traceEvents`"), "{m}");
        let m = message(r#"[{"ph": 3}]"#);
        assert!(m.contains("invalid type: integer `3`"), "{m}");
        let m = message("  42");
        assert!(m.contains("a JSON object with \"traceEvents\""), "{m}");
        // Both forms still read.
        let event = r#"{"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 10.0, "args": {"Bytes": 1000, "Addr": 4096, "Device Type": 1, "Device Id": 0}}"#;
        for json in [
            format!(r#"{{"traceEvents": [{event}]}}"#),
            format!("[{event}]"),
        ] {
            assert!(
                convert(json.as_bytes(), FrameFilter::Viewer).is_ok(),
                "{json}"
            );
        }
    }

    #[test]
    fn memory_nests_under_the_open_operator() {
        let json = br#"{"traceEvents": [
            {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#4", "pid": 1, "tid": 1, "ts": 100.0, "dur": 50.0},
            {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 1, "tid": 1, "ts": 110.0, "dur": 5.0},
            {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 111.0, "args": {"Bytes": 512, "Addr": 4096, "Device Type": 0, "Device Id": -1}},
            {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 120.0, "args": {"Bytes": -512, "Addr": 4096, "Device Type": 0, "Device Id": -1}},
            {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 121.0, "args": {"Bytes": -256, "Addr": 8192, "Device Type": 0, "Device Id": -1}}
        ]}"#;
        let ev = convert(json, FrameFilter::Viewer).unwrap();
        assert!(ev.overflowed, "a free of an address never allocated");
        assert_eq!(
            (0..ev.stack_count() as u32)
                .filter(|&s| ev
                    .frames_of(Stack(s))
                    .last()
                    .is_some_and(|f| f.name == "aten::empty"))
                .count(),
            1
        );
        assert!(convert(b"{}", FrameFilter::Viewer).is_err());
        assert!(convert(b"{\"traceEvents\": []}", FrameFilter::Viewer).is_err());
    }
}
