//! CuPy's MemoryHook contract: which callbacks fire, in which order, with which arguments, and
//! who sees them (thread-local vs global registration).

use std::io::Write;
use std::panic::Location;
use std::sync::{Arc, Mutex, MutexGuard};

use poolsight_pool::device::{Device, DeviceError, HostDevice};
use poolsight_pool::hooks::{
    self, AllocPost, AllocPre, DebugPrintHook, FreeInfo, LimitSet, MallocPost, MallocPre,
    MemoryHook, OutOfMemory, Release,
};
use poolsight_pool::{MemoryPool, PoolError};

/// Tests that register global hooks, or assert that none are registered, take this lock, since
/// all tests of this file share one process.
static GLOBAL_LOCK: Mutex<()> = Mutex::new(());

fn global_lock() -> MutexGuard<'static, ()> {
    GLOBAL_LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Ev {
    MallocPre(MallocPre),
    MallocPost(MallocPost),
    AllocPre(AllocPre),
    AllocPost(AllocPost),
    FreePre(FreeInfo),
    FreePost(FreeInfo),
    Release(Release),
    Oom(OutOfMemory),
    Limit(LimitSet),
}

impl Ev {
    fn name(&self) -> &'static str {
        match self {
            Ev::MallocPre(_) => "malloc_pre",
            Ev::MallocPost(_) => "malloc_post",
            Ev::AllocPre(_) => "alloc_pre",
            Ev::AllocPost(_) => "alloc_post",
            Ev::FreePre(_) => "free_pre",
            Ev::FreePost(_) => "free_post",
            Ev::Release(_) => "release",
            Ev::Oom(_) => "out_of_memory",
            Ev::Limit(_) => "limit_set",
        }
    }

    fn device_id(&self) -> u32 {
        match self {
            Ev::MallocPre(e) => e.device_id,
            Ev::MallocPost(e) => e.device_id,
            Ev::AllocPre(e) => e.device_id,
            Ev::AllocPost(e) => e.device_id,
            Ev::FreePre(e) | Ev::FreePost(e) => e.device_id,
            Ev::Release(e) => e.device_id,
            Ev::Oom(e) => e.device_id,
            Ev::Limit(e) => e.device_id,
        }
    }
}

/// Records every event, tagged with the hook's label, into a log that may be shared.
struct Recorder {
    label: &'static str,
    log: Arc<Mutex<Vec<(&'static str, Ev)>>>,
    /// What [`MemoryHook::wants_pre`] answers.
    pre: bool,
}

impl Recorder {
    fn new(label: &'static str) -> Arc<Self> {
        Self::shared(label, Arc::default())
    }

    fn shared(label: &'static str, log: Arc<Mutex<Vec<(&'static str, Ev)>>>) -> Arc<Self> {
        Arc::new(Recorder {
            label,
            log,
            pre: true,
        })
    }

    fn post_only(label: &'static str) -> Arc<Self> {
        Arc::new(Recorder {
            label,
            log: Arc::default(),
            pre: false,
        })
    }

    fn push(&self, e: Ev) {
        self.log.lock().unwrap().push((self.label, e));
    }

    fn events(&self) -> Vec<Ev> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .map(|(_, e)| e.clone())
            .collect()
    }

    fn events_on(&self, device_id: u32) -> Vec<Ev> {
        self.events()
            .into_iter()
            .filter(|e| e.device_id() == device_id)
            .collect()
    }

    fn names(&self) -> Vec<&'static str> {
        self.events().iter().map(Ev::name).collect()
    }

    fn clear(&self) {
        self.log.lock().unwrap().clear();
    }
}

