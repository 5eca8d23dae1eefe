//! `export`: a small run recorded, exported as Chrome trace JSON and as JSON Lines, and read
//! back with serde_json as Perfetto or pandas would read it.

use crate::support::common;

use std::path::Path;
use std::sync::Arc;

use common::trace_path;
use poolsight::analyzer::export::{
    chrome, jsonl, ExportSummary, CPU_TRACK, EPOCHS_TID, HELD_TRACK, USED_TRACK,
};
use poolsight::analyzer::{replay, Profile, ReplayOptions, Trace};
use poolsight::pool::device::HostDevice;
use poolsight::pool::{MemoryPool, TraceHook};
use poolsight::recorder::{Phase, Recorder, RecorderConfig};
use serde_json::Value;

/// What the recorded run did, to compare the exports with.
struct Run {
    path: std::path::PathBuf,
    /// The pool's used bytes at their highest, read from the pool itself.
    peak_used: u64,
    /// Source lines where the scopes were opened: (link, first function, second function).
    lines: (u32, u32, u32),
}

/// An epoch holding a link with two functions in it, three mallocs in the first, one in the
/// second, and a request the 1 MiB device cannot satisfy.
fn record(name: &str, config: RecorderConfig, names: [&str; 3]) -> Run {
    let rec = Recorder::create(trace_path(name), config).expect("recorder");
    let path = rec.path();
    let pool = MemoryPool::new(Arc::new(HostDevice::new(0, 1 << 20)));
    let h = rec.handle();
    let mut peak_used = 0;
    let lines;
    {
        let _hook = TraceHook::for_pool(h.clone(), &pool).install();
        h.epoch_begin(1);
        {
            let (_link, link_line) = (h.link(names[0]), line!());
            let first_line = {
                let (_f, line) = (h.function(names[1], Phase::Forward), line!());
                let a = pool.malloc(1000).expect("malloc");
                peak_used = peak_used.max(pool.used_bytes());
                let b = pool.malloc(3000).expect("malloc");
                peak_used = peak_used.max(pool.used_bytes());
                drop(a);
                let c = pool.malloc(200_000).expect("malloc");
                peak_used = peak_used.max(pool.used_bytes());
                drop((b, c));
                line
            };
            let (_g, second_line) = (h.function(names[2], Phase::Backward), line!());
            let d = pool.malloc(500).expect("malloc");
            peak_used = peak_used.max(pool.used_bytes());
            assert!(pool.malloc(4 << 20).is_err(), "more than the device holds");
            drop(d);
            lines = (link_line, first_line, second_line);
        }
        h.epoch_end(1);
    }
    rec.finish().expect("finish");
    Run {
        path,
        peak_used,
        lines,
    }
}

/// Mallocs `record` asks for, and how many of them succeed.
const MALLOCS: usize = 5;
const GRANTED: usize = 4;

fn open(path: &Path) -> (Trace, Profile) {
    let trace = Trace::open(path).expect("trace opens");
    assert!(trace.warnings.is_empty(), "{:?}", trace.warnings);
    let opts = ReplayOptions {
        series_points: 64,
        ..ReplayOptions::default()
    };
    let profile = replay(&trace, 0, &opts);
    (trace, profile)
}

fn export_chrome(pairs: &[(&Trace, &Profile)]) -> (Vec<u8>, ExportSummary) {
    let mut out = Vec::new();
    let summary = chrome(pairs, &mut out).expect("chrome export");
    (out, summary)
}

fn export_jsonl(trace: &Trace) -> (Vec<u8>, ExportSummary) {
    let mut out = Vec::new();
    let summary = jsonl(trace, &mut out).expect("jsonl export");
    (out, summary)
}

/// The `traceEvents` array of a Chrome export.
fn chrome_events(bytes: &[u8]) -> Vec<Value> {
    let doc: Value = serde_json::from_slice(bytes).expect("the export is one JSON document");
    assert_eq!(doc["displayTimeUnit"], "ns");
    doc["traceEvents"]
        .as_array()
        .expect("traceEvents is an array")
        .clone()
}

fn of_phase<'a>(events: &'a [Value], ph: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["ph"] == ph).collect()
}

/// Microseconds with three decimals back to integer ns, so intervals compare exactly.
fn ns(v: &Value) -> u64 {
    let us = v.as_f64().expect("a number of microseconds");
    (us * 1000.0).round() as u64
}

/// (start, end) of a slice in ns.
fn span(e: &Value) -> (u64, u64) {
    let start = ns(&e["ts"]);
    (start, start + ns(&e["dur"]))
}

