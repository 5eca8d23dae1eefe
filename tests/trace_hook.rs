//! The TraceHook turns each pool callback into the memory event trace.fbs describes, with the
//! allocation's stack (open scopes plus the call site).

#[path = "support/mod.rs"]
mod support;

use support::common;

use std::sync::{Arc, Mutex, MutexGuard};

use common::{trace_path, Trace};
use poolsight::pool::device::HostDevice;
use poolsight::pool::{MemoryPool, TraceHook};
use poolsight::recorder::{Phase, Recorder, RecorderConfig};
use poolsight::schema::fb::{self, MemKind};

/// Global hooks see every thread's pool operations, so tests of this file that install one run
/// alone.
static GLOBAL_LOCK: Mutex<()> = Mutex::new(());

fn global_lock() -> MutexGuard<'static, ()> {
    GLOBAL_LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn setup(name: &str, capacity: u64) -> (Recorder, MemoryPool) {
    let rec = Recorder::create(trace_path(name), RecorderConfig::default()).expect("recorder");
    let pool = MemoryPool::new(Arc::new(HostDevice::new(3, capacity)));
    (rec, pool)
}

/// CuPy's callbacks for a malloc that misses the cache and its free, with pre events.
const CUPY_ORDER_MISS: [MemKind; 6] = [
    MemKind::MallocPre,
    MemKind::AllocPre,
    MemKind::AllocPost,
    MemKind::MallocPost,
    MemKind::FreePre,
    MemKind::FreePost,
];

fn kinds(t: &Trace) -> Vec<MemKind> {
    t.mem.iter().map(|e| e.kind()).collect()
}

#[test]
fn malloc_and_free_become_post_events_with_the_pool_figures() {
    let _g = global_lock();
    let (rec, pool) = setup("hook-basic", 1 << 20);
    let path = rec.path();
    let (ptr, pmem, line) = {
        let _hook = TraceHook::for_pool(rec.handle(), &pool).install();
        let (m, line) = (pool.malloc(1000).expect("malloc"), line!());
        let reused = {
            drop(pool.malloc(1000).expect("malloc"));
            pool.malloc(700).expect("malloc")
        };
        drop(reused);
        (m.ptr(), m.pmem_id(), line)
    };
    rec.finish().expect("finish");
    let t = Trace::read(&path);
    assert_eq!(
        kinds(&t),
        [
            MemKind::AllocPost,
            MemKind::MallocPost,
            MemKind::AllocPost,
            MemKind::MallocPost,
            MemKind::FreePost,
            MemKind::MallocPost,
            MemKind::FreePost,
            MemKind::FreePost,
        ]
    );
    let first_alloc = t.mem[0];
    assert_eq!((first_alloc.bytes(), first_alloc.ptr()), (1024, ptr));
    let malloc = t.mem[1];
    assert_eq!(malloc.device(), 3);
    assert_eq!(
        malloc.bytes(),
        1000,
        "MallocPost carries the requested size"
    );
    assert_eq!((malloc.ptr(), malloc.pmem() as u64), (ptr, pmem));
    assert_eq!(
        malloc.stack(),
        first_alloc.stack(),
        "alloc shares the malloc's stack"
    );
    let reuse = t.mem[5];
    assert_eq!(reuse.bytes(), 700);
    let free_of_first = t.mem[7];
    assert_eq!(free_of_first.bytes(), 1024, "FreePost carries mem_size");
    assert_eq!(
        (free_of_first.ptr(), free_of_first.pmem() as u64),
        (ptr, pmem)
    );
    assert_eq!(free_of_first.stack(), 0);

    let site = t.frame(malloc.stack());
    assert_eq!(site.kind, fb::FrameKind::Site);
    assert_eq!((site.file.as_str(), site.line), (file!(), line));
    assert_eq!(site.name, "<top>", "outside any scope");
    assert_eq!(t.parent(malloc.stack()), 0);

    assert_eq!(t.devices.len(), 1);
    assert_eq!(t.devices[0].id, 3);
    assert_eq!(t.devices[0].capacity, 1 << 20);
    assert_eq!(t.devices[0].allocation_unit, 512);
}

