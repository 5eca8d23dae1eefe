//! The recorder's hot path against its floor and its peers, all in one run, with the targets:
//!
//! - the floor: one read of the recorder's clock (`rdtsc` where the TSC is invariant);
//! - one memory event in grow mode and in ring mode (target: <= floor + 5 ns);
//! - a scope guard, open + close (target: <= floor + 10 ns);
//! - measureme's `record_instant_event` and a Tracy span (`tracy-client`, no server connected;
//!   a span is two Tracy events, so its per-event cost is half a span).
//!
//! The contestants run interleaved, round after round, so a burst of load from another process
//! hits them alike; each figure is the median over the rounds (min in brackets), and the ratios
//! to the floor are what to compare across machines. Every sample records into a fresh file that
//! is deleted afterwards, so grow mode pays for fresh file pages as a real run does. Then bytes
//! per event on disk. `cargo bench -p poolsight-recorder --bench record [-- --rounds N]`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

#[path = "shared/mod.rs"]
mod harness;

use poolsight_recorder::clock::Calibration;
use poolsight_recorder::{MemKind, MemRecord, Mode, Recorder, RecorderConfig};

/// Events per memory-event sample: 64 MiB of trace, far more than any cache holds.
const EVENTS: u64 = 2 << 20;
/// Scopes per sample.
const SCOPES: u64 = 1 << 20;
/// Spans per Tracy sample. With no server connected Tracy keeps every event in memory, so this
/// bounds what the benchmark holds (rounds x spans x 2 events x 32 bytes).
const TRACY_SPANS: u64 = 1 << 19;

