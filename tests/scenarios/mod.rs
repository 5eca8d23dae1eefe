//! Small, deterministic recordings behind the golden files in `fixtures/`: each reproduces an
//! example of a seed. Their memory figures are the same on every run; their times are not,
//! which is why the committed traces, not fresh recordings, are what the time reports are
//! compared on.
//!
//! The line report names `file:line` of these scopes and calls: editing this file moves them,
//! and then `POOLSIGHT_BLESS=1 cargo test --test integration golden::` rewrites the fixtures.

use std::path::Path;
use std::sync::Arc;

use poolsight::pool::device::HostDevice;
use poolsight::pool::{MemoryPool, TraceHook};
use poolsight::recorder::{Phase, Recorder, RecorderConfig};

pub const NAMES: [&str; 5] = [
    "cupy_line_profile",
    "chainer_nested",
    "fastai_epochs",
    "two_ranks",
    "seed_fidelity",
];

fn recorder(path: &Path, name: &str, rank: Option<u32>) -> Recorder {
    let config = RecorderConfig {
        chunk_size: 4096,
        command_line: Some(vec!["poolsight-fixture".into(), name.into()]),
        rank,
        world_size: rank.map(|_| 2),
        // Blessing records the committed fixtures again, in place.
        overwrite: true,
        ..RecorderConfig::default()
    };
    Recorder::create(path, config).expect("create the fixture trace")
}

fn pool() -> MemoryPool {
    MemoryPool::new(Arc::new(HostDevice::new(0, 1 << 30)))
}

/// Records scenario `name` into `dir/name.pstrace` (or `name-rank{r}` files).
pub fn record(name: &str, dir: &Path) {
    match name {
        "cupy_line_profile" => cupy_line_profile(&dir.join("cupy_line_profile.pstrace")),
        "chainer_nested" => chainer_nested(&dir.join("chainer_nested.pstrace")),
        "fastai_epochs" => fastai_epochs(&dir.join("fastai_epochs.pstrace")),
        "seed_fidelity" => seed_fidelity(&dir.join("seed_fidelity.pstrace")),
        "two_ranks" => {
            for r in 0..2 {
                two_ranks(&dir.join(format!("two_ranks-rank{r}.pstrace")), r);
            }
        }
        other => panic!("no scenario {other}"),
    }
}

/// CuPy's `test_line_profile`: a block malloc'd and freed before the hook, then, hooked,
/// `malloc(1000)` reuses it (used 1 KB, nothing acquired) and `malloc(2000)` needs the device:
/// `_root (3.00KB, 2.00KB)`.
fn cupy_line_profile(path: &Path) {
    let rec = recorder(path, "cupy_line_profile", None);
    let pool = pool();
    drop(pool.malloc(1000).expect("malloc"));
    {
        let _hook = TraceHook::for_pool(rec.handle(), &pool).install();
        let _p1 = pool.malloc(1000).expect("malloc");
        let _p2 = pool.malloc(2000).expect("malloc");
    }
    rec.finish().expect("finish");
}

/// Chainer's accounting of nested functions: a call's used bytes include its nested calls,
/// so `Outer` counts `Inner`'s bytes, and `Outer` nested in itself counts the inner call's
/// bytes twice. The exclusive columns count each malloc once.
fn chainer_nested(path: &Path) {
    let rec = recorder(path, "chainer_nested", None);
    let h = rec.handle();
    let pool = pool();
    let _hook = TraceHook::for_pool(h.clone(), &pool).install();
    let mut keep = Vec::new();
    for _ in 0..2 {
        let _outer = h.function("Outer", Phase::Forward);
        keep.push(pool.malloc(1 << 20).expect("malloc"));
        {
            let _inner = h.function("Inner", Phase::Forward);
            keep.push(pool.malloc(3 << 20).expect("malloc"));
        }
        {
            let _again = h.function("Outer", Phase::Backward);
            keep.push(pool.malloc(512).expect("malloc"));
        }
    }
    {
        let _link = h.link("Linear");
        let _f = h.function("LinearFunction", Phase::Forward);
        drop(pool.malloc(4096).expect("malloc"));
    }
    drop(keep);
    drop(_hook);
    rec.finish().expect("finish");
}

const MB: u64 = 1 << 20;