impl MemoryHook for Recorder {
    fn name(&self) -> &str {
        self.label
    }
    fn wants_pre(&self) -> bool {
        self.pre
    }
    fn malloc_preprocess(&self, i: &MallocPre) {
        self.push(Ev::MallocPre(*i));
    }
    // The pool stamps what it hands out and takes back inside its lock (`ticks`); the log
    // keeps the events without it, so that the tests compare what does not depend on the clock.
    fn malloc_postprocess(&self, i: &MallocPost) {
        assert_eq!(
            i.ticks != 0,
            i.pmem_id != 0,
            "stamped iff it succeeded: {i:?}"
        );
        self.push(Ev::MallocPost(MallocPost { ticks: 0, ..*i }));
    }
    fn alloc_preprocess(&self, i: &AllocPre) {
        self.push(Ev::AllocPre(*i));
    }
    fn alloc_postprocess(&self, i: &AllocPost) {
        self.push(Ev::AllocPost(*i));
    }
    fn free_preprocess(&self, i: &FreeInfo) {
        assert_eq!(i.ticks, 0, "not yet known before the lock: {i:?}");
        self.push(Ev::FreePre(*i));
    }
    fn free_postprocess(&self, i: &FreeInfo) {
        assert_ne!(i.ticks, 0, "stamped inside the lock: {i:?}");
        self.push(Ev::FreePost(FreeInfo { ticks: 0, ..*i }));
    }
    fn release(&self, i: &Release) {
        self.push(Ev::Release(*i));
    }
    fn out_of_memory(&self, i: &OutOfMemory) {
        self.push(Ev::Oom(*i));
    }
    fn limit_set(&self, i: &LimitSet) {
        self.push(Ev::Limit(*i));
    }
}

fn host_pool(id: u32, capacity: u64) -> MemoryPool {
    MemoryPool::new(Arc::new(HostDevice::new(id, capacity)))
}

/// A device whose allocations fail with a driver error (not out-of-memory).
struct BrokenDevice;

impl Device for BrokenDevice {
    fn id(&self) -> u32 {
        7
    }
    fn name(&self) -> String {
        "broken".into()
    }
    fn capacity(&self) -> u64 {
        1 << 30
    }
    fn alloc(&self, _size: u64) -> Result<u64, DeviceError> {
        Err(DeviceError::Driver("injected failure".into()))
    }
    unsafe fn free(&self, _ptr: u64, _size: u64) {}
    fn copy_from_host(&self, _dst: u64, _src: &[u8]) -> Result<(), DeviceError> {
        Err(DeviceError::Driver("injected failure".into()))
    }
    fn copy_to_host(&self, _src: u64, _dst: &mut [u8]) -> Result<(), DeviceError> {
        Err(DeviceError::Driver("injected failure".into()))
    }
}

#[test]
fn miss_order_and_fields() {
    let pool = host_pool(3, 1 << 20);
    let rec = Recorder::new("rec");
    let _g = hooks::register(rec.clone());
    let (m, line) = (pool.malloc_on(1000, 5).unwrap(), line!());
    let ev = rec.events();
    let here: &'static Location<'static> = match &ev[0] {
        Ev::MallocPre(p) => p.caller,
        e => panic!("unexpected {e:?}"),
    };
    assert_eq!(here.line(), line, "caller is the line of the malloc call");
    assert!(here.file().ends_with("hooks.rs"), "{}", here.file());
    assert_eq!(
        ev,
        vec![
            Ev::MallocPre(MallocPre {
                device_id: 3,
                size: 1000,
                mem_size: 1024,
                stream: 5,
                caller: here,
            }),
            Ev::AllocPre(AllocPre {
                device_id: 3,
                mem_size: 1024,
                stream: 5,
                caller: here,
            }),
            Ev::AllocPost(AllocPost {
                device_id: 3,
                mem_size: 1024,
                mem_ptr: m.ptr(),
                stream: 5,
                caller: here,
            }),
            Ev::MallocPost(MallocPost {
                device_id: 3,
                size: 1000,
                mem_size: 1024,
                mem_ptr: m.ptr(),
                pmem_id: m.pmem_id(),
                stream: 5,
                caller: here,
                ticks: 0,
            }),
        ]
    );
    assert_ne!(m.ptr(), 0);
}

