//! Pool malloc+free round trips (pool hits, as in a training loop): without hooks, with a
//! do-nothing hook, and with the TraceHook in grow and ring mode, beside the recorder's floor,
//! one clock read, all in one run. The target: the TraceHook adds <= 2 x (floor + 5 ns) per pair
//! (a pair records two events).
//!
//! The contestants run interleaved, round after round; each figure is the median over the
//! rounds (min in brackets). `cargo bench -p poolsight-pool --bench pool [-- --rounds N]`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use poolsight_pool::device::HostDevice;
use poolsight_pool::hooks::{self, MemoryHook};
use poolsight_pool::{MemoryPool, TraceHook};
use poolsight_recorder::clock::{self, Calibration};
use poolsight_recorder::{Mode, Recorder, RecorderConfig};

/// Round trips per sample: two events each, 64 MiB of trace.
const PAIRS: u64 = 1 << 20;

struct NoOp;
impl MemoryHook for NoOp {}

fn pool() -> MemoryPool {
    let pool = MemoryPool::new(Arc::new(HostDevice::new(0, 1 << 30)));
    // Warm the cache so every round trip below is a pool hit, as in a training loop.
    drop(pool.malloc(4096).expect("warm-up malloc"));
    pool
}

/// ns per malloc+free pair.
fn round_trips(pool: &MemoryPool) -> f64 {
    let start = Instant::now();
    for _ in 0..PAIRS {
        drop(std::hint::black_box(pool.malloc(4096).expect("malloc")));
    }
    start.elapsed().as_nanos() as f64 / PAIRS as f64
}

fn floor() -> f64 {
    let start = Instant::now();
    for _ in 0..PAIRS {
        std::hint::black_box(clock::ticks());
    }
    start.elapsed().as_nanos() as f64 / PAIRS as f64
}

fn traced(p: &MemoryPool, mode: Mode, dir: &std::path::Path) -> f64 {
    let path = dir.join("pool.pstrace");
    let config = RecorderConfig {
        mode,
        calibration: Duration::from_millis(1),
        ..RecorderConfig::default()
    };
    let rec = Recorder::create(&path, config).expect("create trace");
    let guard = TraceHook::for_pool(rec.handle(), p).install();
    drop(p.malloc(4096).expect("first malloc interns its stack"));
    let t = round_trips(p);
    drop(guard);
    drop(rec);
    let _ = std::fs::remove_file(&path);
    t
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rounds = args
        .iter()
        .position(|a| a == "--rounds")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(9usize)
        .max(1);
    let dir = std::env::temp_dir().join(format!("poolsight-pool-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    Calibration::measure(Duration::from_millis(1));
    let p = pool();
    println!("load average before: {}", loadavg());
    let names = [
        "clock read (floor)",
        "malloc+free, no hooks",
        "malloc+free, no-op hook",
        "malloc+free, TraceHook grow",
        "malloc+free, TraceHook ring",
    ];
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    for _ in 0..rounds {
        samples[0].push(floor());
        samples[1].push(round_trips(&p));
        {
            let _guard = hooks::register(Arc::new(NoOp));
            samples[2].push(round_trips(&p));
        }
        samples[3].push(traced(&p, Mode::Grow, &dir));
        samples[4].push(traced(&p, Mode::Ring { slots: 512 }, &dir));
    }
    println!("load average after:  {}", loadavg());
    let mins: Vec<f64> = samples
        .iter()
        .map(|s| s.iter().copied().fold(f64::INFINITY, f64::min))
        .collect();
    let meds: Vec<f64> = samples.iter_mut().map(|s| median(s)).collect();
    println!("{rounds} rounds, median ns per operation (min):");
    for (i, name) in names.iter().enumerate() {
        println!("  {name:<30} {:>7.2} ns ({:>6.2})", meds[i], mins[i]);
    }
    let budget = 2.0 * (meds[0] + 5.0);
    for (i, mode) in [(3, "grow"), (4, "ring")] {
        let added = meds[i] - meds[1];
        println!(
            "  TraceHook adds ({mode}): {added:.2} ns per pair; target <= 2 x (floor + 5 ns) = {budget:.2}: {}",
            if added <= budget { "met" } else { "NOT met" }
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