#[test]
fn an_allocation_stack_is_the_open_scopes_plus_the_call_site() {
    let _g = global_lock();
    let (rec, pool) = setup("hook-stacks", 1 << 20);
    let path = rec.path();
    let h = rec.handle();
    let (outer_scope, line) = {
        let _hook = TraceHook::new(h.clone()).install();
        let _link = h.link("Linear");
        let f = h.function("LinearFunction", Phase::Forward);
        let mut kept = Vec::new();
        let mut line = 0;
        for _ in 0..3 {
            let m;
            (m, line) = (pool.malloc(2048).expect("malloc"), line!());
            kept.push(m);
        }
        (f.stack(), line)
    };
    rec.finish().expect("finish");
    let t = Trace::read(&path);
    let mallocs = t.mem_of(MemKind::MallocPost);
    assert_eq!(mallocs.len(), 3);
    let stack = mallocs[0].stack();
    assert!(
        mallocs.iter().all(|m| m.stack() == stack),
        "one site, one stack"
    );
    assert_eq!(t.parent(stack), outer_scope);
    assert_eq!(
        t.names(stack),
        ["Linear", "LinearFunction", "LinearFunction"]
    );
    let site = t.frame(stack);
    assert_eq!((site.kind, site.line), (fb::FrameKind::Site, line));
    assert!(t.devices.is_empty(), "TraceHook::new defines no device");
}

#[test]
fn pre_events_follow_cupys_callback_order_when_asked_for() {
    let _g = global_lock();
    let (rec, pool) = setup("hook-pre", 1 << 20);
    let path = rec.path();
    {
        let _hook = TraceHook::for_pool(rec.handle(), &pool)
            .with_pre_events(true)
            .install();
        drop(pool.malloc(100).expect("malloc"));
    }
    rec.finish().expect("finish");
    let t = Trace::read(&path);
    assert_eq!(kinds(&t), CUPY_ORDER_MISS);
    assert_eq!(t.mem[0].bytes(), 100);
    assert_eq!(t.mem[1].bytes(), 512);
    assert_eq!(t.mem[0].stack(), t.mem[3].stack());
    assert_ne!(t.mem[0].stack(), 0);
}

#[test]
fn limit_out_of_memory_and_release_are_recorded() {
    let _g = global_lock();
    let (rec, pool) = setup("hook-oom", 1 << 20);
    let path = rec.path();
    {
        let _hook = TraceHook::for_pool(rec.handle(), &pool).install();
        pool.set_limit(4096);
        let held = pool.malloc(3000).expect("malloc");
        assert!(pool.malloc(2000).is_err(), "over the limit");
        drop(held);
        assert_eq!(pool.free_all_blocks(None), 3072);
    }
    rec.finish().expect("finish");
    let t = Trace::read(&path);
    let limit = t.mem_of(MemKind::LimitSet);
    assert_eq!(limit.len(), 1);
    assert_eq!(limit[0].bytes(), 4096);
    let oom = t.mem_of(MemKind::OutOfMemory);
    assert_eq!(oom.len(), 1);
    assert_eq!(oom[0].bytes(), 2048, "requested, rounded");
    assert_eq!(oom[0].ptr(), 3072, "held from the device");
    let failed: Vec<_> = t
        .mem_of(MemKind::MallocPost)
        .into_iter()
        .filter(|m| m.ptr() == 0)
        .collect();
    assert_eq!(failed.len(), 1, "the failed malloc's post event");
    assert_eq!((failed[0].bytes(), failed[0].pmem()), (2000, 0));
    let release = t.mem_of(MemKind::Release);
    assert_eq!(release.len(), 1);
    assert_eq!(release[0].bytes(), 3072);
}

#[test]
fn a_device_is_defined_once_per_recorder() {
    let (rec, pool) = setup("hook-device-once", 1 << 20);
    let path = rec.path();
    let _a = TraceHook::for_pool(rec.handle(), &pool);
    let _b = TraceHook::for_pool(rec.handle(), &pool.clone());
    rec.finish().expect("finish");
    let t = Trace::read(&path);
    assert_eq!(t.devices.len(), 1);
    assert_eq!(t.devices[0].id, 3);
}

#[test]
fn a_global_hook_records_other_threads_with_their_own_stacks() {
    let _g = global_lock();
    let (rec, pool) = setup("hook-global", 1 << 20);
    let path = rec.path();
    let h = rec.handle();
    {
        let _hook = TraceHook::for_pool(h.clone(), &pool).install_global();
        let _main_scope = h.scope("main");
        let (h2, pool2) = (h.clone(), pool.clone());
        std::thread::spawn(move || {
            let _s = h2.scope("worker");
            drop(pool2.malloc(512).expect("malloc"));
        })
        .join()
        .expect("worker");
    }
    rec.finish().expect("finish");
    let t = Trace::read(&path);
    let mallocs = t.mem_of(MemKind::MallocPost);
    assert_eq!(mallocs.len(), 1);
    assert_eq!(t.names(mallocs[0].stack()), ["worker", "worker"]);
    assert_eq!(t.mem_of(MemKind::FreePost).len(), 1);
}

