//! The recorder's hot path against measureme's, in the same run (SPEC 6: <= 10 ns per event and
//! <= 0.5x measureme's `record_instant_event`), plus bytes per event on disk.
//!
//! Each criterion sample records into a fresh file that is deleted afterwards, so the disk holds
//! at most one sample's events at a time. `cargo bench -p poolsight-recorder --bench record`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use poolsight_recorder::{MemKind, MemRecord, Mode, Recorder, RecorderConfig};

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

fn poolsight(iters: u64, mode: Mode) -> Duration {
    let path = dir().join("bench.pstrace");
    let config = RecorderConfig {
        mode,
        calibration: Duration::from_millis(1),
        ..RecorderConfig::default()
    };
    let rec = Recorder::create(&path, config).expect("create trace");
    let h = rec.handle();
    h.record_mem(event(0)); // thread writer set up outside the timing
    let start = Instant::now();
    for i in 0..iters {
        h.record_mem(std::hint::black_box(event(i)));
    }
    let elapsed = start.elapsed();
    drop(rec);
    let _ = std::fs::remove_file(&path);
    elapsed
}

fn measureme(iters: u64) -> Duration {
    let stem = dir().join("bench-measureme");
    let profiler = measureme::Profiler::new(&stem).expect("measureme profiler");
    let kind = profiler.alloc_string("malloc");
    let id = measureme::EventId::from_label(profiler.alloc_string("LinearFunction"));
    let start = Instant::now();
    for _ in 0..iters {
        profiler.record_instant_event(kind, std::hint::black_box(id), 0);
    }
    let elapsed = start.elapsed();
    drop(profiler);
    let _ = std::fs::remove_file(stem.with_extension("mm_profdata"));
    elapsed
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

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("record_one_event");
    g.measurement_time(Duration::from_secs(3));
    g.sample_size(20);
    g.bench_function("poolsight_grow", |b| {
        b.iter_custom(|n| poolsight(n, Mode::Grow))
    });
    g.bench_function("poolsight_ring", |b| {
        b.iter_custom(|n| poolsight(n, Mode::Ring { slots: 512 }))
    });
    g.bench_function("measureme_record_instant_event", |b| {
        b.iter_custom(measureme)
    });
    g.finish();
    bytes_per_event();
}

criterion_group!(benches, bench);
criterion_main!(benches);