#[test]
fn hit_skips_alloc_hooks_and_free_order() {
    let pool = host_pool(0, 1 << 20);
    let rec = Recorder::new("rec");
    let _g = hooks::register(rec.clone());
    let first = pool.malloc(700).unwrap();
    let (ptr, id1) = (first.ptr(), first.pmem_id());
    drop(first);
    assert_eq!(
        rec.names(),
        [
            "malloc_pre",
            "alloc_pre",
            "alloc_post",
            "malloc_post",
            "free_pre",
            "free_post"
        ]
    );
    let free = FreeInfo {
        device_id: 0,
        mem_size: 1024,
        mem_ptr: ptr,
        pmem_id: id1,
        stream: 0,
        ticks: 0,
    };
    let ev = rec.events();
    assert_eq!(ev[4], Ev::FreePre(free));
    assert_eq!(ev[5], Ev::FreePost(free));

    rec.clear();
    let (second, line) = (pool.malloc(1024).unwrap(), line!());
    assert_eq!(rec.names(), ["malloc_pre", "malloc_post"]);
    match &rec.events()[0] {
        Ev::MallocPre(p) => {
            assert_eq!(p.caller.line(), line, "malloc passes its own caller on");
            assert!(p.caller.file().ends_with("hooks.rs"));
        }
        e => panic!("unexpected {e:?}"),
    }
    match &rec.events()[1] {
        Ev::MallocPost(p) => {
            assert_eq!(p.mem_ptr, ptr);
            assert_eq!(p.pmem_id, second.pmem_id());
            assert_ne!(p.pmem_id, id1, "pmem_id must be unique per malloc");
        }
        e => panic!("unexpected {e:?}"),
    }
}

#[test]
fn error_order_posts_zero() {
    let pool = MemoryPool::new(Arc::new(BrokenDevice));
    let rec = Recorder::new("rec");
    let _g = hooks::register(rec.clone());
    let err = pool.malloc(10).unwrap_err();
    assert_eq!(
        err,
        PoolError::Device(DeviceError::Driver("injected failure".into()))
    );
    assert_eq!(
        rec.names(),
        ["malloc_pre", "alloc_pre", "alloc_post", "malloc_post"],
        "a non-OOM device error is not retried and is not an out_of_memory event"
    );
    let ev = rec.events();
    assert!(matches!(
        ev[2],
        Ev::AllocPost(AllocPost {
            mem_ptr: 0,
            mem_size: 512,
            ..
        })
    ));
    assert!(matches!(
        ev[3],
        Ev::MallocPost(MallocPost {
            mem_ptr: 0,
            pmem_id: 0,
            size: 10,
            device_id: 7,
            ..
        })
    ));
    assert_eq!(
        pool.total_bytes(),
        0,
        "a failed allocation must not stay reserved"
    );
}

#[test]
fn oom_sequence() {
    let pool = host_pool(0, 4096);
    let rec = Recorder::new("rec");
    let _g = hooks::register(rec.clone());
    let a = pool.malloc(2048).unwrap();
    let b = pool.malloc(2048).unwrap();
    drop((a, b));
    rec.clear();
    // Fits only once the two cached 2048-byte blocks went back to the device.
    let c = pool.malloc(4096).unwrap();
    assert_eq!(
        rec.names(),
        [
            "malloc_pre",
            "alloc_pre",
            "alloc_post",
            "release",
            "alloc_pre",
            "alloc_post",
            "malloc_post"
        ]
    );
    let ev = rec.events();
    assert!(matches!(ev[2], Ev::AllocPost(AllocPost { mem_ptr: 0, .. })));
    assert_eq!(
        ev[3],
        Ev::Release(Release {
            device_id: 0,
            bytes: 4096,
            stream: 0
        })
    );
    assert!(matches!(ev[5], Ev::AllocPost(AllocPost { mem_ptr, .. }) if mem_ptr == c.ptr()));

    rec.clear();
    let err = pool.malloc(1).unwrap_err();
    assert_eq!(
        rec.names(),
        [
            "malloc_pre",
            "alloc_pre",
            "alloc_post",
            "alloc_pre",
            "alloc_post",
            "alloc_pre",
            "alloc_post",
            "out_of_memory",
            "malloc_post"
        ],
        "cupy/cuda/memory.pyx _try_malloc: three device tries (first, after free_all_blocks, \
         after gc.collect() and free_all_blocks); nothing to release, so no release event"
    );
    let ev = rec.events();
    for i in [2, 4, 6] {
        assert!(matches!(
            ev[i],
            Ev::AllocPost(AllocPost {
                mem_ptr: 0,
                mem_size: 512,
                ..
            })
        ));
    }
    assert_eq!(
        ev[7],
        Ev::Oom(OutOfMemory {
            device_id: 0,
            requested: 512,
            total: 4096,
            limit: 0,
            stream: 0
        })
    );
    assert!(matches!(
        ev[8],
        Ev::MallocPost(MallocPost {
            mem_ptr: 0,
            pmem_id: 0,
            size: 1,
            ..
        })
    ));
    assert_eq!(
        err,
        PoolError::OutOfMemory {
            device_id: 0,
            requested: 512,
            total: 4096,
            limit: 0
        }
    );
}