/// fastai's rules (callbacks/mem.py `PeakMemMetric`), on the bytes the pool holds from the
/// device, with the cache emptied at each boundary as fastai's `gpu_mem_get_used_no_cache`
/// does: epoch 1 keeps 80 MB and peaks at 80 + 220 MB held (peak reported as 220, the
/// overhead over what it kept); epoch 2 frees 50 MB of it (cached: still held), then needs
/// 60 MB more: held peaks 60 MB above its start, and the end's release leaves 30 MB: used is
/// negative (-50), so the peak is the straight difference from its start (60), not 60 - (-50).
fn fastai_epochs(path: &Path) {
    let rec = recorder(path, "fastai_epochs", None);
    let h = rec.handle();
    let pool = pool();
    let _hook = TraceHook::for_pool(h.clone(), &pool).install();
    pool.free_all_blocks(None);
    h.epoch_begin(1);
    let mut kept = vec![pool.malloc(30 * MB).expect("malloc")];
    kept.push(pool.malloc(50 * MB).expect("malloc"));
    drop(pool.malloc(220 * MB).expect("malloc"));
    pool.free_all_blocks(None);
    h.epoch_end(1);
    pool.free_all_blocks(None);
    h.epoch_begin(2);
    kept.pop();
    drop(pool.malloc(60 * MB).expect("malloc"));
    pool.free_all_blocks(None);
    h.epoch_end(2);
    drop(kept);
    drop(_hook);
    rec.finish().expect("finish");
}

/// Two ranks of one job: the same step, rank 1 allocating twice as much.
fn two_ranks(path: &Path, rank: u32) {
    let rec = recorder(path, "two_ranks", Some(rank));
    let h = rec.handle();
    let pool = pool();
    let _hook = TraceHook::for_pool(h.clone(), &pool).install();
    h.epoch_begin(1);
    {
        let _l = h.link("Model");
        let _f = h.function("Conv", Phase::Forward);
        drop(pool.malloc((rank as u64 + 1) * MB).expect("malloc"));
    }
    h.epoch_end(1);
    drop(_hook);
    rec.finish().expect("finish");
}

/// The cases where poolsight used to differ from the seeds, in one run:
///
/// - `Step` takes 1 MB, then asks for 4 MB on a 4 MB device holding that 1 MB: the pool tries
///   the device three times (cupy/cuda/memory.pyx `_try_malloc`) and fails; the program
///   catches the error. Chainer's `CupyMemoryCumulativeHook` counts the request in
///   `malloc_preprocess` and each try in `alloc_preprocess`: used 1 + 4 = 5 MB, acquired
///   1 + 3 x 4 = 13 MB, and CuPy's line tree keeps the failing line.
/// - `Empty` mallocs 0 bytes: CuPy's tree shows the line with `(0.00B, 0.00B)`.
/// - `Sleep` (about 1 s), `Nap` (about 2 ms) and `Tick` (nothing: ns) span Chainer's time
///   units; `auto` prints the whole table in `sec`.
/// - One epoch around it all, the cache emptied at its boundaries as fastai does.
fn seed_fidelity(path: &Path) {
    let rec = recorder(path, "seed_fidelity", None);
    let h = rec.handle();
    let pool = MemoryPool::new(Arc::new(HostDevice::new(0, 4 * MB)));
    let _hook = TraceHook::for_pool(h.clone(), &pool).install();
    h.epoch_begin(1);
    let kept;
    {
        let _link = h.link("Model");
        {
            let _f = h.function("Step", Phase::Forward);
            kept = pool.malloc(MB).expect("malloc");
            let failed = pool.malloc(4 * MB);
            assert!(
                failed.is_err(),
                "4 MB cannot fit next to 1 MB on a 4 MB device"
            );
        }
        {
            let _f = h.function("Empty", Phase::Forward);
            drop(pool.malloc(0).expect("malloc(0)"));
        }
        {
            let _f = h.function("Sleep", Phase::Forward);
            std::thread::sleep(std::time::Duration::from_millis(1050));
        }
        {
            let _f = h.function("Nap", Phase::Forward);
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        drop(h.function("Tick", Phase::Forward));
    }
    drop(kept);
    pool.free_all_blocks(None);
    h.epoch_end(1);
    drop(_hook);
    rec.finish().expect("finish");
}
