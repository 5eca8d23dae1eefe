//! Pool malloc+free round trips: without hooks, with a do-nothing hook, and with the TraceHook
//! (SPEC 6: the TraceHook adds <= 30 ns per pair). `cargo bench -p poolsight-pool --bench pool`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use poolsight_pool::device::HostDevice;
use poolsight_pool::hooks::{self, MemoryHook};
use poolsight_pool::{MemoryPool, TraceHook};
use poolsight_recorder::{Mode, Recorder, RecorderConfig};

struct NoOp;
impl MemoryHook for NoOp {}

fn pool() -> MemoryPool {
    let pool = MemoryPool::new(Arc::new(HostDevice::new(0, 1 << 30)));
    // Warm the cache so every round trip below is a pool hit, as in a training loop.
    drop(pool.malloc(4096).expect("warm-up malloc"));
    pool
}

fn round_trips(pool: &MemoryPool, iters: u64) -> Duration {
    let start = Instant::now();
    for _ in 0..iters {
        drop(std::hint::black_box(pool.malloc(4096).expect("malloc")));
    }
    start.elapsed()
}

fn bench(c: &mut Criterion) {
    let dir = std::env::temp_dir().join(format!("poolsight-pool-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut g = c.benchmark_group("pool_malloc_free");
    g.measurement_time(Duration::from_secs(3));
    g.sample_size(20);
    let p = pool();
    g.bench_function("no_hooks", |b| b.iter_custom(|n| round_trips(&p, n)));
    g.bench_function("noop_hook", |b| {
        let _guard = hooks::register(Arc::new(NoOp));
        b.iter_custom(|n| round_trips(&p, n))
    });
    for (name, mode) in [
        ("trace_hook_grow", Mode::Grow),
        ("trace_hook_ring", Mode::Ring { slots: 512 }),
    ] {
        g.bench_function(name, |b| {
            b.iter_custom(|n| {
                let path = dir.join("pool.pstrace");
                let config = RecorderConfig {
                    mode,
                    calibration: Duration::from_millis(1),
                    ..RecorderConfig::default()
                };
                let rec = Recorder::create(&path, config).expect("create trace");
                let guard = TraceHook::for_pool(rec.handle(), &p).install();
                drop(p.malloc(4096).expect("first malloc interns its stack"));
                let t = round_trips(&p, n);
                drop(guard);
                drop(rec);
                let _ = std::fs::remove_file(&path);
                t
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