#[test]
fn limit_set_event_and_limit_oom() {
    let pool = host_pool(0, 1 << 20);
    let rec = Recorder::new("rec");
    let _g = hooks::register(rec.clone());
    pool.set_limit(1024);
    assert_eq!(
        rec.events(),
        vec![Ev::Limit(LimitSet {
            device_id: 0,
            limit: 1024
        })]
    );
    rec.clear();
    // Larger than the limit itself: fails without asking the device.
    let err = pool.malloc(2000).unwrap_err();
    assert_eq!(rec.names(), ["malloc_pre", "out_of_memory", "malloc_post"]);
    assert_eq!(
        err,
        PoolError::OutOfMemory {
            device_id: 0,
            requested: 2048,
            total: 0,
            limit: 1024
        }
    );
}

#[test]
fn thread_local_hooks_do_not_see_other_threads() {
    let pool = host_pool(0, 1 << 20);
    let rec = Recorder::new("a");
    let _g = hooks::register(rec.clone());
    let p2 = pool.clone();
    std::thread::spawn(move || {
        let other = Recorder::new("b");
        let _g = hooks::register(other.clone());
        drop(p2.malloc(100).unwrap());
        assert_eq!(
            other.names().len(),
            6,
            "b sees its own thread: {:?}",
            other.names()
        );
    })
    .join()
    .unwrap();
    assert!(rec.events().is_empty(), "a saw {:?}", rec.names());
    drop(pool.malloc(100).unwrap());
    assert_eq!(
        rec.names(),
        ["malloc_pre", "malloc_post", "free_pre", "free_post"]
    );
}

#[test]
fn global_hook_sees_all_threads_after_local_ones() {
    let _lock = global_lock();
    const DEV: u32 = 901;
    let pool = host_pool(DEV, 1 << 20);
    let log = Arc::new(Mutex::new(Vec::new()));
    let global = Recorder::shared("global", log.clone());
    let local = Recorder::shared("local", log.clone());
    let gg = hooks::register_global(global.clone());
    let lg = hooks::register(local.clone());
    let p2 = pool.clone();
    std::thread::spawn(move || drop(p2.malloc_on(100, 1).unwrap()))
        .join()
        .unwrap();
    let from_thread: Vec<_> = log
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, e)| e.device_id() == DEV)
        .map(|(l, e)| (*l, e.name()))
        .collect();
    assert_eq!(
        from_thread,
        [
            ("global", "malloc_pre"),
            ("global", "alloc_pre"),
            ("global", "alloc_post"),
            ("global", "malloc_post"),
            ("global", "free_pre"),
            ("global", "free_post"),
        ]
    );
    log.lock().unwrap().clear();
    drop(pool.malloc(100).unwrap());
    let here: Vec<_> = log
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, e)| e.device_id() == DEV)
        .map(|(l, e)| (*l, e.name()))
        .collect();
    assert_eq!(
        here,
        [
            ("local", "malloc_pre"),
            ("global", "malloc_pre"),
            ("local", "alloc_pre"),
            ("global", "alloc_pre"),
            ("local", "alloc_post"),
            ("global", "alloc_post"),
            ("local", "malloc_post"),
            ("global", "malloc_post"),
            ("local", "free_pre"),
            ("global", "free_pre"),
            ("local", "free_post"),
            ("global", "free_post"),
        ]
    );
    drop(gg);
    log.lock().unwrap().clear();
    let p3 = pool.clone();
    std::thread::spawn(move || drop(p3.malloc(100).unwrap()))
        .join()
        .unwrap();
    assert!(global.events_on(DEV).is_empty(), "global hook unregistered");
    drop(lg);
    assert!(!hooks::has_hooks());
    assert!(hooks::current().is_none());
}