#[test]
fn failed_requests_and_attempts_count_in_functions_and_lines_but_not_in_the_pool() {
    use poolsight::analyzer::tables::{functions, lines};
    use poolsight::analyzer::{replay, ReplayOptions};
    let _g = global_lock();
    // The device, not a limit, refuses: attempts then reach the device and fail there.
    let (rec, pool) = setup("hook-oom-counts", 4096);
    let path = rec.path();
    {
        let h = rec.handle();
        let _hook = TraceHook::for_pool(h.clone(), &pool).install();
        let _f = h.function("Grow", Phase::Forward);
        let held = pool.malloc(3000).expect("malloc");
        assert!(pool.malloc(2000).is_err(), "the device is full");
        drop(held);
    }
    rec.finish().expect("finish");
    let t = Trace::read(&path);
    let attempts = t.mem_of(MemKind::AllocPost).len() as u64;
    assert!(
        attempts >= 2,
        "the first allocation and at least one failed attempt"
    );
    let trace = poolsight::analyzer::Trace::open(&path).expect("trace opens");
    let p = replay(&trace, 0, &ReplayOptions::default());
    let f = functions::functions(&p);
    assert_eq!(f.functions.len(), 1);
    // CuPy's and Chainer's hooks count at malloc_preprocess and alloc_preprocess: the
    // failed request (2048 rounded) and every failed device-allocation attempt count.
    assert_eq!(f.functions[0].used_bytes, 3072 + 2048);
    assert_eq!(f.functions[0].acquired_bytes, 3072 + (attempts - 1) * 2048);
    let l = lines::lines(&p, 0);
    assert_eq!(l.root.used_bytes, 3072 + 2048);
    assert_eq!(l.root.acquired_bytes, 3072 + (attempts - 1) * 2048);
    let pool_figures = &p.sources[0].pool;
    assert_eq!(
        pool_figures.peak_used_bytes, 3072,
        "the pool never held the failed request"
    );
}

#[test]
fn an_addressed_allocation_with_stack_0_records_the_open_scopes() {
    let _g = global_lock();
    let (rec, pool) = setup("hook-addressed", 1 << 20);
    let path = rec.path();
    let h = rec.handle();
    let scope = {
        let _hook = TraceHook::new(h.clone()).install();
        let pool = poolsight::pool::AddressedPool::new(pool);
        let f = h.function("Conv", Phase::Forward);
        let a = pool.malloc(512, 0, 0).expect("malloc");
        let b = pool.malloc(512, 0, 12345).expect("malloc");
        pool.free(a).expect("free");
        pool.free(b).expect("free");
        f.stack()
    };
    rec.finish().expect("finish");
    let t = Trace::read(&path);
    let stacks: Vec<u32> = t
        .mem_of(MemKind::MallocPost)
        .iter()
        .map(|m| m.stack())
        .collect();
    assert_ne!(scope, 0);
    assert_eq!(
        stacks,
        [scope, 12345],
        "0: the open scopes (no call site); any other id as given"
    );
}

/// Another hook beside the TraceHook, one that takes the pre callbacks: the TraceHook then gets
/// them too, and still writes pre events only when asked to, as when it is alone.
#[test]
fn a_trace_hook_beside_another_hook_records_the_same_events() {
    struct Quiet;
    impl poolsight::pool::hooks::MemoryHook for Quiet {
        fn wants_pre(&self) -> bool {
            true
        }
    }
    let _g = global_lock();
    for pre in [false, true] {
        let (rec, pool) = setup(&format!("hook-beside-{pre}"), 1 << 20);
        let path = rec.path();
        {
            let _other = poolsight::pool::hooks::register(Arc::new(Quiet));
            let _hook = TraceHook::for_pool(rec.handle(), &pool)
                .with_pre_events(pre)
                .install();
            drop(pool.malloc(100).expect("malloc"));
        }
        rec.finish().expect("finish");
        let got = kinds(&Trace::read(&path));
        let want: &[MemKind] = if pre {
            &CUPY_ORDER_MISS
        } else {
            &[MemKind::AllocPost, MemKind::MallocPost, MemKind::FreePost]
        };
        assert_eq!(got, want, "pre events {pre}");
    }
}

