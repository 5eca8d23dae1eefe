//! Pool malloc+free round trips (pool hits, as in a training loop): without hooks, with a
//! do-nothing hook, and with the TraceHook in grow and ring mode (registered, and bound to its
//! pool with `record_to`), beside the recorder's floor, one clock read, all in one run. The target: the TraceHook adds <= 2 x (floor + 5 ns) per pair
//! (a pair records two events).
//!
//! The contestants run interleaved, round after round; each figure is the median over the
//! rounds (min in brackets). `cargo bench -p poolsight-pool --bench pool [-- --rounds N]`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use poolsight_pool::device::HostDevice;
use poolsight_pool::hooks::{self, MemoryHook};
use poolsight_pool::{MemoryPool, TraceHook};
#[path = "../../recorder/benches/shared/mod.rs"]
mod harness;

use poolsight_recorder::clock::Calibration;
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

/// ns per malloc+free pair, over `pairs` of them.
fn round_trips(pool: &MemoryPool, pairs: u64) -> f64 {
    let start = Instant::now();
    for _ in 0..pairs {
        drop(std::hint::black_box(pool.malloc(4096).expect("malloc")));
    }
    start.elapsed().as_nanos() as f64 / pairs as f64
}

/// ns per malloc+free pair with a `TraceHook` in `mode`: registered for this thread
/// (`install`), or bound to a pool of its own (`record_to`, what the C ABI and Python do).
fn traced(p: &MemoryPool, mode: Mode, bound: bool, dir: &std::path::Path) -> f64 {
    let path = dir.join("pool.pstrace");
    let config = RecorderConfig {
        mode,
        calibration: Duration::from_millis(1),
        ..RecorderConfig::default()
    };
    let rec = Recorder::create(&path, config).expect("create trace");
    let own = pool(); // a pool takes one hook for life
    let (p, guard) = if bound {
        let hook = TraceHook::for_pool(rec.handle(), &own);
        own.record_to(hook).expect("a new pool has no hook");
        (&own, None)
    } else {
        (p, Some(TraceHook::for_pool(rec.handle(), p).install()))
    };
    round_trips(p, 1); // the first malloc from this call site interns its stack
    let t = round_trips(p, PAIRS);
    drop(guard);
    drop(rec);
    let _ = std::fs::remove_file(&path);
    t
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rounds = harness::rounds(&args);
    let dir = std::env::temp_dir().join(format!("poolsight-pool-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    Calibration::measure(Duration::from_millis(1));
    let p = pool();
    let names = [
        "clock read (floor)",
        "malloc+free, no hooks",
        "malloc+free, no-op hook",
        "malloc+free, TraceHook grow",
        "malloc+free, TraceHook ring",
        "malloc+free, bound TraceHook grow",
    ];
    let contestants: [&dyn Fn() -> f64; 6] = [
        &|| harness::floor(PAIRS),
        &|| round_trips(&p, PAIRS),
        &|| {
            let _guard = hooks::register(Arc::new(NoOp));
            round_trips(&p, PAIRS)
        },
        &|| traced(&p, Mode::Grow, false, &dir),
        &|| traced(&p, Mode::Ring { slots: 512 }, false, &dir),
        &|| traced(&p, Mode::Grow, true, &dir),
    ];
    let (meds, mins) = harness::interleaved(&contestants, rounds, |_| true);
    println!("{rounds} rounds, median ns per operation (min):");
    for (i, name) in names.iter().enumerate() {
        println!("  {name:<34} {:>7.2} ns ({:>6.2})", meds[i], mins[i]);
    }
    let budget = 2.0 * (meds[0] + 5.0);
    for (i, mode) in [(3, "grow"), (4, "ring"), (5, "bound, grow")] {
        let added = meds[i] - meds[1];
        println!(
            "  TraceHook adds ({mode}): {added:.2} ns per pair; target <= 2 x (floor + 5 ns) = {budget:.2}: {}",
            if added <= budget { "met" } else { "NOT met" }
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