#[test]
fn no_hooks_means_none() {
    let _lock = global_lock();
    assert!(!hooks::has_hooks());
    assert!(hooks::current().is_none());
    let g = hooks::register(Recorder::new("x"));
    assert!(hooks::has_hooks());
    assert_eq!(hooks::current().map(|s| s.len()), Some(1));
    drop(g);
    assert!(hooks::current().is_none());
}

/// A thread remembers "no hooks at this generation" after one operation; a registration of
/// either kind still reaches its next operation, and an unregistration leaves it with none.
#[test]
fn a_thread_that_saw_no_hooks_sees_later_registrations() {
    let _lock = global_lock();
    std::thread::spawn(|| {
        assert!(hooks::current().is_none());
        assert!(hooks::current().is_none(), "from the cached answer");
        let local = hooks::register(Recorder::new("local"));
        assert_eq!(hooks::current().map(|s| s.len()), Some(1));
        drop(local);
        assert!(hooks::current().is_none());
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        // Registered on another thread, as a global hook usually is.
        let other = std::thread::spawn(move || {
            let g = hooks::register_global(Recorder::new("global"));
            tx.send(()).unwrap();
            done_rx.recv().unwrap();
            drop(g);
        });
        rx.recv().unwrap();
        assert_eq!(hooks::current().map(|s| s.len()), Some(1));
        done_tx.send(()).unwrap();
        other.join().unwrap();
        assert!(hooks::current().is_none());
        assert!(hooks::current().is_none(), "from the cached answer");
    })
    .join()
    .unwrap();
}

#[test]
fn several_hooks_in_registration_order_and_guard_drop() {
    let pool = host_pool(0, 1 << 20);
    let log = Arc::new(Mutex::new(Vec::new()));
    let h1 = Recorder::shared("h1", log.clone());
    let h2 = Recorder::shared("h2", log.clone());
    let h3 = Recorder::shared("h3", log.clone());
    let g1 = hooks::register(h1);
    let g2 = hooks::register(h2);
    let g3 = hooks::register(h3);
    let m = pool.malloc(1).unwrap();
    let labels: Vec<_> = log
        .lock()
        .unwrap()
        .iter()
        .map(|(l, e)| (*l, e.name()))
        .collect();
    assert_eq!(
        labels[..6],
        [
            ("h1", "malloc_pre"),
            ("h2", "malloc_pre"),
            ("h3", "malloc_pre"),
            ("h1", "alloc_pre"),
            ("h2", "alloc_pre"),
            ("h3", "alloc_pre"),
        ]
    );
    assert_eq!(labels.len(), 12);
    // Drop out of registration order: exactly that registration goes.
    drop(g2);
    log.lock().unwrap().clear();
    drop(m);
    let labels: Vec<_> = log
        .lock()
        .unwrap()
        .iter()
        .map(|(l, e)| (*l, e.name()))
        .collect();
    assert_eq!(
        labels,
        [
            ("h1", "free_pre"),
            ("h3", "free_pre"),
            ("h1", "free_post"),
            ("h3", "free_post")
        ]
    );
    drop(g1);
    drop(g3);
    log.lock().unwrap().clear();
    drop(pool.malloc(1).unwrap());
    assert!(log.lock().unwrap().is_empty());
}

#[test]
fn same_hook_twice_is_called_twice() {
    let pool = host_pool(0, 1 << 20);
    let rec = Recorder::new("r");
    let g1 = hooks::register(rec.clone());
    let g2 = hooks::register(rec.clone());
    drop(pool.malloc(1).unwrap());
    assert_eq!(rec.events().len(), 12);
    drop(g1);
    rec.clear();
    drop(pool.malloc(1).unwrap());
    assert_eq!(
        rec.names(),
        ["malloc_pre", "malloc_post", "free_pre", "free_post"]
    );
    drop(g2);
}

/// Allocates from the pool and registers a hook from inside its callbacks.
struct Reentrant {
    pool: MemoryPool,
    inner: Arc<Recorder>,
    depth: Mutex<u32>,
    kept: Mutex<Vec<poolsight_pool::PooledMemory>>,
}