/// A pool bound to a trace (`MemoryPool::record_to`) records there and only there, from any
/// thread, after any registered hooks; a pool bound to none is not recorded by it.
#[test]
fn pools_bound_to_their_own_traces_record_only_there() {
    let _g = global_lock();
    let (rec_a, pool_a) = setup("bound-a", 1 << 20);
    let (rec_b, pool_b) = setup("bound-b", 1 << 20);
    let unbound = MemoryPool::new(Arc::new(HostDevice::new(0, 1 << 20)));
    pool_a
        .record_to(TraceHook::for_pool(rec_a.handle(), &pool_a))
        .expect("first hook");
    pool_b
        .record_to(TraceHook::for_pool(rec_b.handle(), &pool_b))
        .expect("first hook");
    assert!(
        pool_a.record_to(TraceHook::new(rec_b.handle())).is_err(),
        "one hook per pool"
    );
    drop(pool_a.malloc(1000).unwrap()); // 1024 bytes
    std::thread::scope(|s| {
        s.spawn(|| drop(pool_b.malloc(3000).unwrap())); // 3072, from another thread
    });
    drop(unbound.malloc(5000).unwrap());
    let (path_a, path_b) = (rec_a.path(), rec_b.path());
    rec_a.finish().unwrap();
    rec_b.finish().unwrap();
    let sizes = |t: &Trace| -> Vec<(MemKind, u64)> {
        t.mem.iter().map(|e| (e.kind(), e.bytes())).collect()
    };
    assert_eq!(
        sizes(&Trace::read(&path_a)),
        [
            (MemKind::AllocPost, 1024),
            (MemKind::MallocPost, 1000),
            (MemKind::FreePost, 1024)
        ]
    );
    assert_eq!(
        sizes(&Trace::read(&path_b)),
        [
            (MemKind::AllocPost, 3072),
            (MemKind::MallocPost, 3000),
            (MemKind::FreePost, 3072)
        ]
    );
}

/// The pool reads the clock for a malloc and a free inside its lock, so a block freed on one
/// thread and handed out again on another keeps the pool's order in the trace however late the
/// free's hooks run: the replay never counts the block twice.
#[test]
fn a_block_reused_on_another_thread_keeps_the_pools_order() {
    use poolsight::analyzer::{replay, ReplayOptions, Trace as Verified};
    use poolsight::pool::hooks::{self, FreeInfo, MemoryHook};
    use std::sync::mpsc;
    const WAIT: std::time::Duration = std::time::Duration::from_secs(10);

    /// Runs before the pool's TraceHook on the freeing thread: says the block is back, then
    /// waits until the other thread has taken it again and recorded its malloc.
    struct Stall {
        back: mpsc::Sender<()>,
        go: Mutex<mpsc::Receiver<()>>,
    }
    impl MemoryHook for Stall {
        fn free_postprocess(&self, _: &FreeInfo) {
            self.back.send(()).unwrap();
            // A bounded wait: were the hooks run under the pool's lock, the other thread
            // could never take the block, and the test would hang instead of failing.
            let go = self.go.lock().unwrap().recv_timeout(WAIT);
            go.expect("the other thread took the block again");
        }
    }

    let _g = global_lock();
    let (rec, pool) = setup("hook-reuse", 1 << 20);
    let path = rec.path();
    pool.record_to(TraceHook::for_pool(rec.handle(), &pool))
        .expect("first hook");
    let first = pool.malloc(4096).expect("malloc");
    let ptr = first.ptr();
    let (back_tx, back_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel();
    let again = std::thread::scope(|s| {
        s.spawn(move || {
            let _stall = hooks::register(Arc::new(Stall {
                back: back_tx,
                go: Mutex::new(go_rx),
            }));
            drop(first);
        });
        s.spawn(move || {
            back_rx.recv_timeout(WAIT).expect("the block was freed");
            let again = pool.malloc(4096).expect("malloc");
            go_tx.send(()).unwrap();
            again
        })
        .join()
        .unwrap()
    });
    assert_eq!(again.ptr(), ptr, "the block was handed out again");
    drop(again);
    rec.finish().expect("finish");
    let t = Verified::open(&path).expect("open");
    let profile = replay(&t, 0, &ReplayOptions::default());
    let pool_figures = &profile.sources[0].pool;
    assert_eq!(pool_figures.mallocs, 2);
    assert_eq!(
        pool_figures.peak_used_bytes, 4096,
        "one block live at a time, as the pool had it"
    );
}