fn dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("poolsight-bench-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

fn event(i: u64) -> MemRecord {
    MemRecord {
        kind: MemKind::MallocPost,
        device: 0,
        stream: 0,
        ptr: 0x7f00_0000_0000 + (i << 9),
        bytes: 4096,
        stack: 3,
        pmem: i as u32,
    }
}

fn config(mode: Mode) -> RecorderConfig {
    RecorderConfig {
        mode,
        calibration: Duration::from_millis(1),
        ..RecorderConfig::default()
    }
}

/// ns per clock read.
fn floor() -> f64 {
    harness::floor(EVENTS)
}

/// ns per memory event.
fn memory_event(mode: Mode) -> f64 {
    let path = dir().join("bench.pstrace");
    let rec = Recorder::create(&path, config(mode)).expect("create trace");
    let h = rec.handle();
    h.record_mem(event(0)); // thread writer set up outside the timing
    let start = Instant::now();
    for i in 0..EVENTS {
        h.record_mem(std::hint::black_box(event(i)));
    }
    let elapsed = start.elapsed();
    drop(rec);
    let _ = std::fs::remove_file(&path);
    elapsed.as_nanos() as f64 / EVENTS as f64
}

/// ns per scope guard opened and closed, in grow mode.
fn scope_guard() -> f64 {
    let path = dir().join("scope.pstrace");
    let rec = Recorder::create(&path, config(Mode::Grow)).expect("create trace");
    let h = rec.handle();
    let outer = h.scope("epoch"); // a parent, as in a training loop
    drop(h.scope("step")); // interned outside the timing
    let start = Instant::now();
    for _ in 0..SCOPES {
        let g = h.scope(std::hint::black_box("step"));
        drop(g);
    }
    let elapsed = start.elapsed();
    drop(outer);
    drop(rec);
    let _ = std::fs::remove_file(&path);
    elapsed.as_nanos() as f64 / SCOPES as f64
}

/// ns per `record_instant_event`.
fn measureme() -> f64 {
    let stem = dir().join("bench-measureme");
    let profiler = measureme::Profiler::new(&stem).expect("measureme profiler");
    let kind = profiler.alloc_string("malloc");
    let id = measureme::EventId::from_label(profiler.alloc_string("LinearFunction"));
    let start = Instant::now();
    for _ in 0..EVENTS {
        profiler.record_instant_event(kind, std::hint::black_box(id), 0);
    }
    let elapsed = start.elapsed();
    drop(profiler);
    let _ = std::fs::remove_file(stem.with_extension("mm_profdata"));
    elapsed.as_nanos() as f64 / EVENTS as f64
}

/// ns per Tracy span (begin + end), as its `span!` macro opens one.
fn tracy() -> f64 {
    let start = Instant::now();
    for _ in 0..TRACY_SPANS {
        let span = tracy_client::span!("step", 0);
        drop(std::hint::black_box(span));
    }
    start.elapsed().as_nanos() as f64 / TRACY_SPANS as f64
}

fn bytes_per_event() {
    let path = dir().join("bytes.pstrace");
    let rec = Recorder::create(&path, RecorderConfig::default()).expect("create trace");
    let h = rec.handle();
    let n = 1_000_000u64;
    for i in 0..n {
        h.record_mem(event(i));
    }
    let summary = rec.finish().expect("finish");
    let len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    println!(
        "bytes on disk: {len} for {} memory events = {:.2} bytes/event (MemEvent is 32 bytes; the rest is headers, definitions and chunk framing)",
        summary.events,
        len as f64 / n as f64
    );
    let _ = std::fs::remove_file(&path);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rounds = harness::rounds(&args);
    Calibration::measure(Duration::from_millis(1)); // fixes the clock source, as a recorder does
    let _tracy = tracy_client::Client::start();
    let names = [
        "clock read (floor)",
        "memory event, grow mode",
        "memory event, ring mode",
        "scope guard open+close",
        "measureme record_instant_event",
        "Tracy span (begin+end)",
    ];
    // `--only WORD`: run the contestants whose name contains WORD (and the floor), for a
    // profiler's eyes; the targets are then judged on what ran.
    let only = harness::arg(&args, "--only");
    let runs = |i: usize| i == 0 || only.is_none_or(|w| names[i].contains(w.as_str()));
    let contestants: [&dyn Fn() -> f64; 6] = [
        &floor,
        &|| memory_event(Mode::Grow),
        &|| memory_event(Mode::Ring { slots: 512 }),
        &scope_guard,
        &measureme,
        &tracy,
    ];
    let (meds, mins) = harness::interleaved(&contestants, rounds, runs);
    let floor = meds[0];
    println!("{rounds} rounds, median ns per operation (min), and minus the floor:");
    for (i, name) in names.iter().enumerate().filter(|&(i, _)| runs(i)) {
        println!(
            "  {name:<32} {:>7.2} ns ({:>6.2})   floor + {:>6.2} ns",
            meds[i],
            mins[i],
            meds[i] - floor
        );
    }
    let tracy_event = meds[5] / 2.0;
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    println!("targets (medians of this run):");
    for (i, what, slack) in [
        (1, "memory event, grow", 5.0),
        (2, "memory event, ring", 5.0),
        (3, "scope guard", 10.0),
    ] {
        if runs(i) {
            println!(
                "  {what} <= floor + {slack} ns: {:.2} <= {:.2}: {}; below Tracy's per-event cost (half a span, {tracy_event:.2} ns): {}",
                meds[i],
                floor + slack,
                verdict(meds[i] <= floor + slack),
                if runs(5) { verdict(meds[i] < tracy_event) } else { "not run" },
            );
        }
    }
    if runs(3) && runs(5) {
        // Like for like: both time a region, with a clock read at each end.
        println!(
            "  scope guard vs a Tracy span (each open + close, two clock reads): {:.2} vs {:.2} ns = {:.2}x; per clock read {:.2} vs {:.2} ns",
            meds[3],
            meds[5],
            meds[3] / meds[5],
            meds[3] / 2.0,
            tracy_event
        );
    }
    if runs(1) && runs(2) && runs(4) {
        println!(
            "  vs measureme: grow {:.2}x, ring {:.2}x",
            meds[1] / meds[4],
            meds[2] / meds[4]
        );
    }
    bytes_per_event();
    let _ = std::fs::remove_dir_all(dir());
}