impl MemoryHook for Reentrant {
    fn malloc_postprocess(&self, _i: &MallocPost) {
        let mut d = self.depth.lock().unwrap();
        if *d > 0 {
            return;
        }
        *d += 1;
        drop(d);
        let g = hooks::register(self.inner.clone());
        let m = self.pool.malloc(4096).unwrap();
        self.pool.free_all_blocks(None);
        drop(g);
        self.kept.lock().unwrap().push(m);
    }
}

#[test]
fn hooks_may_reenter_the_pool() {
    let pool = host_pool(0, 1 << 20);
    let inner = Recorder::new("inner");
    let hook = Arc::new(Reentrant {
        pool: pool.clone(),
        inner: inner.clone(),
        depth: Mutex::new(0),
        kept: Mutex::new(Vec::new()),
    });
    let _g = hooks::register(hook.clone());
    let m = pool.malloc(10).unwrap();
    assert_eq!(hook.kept.lock().unwrap().len(), 1);
    assert_eq!(pool.used_bytes(), 512 + 4096);
    // The inner registration happened during the outer malloc, so it saw only the nested one.
    assert_eq!(
        inner.names(),
        ["malloc_pre", "alloc_pre", "alloc_post", "malloc_post"]
    );
    drop(m);
    hook.kept.lock().unwrap().clear();
    assert_eq!(pool.used_bytes(), 0);
}

#[derive(Clone, Default)]
struct SharedBuf(Arc<Mutex<Vec<u8>>>);

impl Write for SharedBuf {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn debug_print_lines_match_cupy() {
    let pool = host_pool(0, 1 << 20);
    let buf = SharedBuf::default();
    let hook = Arc::new(DebugPrintHook::with_writer(Box::new(buf.clone())));
    assert_eq!(hook.name(), "DebugPrintHook");
    let g = hooks::register(hook);
    let x = pool.malloc(24).unwrap();
    let (ptr, id) = (x.ptr(), x.pmem_id());
    drop(x);
    let y = pool.malloc(600).unwrap();
    let (ptr2, id2) = (y.ptr(), y.pmem_id());
    drop(g);
    drop(y);
    let out = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
    let expected = format!(
        "{{\"hook\":\"alloc\",\"device_id\":0,\"mem_size\":512,\"mem_ptr\":{ptr}}}\n\
         {{\"hook\":\"malloc\",\"device_id\":0,\"size\":24,\"mem_size\":512,\"mem_ptr\":{ptr},\"pmem_id\":\"0x{id:x}\"}}\n\
         {{\"hook\":\"free\",\"device_id\":0,\"mem_size\":512,\"mem_ptr\":{ptr},\"pmem_id\":\"0x{id:x}\"}}\n\
         {{\"hook\":\"alloc\",\"device_id\":0,\"mem_size\":1024,\"mem_ptr\":{ptr2}}}\n\
         {{\"hook\":\"malloc\",\"device_id\":0,\"size\":600,\"mem_size\":1024,\"mem_ptr\":{ptr2},\"pmem_id\":\"0x{id2:x}\"}}\n"
    );
    assert_eq!(out, expected);
    assert_eq!(id, 1, "first malloc of a pool gets pmem_id 1");
    assert!(out.contains("\"pmem_id\":\"0x1\""));
}

#[test]
fn debug_print_error_line_and_broken_writer() {
    let buf = SharedBuf::default();
    let pool = MemoryPool::new(Arc::new(BrokenDevice));
    let g = hooks::register(Arc::new(DebugPrintHook::with_writer(Box::new(buf.clone()))));
    assert!(pool.malloc(5).is_err());
    drop(g);
    assert_eq!(
        String::from_utf8(buf.0.lock().unwrap().clone()).unwrap(),
        "{\"hook\":\"alloc\",\"device_id\":7,\"mem_size\":512,\"mem_ptr\":0}\n\
         {\"hook\":\"malloc\",\"device_id\":7,\"size\":5,\"mem_size\":512,\"mem_ptr\":0,\"pmem_id\":\"0x0\"}\n"
    );

    struct Failing;
    impl Write for Failing {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::Error::other("disk full"))
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Err(std::io::Error::other("disk full"))
        }
    }
    let pool = host_pool(0, 1 << 20);
    let _g = hooks::register(Arc::new(DebugPrintHook::with_writer(Box::new(Failing))));
    let m = pool.malloc(1).unwrap();
    assert_ne!(
        m.ptr(),
        0,
        "an I/O error in the hook does not affect the pool"
    );
}

