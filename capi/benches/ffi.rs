//! Pool malloc+free through the C ABI vs through the Rust API, same run, same pool setup
//! (a 4 KiB request served from the cache), with and without a recording.
//!
//!     cargo bench -p poolsight-capi --bench ffi

use std::ffi::CString;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use poolsight_capi::ffi::{
    ps_pool_create_host, ps_pool_destroy, ps_pool_free, ps_pool_malloc, ps_recorder_create,
    ps_recorder_finish,
};
use poolsight_pool::device::HostDevice;
use poolsight_pool::{MemoryPool, TraceHook};
use poolsight_recorder::{Recorder, RecorderConfig};

const N: u64 = 2_000_000;
const REPEATS: usize = 7;

fn median_ns(mut f: impl FnMut(u64)) -> f64 {
    let mut samples: Vec<f64> = (0..REPEATS)
        .map(|_| {
            let t = Instant::now();
            f(N);
            t.elapsed().as_nanos() as f64 / N as f64
        })
        .collect();
    samples.sort_by(|a, b| a.total_cmp(b));
    samples[REPEATS / 2]
}

fn trace(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!(
        "poolsight-ffi-bench-{name}-{}.pstrace",
        std::process::id()
    ))
}

fn main() {
    let mut rows: Vec<(&str, f64)> = Vec::new();

    let pool = MemoryPool::new(Arc::new(HostDevice::new(0, 1 << 30)));
    rows.push((
        "Rust API, no recording",
        median_ns(|n| {
            for _ in 0..n {
                drop(black_box(pool.malloc(4096).expect("malloc")));
            }
        }),
    ));

    // SAFETY: every pointer passed below comes from the matching create call and is used
    // before its destroy/finish.
    unsafe {
        let c = ps_pool_create_host(std::ptr::null(), 0, 1 << 30);
        rows.push((
            "C ABI, no recording",
            median_ns(|n| {
                for _ in 0..n {
                    let p = ps_pool_malloc(c, 4096, 0, 0);
                    ps_pool_free(c, black_box(p));
                }
            }),
        ));
        ps_pool_destroy(c);
    }

    let path = trace("rust");
    let rec = Recorder::create(&path, RecorderConfig::default()).expect("recorder");
    let pool = MemoryPool::new(Arc::new(HostDevice::new(0, 1 << 30)));
    let hook = TraceHook::for_pool(rec.handle(), &pool).install();
    rows.push((
        "Rust API, recorded (TraceHook)",
        median_ns(|n| {
            for _ in 0..n {
                drop(black_box(pool.malloc(4096).expect("malloc")));
            }
        }),
    ));
    drop(hook);
    rec.finish().expect("finish");
    let _ = std::fs::remove_file(&path);

    let path = trace("c");
    let cpath = CString::new(path.to_string_lossy().as_bytes()).expect("path");
    // SAFETY: as above.
    unsafe {
        let r = ps_recorder_create(cpath.as_ptr(), std::ptr::null());
        assert!(!r.is_null(), "recorder");
        let c = ps_pool_create_host(r, 0, 1 << 30);
        rows.push((
            "C ABI, recorded",
            median_ns(|n| {
                for _ in 0..n {
                    let p = ps_pool_malloc(c, 4096, 0, 0);
                    ps_pool_free(c, black_box(p));
                }
            }),
        ));
        ps_pool_destroy(c);
        ps_recorder_finish(r);
    }
    let _ = std::fs::remove_file(&path);

    println!("pool malloc+free of 4 KiB (cache hit), median of {REPEATS} x {N}");
    for (name, ns) in &rows {
        println!("  {name:<32} {ns:7.1} ns");
    }
    println!(
        "  C ABI over Rust API: +{:.1} ns unrecorded, +{:.1} ns recorded (the address map and the FFI checks)",
        rows[1].1 - rows[0].1,
        rows[3].1 - rows[2].1
    );
}