fn slice<'a>(slices: &[&'a Value], name: &str) -> &'a Value {
    let found: Vec<_> = slices.iter().filter(|e| e["name"] == name).collect();
    assert_eq!(found.len(), 1, "one slice named {name}");
    found[0]
}

fn lines(bytes: &[u8]) -> Vec<Value> {
    let text = std::str::from_utf8(bytes).expect("UTF-8");
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

#[test]
fn chrome_export_has_a_nested_slice_per_scope_and_the_pool_peak_as_counter() {
    let run = record(
        "export-chrome",
        RecorderConfig::default(),
        ["Model", "Linear", "ReLU"],
    );
    let (trace, profile) = open(&run.path);
    let (bytes, summary) = export_chrome(&[(&trace, &profile)]);
    let events = chrome_events(&bytes);
    assert_eq!(summary.records as usize, events.len());

    let slices: Vec<&Value> = of_phase(&events, "X")
        .into_iter()
        .filter(|e| e["cat"] != "epoch")
        .collect();
    let mut names: Vec<&str> = slices.iter().filter_map(|e| e["name"].as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["Linear", "Model", "ReLU"], "one slice per scope");
    assert_eq!(summary.scopes, 3);

    let (link, linear, relu) = (
        slice(&slices, "Model"),
        slice(&slices, "Linear"),
        slice(&slices, "ReLU"),
    );
    assert_eq!(
        (&link["cat"], &linear["cat"], &relu["cat"]),
        (
            &Value::from("link"),
            &Value::from("function"),
            &Value::from("function")
        )
    );
    assert_eq!(linear["args"]["phase"], "forward");
    assert_eq!(relu["args"]["phase"], "backward");
    assert_eq!(link["args"]["phase"], "none");
    for (e, line) in [
        (link, run.lines.0),
        (linear, run.lines.1),
        (relu, run.lines.2),
    ] {
        assert_eq!(e["args"]["file"], file!());
        assert_eq!(e["args"]["line"], line);
        assert_eq!(e["pid"], 0, "no rank: the trace's index");
    }
    let (l, a, b) = (span(link), span(linear), span(relu));
    assert!(l.0 <= a.0 && a.1 <= l.1, "Linear {a:?} inside Model {l:?}");
    assert!(l.0 <= b.0 && b.1 <= l.1, "ReLU {b:?} inside Model {l:?}");
    assert!(a.1 <= b.0, "Linear {a:?} closes before ReLU {b:?} opens");

    // Every scope's thread is named, and the process after the trace.
    let tid = &linear["tid"];
    assert!(slices.iter().all(|e| &e["tid"] == tid), "one thread");
    let meta = of_phase(&events, "M");
    assert!(meta
        .iter()
        .any(|m| m["name"] == "thread_name" && &m["tid"] == tid && m["args"]["name"].is_string()));
    let process = meta
        .iter()
        .find(|m| m["name"] == "process_name")
        .expect("process_name");
    assert_eq!(process["args"]["name"], run.path.display().to_string());

    let counters = of_phase(&events, "C");
    assert!(!counters.is_empty());
    assert!(counters
        .iter()
        .all(|c| [USED_TRACK, HELD_TRACK, CPU_TRACK].contains(&c["name"].as_str().unwrap_or(""))));
    let track = |name: &str| -> Vec<&Value> {
        counters
            .iter()
            .copied()
            .filter(|c| c["name"] == name)
            .collect()
    };
    let max = |name: &str| {
        track(name)
            .iter()
            .filter_map(|c| c["args"]["bytes"].as_u64())
            .max()
            .unwrap_or(0)
    };
    let pool = &profile.sources[0].pool;
    assert_eq!(max(USED_TRACK), run.peak_used, "the pool's own peak");
    assert_eq!(max(USED_TRACK), pool.peak_used_bytes);
    assert_eq!(max(HELD_TRACK), pool.peak_acquired_bytes);
    assert!(pool.peak_acquired_bytes >= run.peak_used);
    let used = track(USED_TRACK);
    assert_eq!(
        used.len(),
        track(HELD_TRACK).len(),
        "one sample of each per point"
    );
    let (first, last) = (used[0], used[used.len() - 1]);
    assert_eq!(
        (ns(&first["ts"]), &first["args"]["bytes"]),
        (0, &Value::from(0))
    );
    assert_eq!(last["args"]["bytes"], pool.used_at_end_bytes);
    assert_eq!(ns(&last["ts"]), profile.sources[0].duration_ns);
    let times: Vec<u64> = used.iter().map(|c| ns(&c["ts"])).collect();
    assert!(times.windows(2).all(|p| p[0] < p[1]), "{times:?}");

    let epochs: Vec<&Value> = of_phase(&events, "X")
        .into_iter()
        .filter(|e| e["cat"] == "epoch")
        .collect();
    assert_eq!(epochs.len(), 1);
    assert_eq!(epochs[0]["name"], "epoch 1");
    assert_eq!(epochs[0]["tid"], EPOCHS_TID);
    assert_eq!(epochs[0]["args"]["complete"], true);
    let e = span(epochs[0]);
    assert!(e.0 <= l.0 && l.1 <= e.1, "Model {l:?} inside epoch {e:?}");
    assert!(meta
        .iter()
        .any(|m| m["tid"] == EPOCHS_TID && m["args"]["name"] == "epochs"));

    let ooms = of_phase(&events, "i");
    assert_eq!(ooms.len(), 1, "one out-of-memory instant");
    assert_eq!(ooms[0]["name"], "out_of_memory");
    assert_eq!(ooms[0]["args"]["requested_bytes"], 4u64 << 20);
    let oom = ns(&ooms[0]["ts"]);
    assert!(b.0 <= oom && oom <= b.1, "during ReLU");
}

#[test]
fn jsonl_has_every_event_on_a_line_of_its_own() {
    let run = record(
        "export-jsonl",
        RecorderConfig::default(),
        ["Model", "Linear", "ReLU"],
    );
    let (trace, _) = open(&run.path);
    let (bytes, summary) = export_jsonl(&trace);
    let rows = lines(&bytes);
    assert_eq!(rows.len() as u64, summary.records);

    let typ = |r: &Value| r["type"].as_str().unwrap_or("").to_owned();
    let stacks = rows.iter().take_while(|r| typ(r) == "stack").count();
    assert!(stacks > 0);
    assert!(
        rows[stacks..].iter().all(|r| typ(r) != "stack"),
        "stacks come first"
    );
    let ids: Vec<u64> = rows[..stacks]
        .iter()
        .filter_map(|r| r["id"].as_u64())
        .collect();
    assert!(ids.windows(2).all(|p| p[0] < p[1]), "sorted by id: {ids:?}");
    for r in &rows[stacks..] {
        if let Some(s) = r["stack"].as_u64().filter(|&s| s != 0) {
            assert!(ids.contains(&s), "stack {s} of {r} is defined");
        }
    }
    let count = |t: &str| rows.iter().filter(|r| typ(r) == t).count();

    let mallocs: Vec<&Value> = rows.iter().filter(|r| typ(r) == "malloc_post").collect();
    assert_eq!(mallocs.len(), MALLOCS, "every malloc, the failed one too");
    let granted = mallocs.iter().filter(|m| m["ptr"] != 0).count();
    assert_eq!(granted, GRANTED);
    assert_eq!(count("free_post"), GRANTED);
    assert_eq!(count("out_of_memory"), 1);
    assert_eq!(mallocs[0]["bytes"], 1000, "the requested size");
    assert!(mallocs.iter().all(|m| m["device"] == 0 && m["stream"] == 0));

    assert_eq!((count("function"), count("link")), (2, 1));
    let model = rows
        .iter()
        .find(|r| typ(r) == "link")
        .expect("the link's scope event");
    let model_stack = rows[..stacks]
        .iter()
        .find(|r| r["id"] == model["stack"])
        .expect("its stack line");
    assert_eq!(
        (
            &model_stack["name"],
            &model_stack["kind"],
            &model_stack["line"]
        ),
        (
            &Value::from("Model"),
            &Value::from("link"),
            &Value::from(run.lines.0)
        )
    );
    assert_eq!(model_stack["file"], file!());
    assert_eq!(model_stack["parent"], 0);
    let end = model["end_ns"].as_u64().expect("end_ns");
    let duration = model["duration_ns"].as_u64().expect("duration_ns");
    assert!(duration <= end);

    let marks: Vec<(String, &Value)> = rows
        .iter()
        .filter(|r| typ(r).starts_with("epoch_"))
        .map(|r| (typ(r), &r["epoch"]))
        .collect();
    assert_eq!(
        marks,
        [
            ("epoch_begin".to_owned(), &Value::from(1)),
            ("epoch_end".to_owned(), &Value::from(1))
        ]
    );
    assert_eq!(summary.mem_events as usize, rows.len() - stacks - 5);
}

#[test]
fn exports_are_byte_identical_and_keep_any_name_intact() {
    let names = [
        "quote\"d \\back\\slash",
        "ünïcødé ✓ 模型 🚀",
        "tab\tnew\nline\u{1}",
    ];
    let run = record("export-names", RecorderConfig::default(), names);
    let (trace, profile) = open(&run.path);

    let (first, _) = export_chrome(&[(&trace, &profile)]);
    let (second, _) = export_chrome(&[(&trace, &profile)]);
    assert!(first == second, "chrome: same trace, same bytes");
    let (first_lines, _) = export_jsonl(&trace);
    let (second_lines, _) = export_jsonl(&trace);
    assert!(first_lines == second_lines, "jsonl: same trace, same bytes");

    let events = chrome_events(&first);
    let mut got: Vec<&str> = of_phase(&events, "X")
        .iter()
        .filter(|e| e["cat"] != "epoch")
        .filter_map(|e| e["name"].as_str())
        .collect();
    got.sort_unstable();
    let mut want = names.to_vec();
    want.sort_unstable();
    assert_eq!(got, want);

    let stack_names: Vec<String> = lines(&first_lines)
        .iter()
        .filter(|r| r["type"] == "stack")
        .filter_map(|r| r["name"].as_str().map(str::to_owned))
        .collect();
    for n in names {
        assert!(
            stack_names.iter().any(|s| s == n),
            "{n:?} in {stack_names:?}"
        );
    }
}

#[test]
fn ranks_of_one_job_become_processes_on_one_time_axis() {
    let config = |rank| RecorderConfig {
        rank: Some(rank),
        world_size: Some(2),
        ..RecorderConfig::default()
    };
    let first = record("export-rank1", config(1), ["Model", "Linear", "ReLU"]);
    let second = record("export-rank0", config(0), ["Model", "Linear", "ReLU"]);
    let (t1, p1) = open(&first.path);
    let (t0, p0) = open(&second.path);
    let (bytes, summary) = export_chrome(&[(&t1, &p1), (&t0, &p0)]);
    let events = chrome_events(&bytes);
    assert_eq!(summary.scopes, 6);

    let pids: Vec<u64> = of_phase(&events, "X")
        .iter()
        .filter_map(|e| e["pid"].as_u64())
        .collect();
    assert_eq!(
        pids.iter().filter(|&&p| p == 1).count(),
        4,
        "3 scopes, 1 epoch"
    );
    assert_eq!(pids.iter().filter(|&&p| p == 0).count(), 4);
    let process = |pid: u64| {
        events
            .iter()
            .find(|e| e["name"] == "process_name" && e["pid"] == pid)
            .and_then(|e| e["args"]["name"].as_str())
            .unwrap_or("")
            .to_owned()
    };
    assert!(process(1).starts_with("rank 1: "), "{}", process(1));
    assert!(process(0).starts_with("rank 0: "), "{}", process(0));

    // Rank 0 was recorded after rank 1 finished: on the shared axis its scopes come later.
    let model_start = |pid: u64| {
        of_phase(&events, "X")
            .iter()
            .find(|e| e["name"] == "Model" && e["pid"] == pid)
            .map(|e| span(e).0)
            .expect("Model slice")
    };
    let rank1_end = of_phase(&events, "X")
        .iter()
        .filter(|e| e["pid"] == 1)
        .map(|e| span(e).1)
        .max()
        .unwrap_or(0);
    assert!(model_start(1) < model_start(0));
    assert!(rank1_end <= model_start(0));
}

#[test]
fn chrome_export_has_the_cpu_readings_on_their_own_track() {
    use poolsight::recorder::{CpuSource, MarkKind};
    let rec = Recorder::create(
        trace_path("export-cpu"),
        RecorderConfig {
            cpu_source: CpuSource::Rss,
            ..RecorderConfig::default()
        },
    )
    .expect("recorder");
    let path = rec.path();
    let h = rec.handle();
    h.record_mark(MarkKind::EpochBegin, 1, 1000, 0);
    h.record_mark(MarkKind::CpuSample, 0, 5000, 0);
    h.record_mark(MarkKind::EpochEnd, 1, 3000, 5000);
    rec.finish().expect("finish");

    let (trace, profile) = open(&path);
    let (bytes, _) = export_chrome(&[(&trace, &profile)]);
    let events = chrome_events(&bytes);
    let cpu: Vec<u64> = of_phase(&events, "C")
        .into_iter()
        .filter(|c| c["name"] == CPU_TRACK)
        .map(|c| c["args"]["bytes"].as_u64().expect("bytes"))
        .collect();
    assert_eq!(cpu, [1000, 5000, 3000], "every reading, in time order");
}