#[test]
fn zero_size_fires_malloc_hooks_only() {
    let pool = host_pool(0, 1 << 20);
    let rec = Recorder::new("rec");
    let _g = hooks::register(rec.clone());
    let m = pool.malloc(0).unwrap();
    assert_eq!(m.ptr(), 0);
    assert_eq!(m.mem_size(), 0);
    drop(m);
    assert_eq!(rec.names(), ["malloc_pre", "malloc_post"]);
    assert!(matches!(
        rec.events()[1],
        Ev::MallocPost(MallocPost { mem_ptr: 0, mem_size: 0, size: 0, pmem_id, .. }) if pmem_id != 0
    ));
    assert_eq!(pool.total_bytes(), 0);
}

#[test]
fn a_thread_sees_registration_changes_at_its_next_operation() {
    // The list of hooks a thread uses is cached; every change, local or global, must show at
    // the next pool operation.
    let _lock = global_lock();
    const DEV: u32 = 902;
    let pool = host_pool(DEV, 1 << 20);
    let log = Arc::new(Mutex::new(Vec::new()));
    let seen = |log: &Arc<Mutex<Vec<(&'static str, Ev)>>>| -> Vec<&'static str> {
        let mut l = log.lock().unwrap();
        let names = l
            .iter()
            .filter(|(_, e)| e.device_id() == DEV && e.name() == "malloc_post")
            .map(|(l, _)| *l)
            .collect();
        l.clear();
        names
    };
    let local = hooks::register(Recorder::shared("local", log.clone()));
    drop(pool.malloc(100).unwrap());
    drop(pool.malloc(100).unwrap());
    assert_eq!(seen(&log), ["local", "local"]);
    let global = hooks::register_global(Recorder::shared("global", log.clone()));
    drop(pool.malloc(100).unwrap());
    assert_eq!(seen(&log), ["local", "global"]);
    drop(global);
    drop(pool.malloc(100).unwrap());
    assert_eq!(seen(&log), ["local"]);
    let second = hooks::register(Recorder::shared("second", log.clone()));
    drop(pool.malloc(100).unwrap());
    assert_eq!(seen(&log), ["local", "second"]);
    drop(local);
    drop(pool.malloc(100).unwrap());
    assert_eq!(seen(&log), ["second"]);
    drop(second);
    drop(pool.malloc(100).unwrap());
    assert!(seen(&log).is_empty());
    assert!(hooks::current().is_none());
}

#[test]
fn pre_callbacks_are_skipped_only_when_no_hook_wants_them() {
    // A global hook of another test would want the pre callbacks too.
    let _lock = global_lock();
    let pool = host_pool(0, 1 << 20);
    // Says it has no use for the pre callbacks, and logs what it still gets.
    let post_only = Recorder::post_only("post_only");
    let g = hooks::register(post_only.clone());
    drop(pool.malloc(700).unwrap()); // a miss: alloc callbacks too
    assert_eq!(
        post_only.names(),
        ["alloc_post", "malloc_post", "free_post"]
    );
    // A second hook that wants them: every hook gets them again, in CuPy's order.
    pool.free_all_blocks(None); // so that the next malloc misses again
    post_only.clear();
    let all = Recorder::new("all");
    let g2 = hooks::register(all.clone());
    drop(pool.malloc(700).unwrap());
    let order = [
        "malloc_pre",
        "alloc_pre",
        "alloc_post",
        "malloc_post",
        "free_pre",
        "free_post",
    ];
    assert_eq!(all.names(), order);
    assert_eq!(post_only.names(), order);
    // Gone again with it.
    drop(g2);
    post_only.clear();
    drop(pool.malloc(700).unwrap());
    assert_eq!(post_only.names(), ["malloc_post", "free_post"]);
    drop(g);
}
