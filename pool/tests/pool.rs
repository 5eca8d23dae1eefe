//! CuPy's SingleDeviceMemoryPool scenarios: rounding, reuse, best fit, split, merge,
//! free_all_blocks, per-stream arenas, limit and out-of-memory retry.

use std::sync::{Arc, Mutex};

use poolsight_pool::device::HostDevice;
use poolsight_pool::hooks::{self, AllocPre, MemoryHook, OutOfMemory, Release};
use poolsight_pool::{round_size, MemoryPool, PoolError, ALLOCATION_UNIT_SIZE};

const MIB: u64 = 1 << 20;

fn pool(capacity: u64) -> (MemoryPool, Arc<HostDevice>) {
    let dev = Arc::new(HostDevice::new(0, capacity));
    (MemoryPool::new(dev.clone()), dev)
}

/// Counts device allocations and collects release/OOM events.
#[derive(Default)]
struct Counter {
    allocs: Mutex<Vec<u64>>,
    releases: Mutex<Vec<Release>>,
    ooms: Mutex<Vec<OutOfMemory>>,
}

impl MemoryHook for Counter {
    fn alloc_preprocess(&self, i: &AllocPre) {
        self.allocs.lock().unwrap().push(i.mem_size);
    }
    fn release(&self, i: &Release) {
        self.releases.lock().unwrap().push(*i);
    }
    fn out_of_memory(&self, i: &OutOfMemory) {
        self.ooms.lock().unwrap().push(*i);
    }
}

impl Counter {
    fn allocs(&self) -> Vec<u64> {
        self.allocs.lock().unwrap().clone()
    }
}

#[test]
fn rounding() {
    assert_eq!(ALLOCATION_UNIT_SIZE, 512);
    for (size, mem) in [
        (1, 512),
        (512, 512),
        (513, 1024),
        (0, 0),
        (1024, 1024),
        (1025, 1536),
    ] {
        assert_eq!(round_size(size), Some(mem), "round_size({size})");
    }
    assert_eq!(round_size(u64::MAX), None);
    let (p, dev) = pool(MIB);
    let a = p.malloc(1).unwrap();
    let b = p.malloc(512).unwrap();
    let c = p.malloc(513).unwrap();
    let z = p.malloc(0).unwrap();
    assert_eq!((a.size(), a.mem_size()), (1, 512));
    assert_eq!((b.size(), b.mem_size()), (512, 512));
    assert_eq!((c.size(), c.mem_size()), (513, 1024));
    assert_eq!((z.size(), z.mem_size(), z.ptr()), (0, 0, 0));
    assert_eq!(p.used_bytes(), 2048);
    assert_eq!(
        dev.allocation_count(),
        3,
        "malloc(0) does not touch the device"
    );
    assert_eq!(a.ptr() % 512, 0);
    assert!(matches!(
        p.malloc(u64::MAX),
        Err(PoolError::OutOfMemory { .. })
    ));
}

#[test]
fn reuse_without_device_alloc() {
    let (p, dev) = pool(MIB);
    let hook = Arc::new(Counter::default());
    let _g = hooks::register(hook.clone());
    let a = p.malloc(1000).unwrap();
    let ptr = a.ptr();
    drop(a);
    assert_eq!(p.used_bytes(), 0);
    assert_eq!(p.total_bytes(), 1024, "freed memory stays in the pool");
    assert_eq!(dev.in_use(), 1024);
    let b = p.malloc(1000).unwrap();
    assert_eq!(b.ptr(), ptr, "same chunk handed back");
    assert_eq!(hook.allocs(), [1024], "second malloc is a pool hit");
    assert_eq!(dev.allocation_count(), 1);
}

#[test]
fn best_fit_picks_smallest_fitting_chunk() {
    let (p, _dev) = pool(MIB);
    let big = p.malloc(4096).unwrap();
    let small = p.malloc(1024).unwrap();
    let mid = p.malloc(2048).unwrap();
    let (big_ptr, small_ptr, mid_ptr) = (big.ptr(), small.ptr(), mid.ptr());
    drop((big, small, mid));
    assert_eq!(p.n_free_blocks(), 3);
    let a = p.malloc(1000).unwrap();
    assert_eq!(a.ptr(), small_ptr);
    let b = p.malloc(1500).unwrap();
    assert_eq!(b.ptr(), mid_ptr, "1536 fits the 2048 chunk best");
    assert_eq!(p.n_free_blocks(), 2, "4096 intact, 512 split off the 2048");
    let c = p.malloc(4096).unwrap();
    assert_eq!(c.ptr(), big_ptr);
    assert_eq!(p.total_bytes(), 4096 + 1024 + 2048);
}

#[test]
fn split_larger_free_chunk() {
    let (p, _dev) = pool(MIB);
    let hook = Arc::new(Counter::default());
    let _g = hooks::register(hook.clone());
    let a = p.malloc(2048).unwrap();
    let base = a.ptr();
    drop(a);
    let b = p.malloc(512).unwrap();
    assert_eq!(b.ptr(), base, "head of the split chunk");
    assert_eq!(p.n_free_blocks(), 1, "the 1536-byte remainder is cached");
    assert_eq!(p.total_bytes(), 2048);
    assert_eq!(p.used_bytes(), 512);
    assert_eq!(p.free_bytes(), 1536);
    let c = p.malloc(1536).unwrap();
    assert_eq!(c.ptr(), base + 512, "remainder handed out");
    assert_eq!(p.n_free_blocks(), 0);
    assert_eq!(hook.allocs(), [2048], "no device alloc after the first");
}

#[test]
fn large_chunks_split_across_bin_classes() {
    let (p, dev) = pool(64 * MIB);
    drop(p.malloc(4 * MIB).unwrap());
    let base = p.free_all_blocks(Some(7)); // other stream: nothing released
    assert_eq!(base, 0);
    let b = p.malloc(100).unwrap();
    let base = b.ptr();
    assert_eq!(p.n_free_blocks(), 1, "4 MiB - 512 remainder cached");
    let c = p.malloc(2 * MIB).unwrap();
    assert_eq!(c.ptr(), base + 512);
    let d = p.malloc(MIB).unwrap();
    assert_eq!(d.ptr(), base + 512 + 2 * MIB);
    let e = p.malloc(MIB - 512).unwrap();
    assert_eq!(e.ptr(), base + 512 + 3 * MIB, "last piece, below 1 MiB");
    assert_eq!(p.n_free_blocks(), 0);
    assert_eq!(dev.allocation_count(), 1);
    drop((c, e));
    assert_eq!(p.n_free_blocks(), 2);
    drop((b, d));
    assert_eq!(p.n_free_blocks(), 1);
    assert_eq!(p.free_all_blocks(None), 4 * MIB);
    assert_eq!(dev.in_use(), 0);

    // Exactly at the boundary between indexed and ordered bins.
    let one = p.malloc(MIB).unwrap();
    let over = p.malloc(MIB + 512).unwrap();
    let (one_ptr, over_ptr) = (one.ptr(), over.ptr());
    drop((one, over));
    let x = p.malloc(MIB + 1).unwrap();
    assert_eq!(x.ptr(), over_ptr);
    let y = p.malloc(MIB - 1).unwrap();
    assert_eq!(y.ptr(), one_ptr);
    assert_eq!(p.n_free_blocks(), 0);
}

#[test]
fn merge_adjacent_free_chunks() {
    let (p, dev) = pool(MIB);
    drop(p.malloc(4096).unwrap());
    let a = p.malloc(1024).unwrap();
    let b = p.malloc(1024).unwrap();
    let c = p.malloc(1024).unwrap();
    let d = p.malloc(1024).unwrap();
    let base = a.ptr();
    assert_eq!(
        [b.ptr(), c.ptr(), d.ptr()],
        [base + 1024, base + 2048, base + 3072]
    );
    assert_eq!(p.n_free_blocks(), 0);
    drop(c);
    drop(a);
    assert_eq!(p.n_free_blocks(), 2, "a and c are not adjacent");
    drop(b); // merges with a (prev) and c (next)
    assert_eq!(p.n_free_blocks(), 1);
    let e = p.malloc(3072).unwrap();
    assert_eq!(e.ptr(), base, "merged 3072 bytes serve a 3072 request");
    assert_eq!(p.n_free_blocks(), 0);
    drop(e);
    drop(d);
    assert_eq!(
        p.n_free_blocks(),
        1,
        "everything merged back into one chunk"
    );
    let f = p.malloc(4096).unwrap();
    assert_eq!(f.ptr(), base);
    assert_eq!(dev.allocation_count(), 1);
}

#[test]
fn free_all_blocks_returns_only_unsplit_chunks() {
    let (p, dev) = pool(MIB);
    let hook = Arc::new(Counter::default());
    let _g = hooks::register(hook.clone());
    drop(p.malloc(2048).unwrap());
    let x = p.malloc(512).unwrap(); // splits the 2048 chunk
    drop(p.malloc(8192).unwrap()); // a whole free allocation
    assert_eq!(p.total_bytes(), 2048 + 8192);
    assert_eq!(p.n_free_blocks(), 2);
    assert_eq!(p.free_all_blocks(None), 8192);
    assert_eq!(p.total_bytes(), 2048, "split chunk's allocation kept");
    assert_eq!(dev.in_use(), 2048);
    assert_eq!(p.n_free_blocks(), 1);
    assert_eq!(
        *hook.releases.lock().unwrap(),
        [Release {
            device_id: 0,
            bytes: 8192,
            stream: 0
        }]
    );
    drop(x);
    assert_eq!(p.free_all_blocks(None), 2048, "merged back, now releasable");
    assert_eq!(p.total_bytes(), 0);
    assert_eq!(dev.in_use(), 0);
    assert_eq!(p.n_free_blocks(), 0);
    assert_eq!(p.free_all_blocks(None), 0);
    assert_eq!(
        hook.releases.lock().unwrap().len(),
        2,
        "no event for 0 bytes"
    );
}

#[test]
fn byte_counters() {
    let (p, _dev) = pool(MIB);
    assert_eq!((p.used_bytes(), p.total_bytes(), p.free_bytes()), (0, 0, 0));
    let a = p.malloc(100).unwrap();
    let b = p.malloc(3000).unwrap();
    assert_eq!(
        (p.used_bytes(), p.total_bytes(), p.free_bytes()),
        (3584, 3584, 0)
    );
    drop(a);
    assert_eq!(
        (p.used_bytes(), p.total_bytes(), p.free_bytes()),
        (3072, 3584, 512)
    );
    drop(b);
    assert_eq!(
        (p.used_bytes(), p.total_bytes(), p.free_bytes()),
        (0, 3584, 3584)
    );
    p.free_all_blocks(None);
    assert_eq!((p.used_bytes(), p.total_bytes(), p.free_bytes()), (0, 0, 0));
}

#[test]
fn streams_do_not_share_free_chunks() {
    let (p, dev) = pool(MIB);
    let a = p.malloc_on(1024, 1).unwrap();
    assert_eq!(a.stream(), 1);
    let a_ptr = a.ptr();
    drop(a);
    let b = p.malloc_on(1024, 2).unwrap();
    assert_ne!(b.ptr(), a_ptr, "stream 2 may not reuse stream 1's chunk");
    assert_eq!(dev.allocation_count(), 2);
    let c = p.malloc_on(1024, 1).unwrap();
    assert_eq!(c.ptr(), a_ptr, "stream 1 reuses its own");
    let b_ptr = b.ptr();
    drop((b, c));
    let d = p.malloc(1024).unwrap();
    assert_ne!(d.ptr(), a_ptr);
    assert_ne!(d.ptr(), b_ptr);
    drop(d);
    assert_eq!(p.n_free_blocks(), 3);
    assert_eq!(p.free_all_blocks(Some(1)), 1024, "only stream 1's arena");
    assert_eq!(p.n_free_blocks(), 2);
    assert_eq!(p.free_all_blocks(Some(9)), 0, "unknown stream: nothing");
    assert_eq!(p.free_all_blocks(None), 2048);
    assert_eq!(dev.in_use(), 0);
}

#[test]
fn oom_retry_after_releasing_cache() {
    let (p, dev) = pool(4096);
    let hook = Arc::new(Counter::default());
    let _g = hooks::register(hook.clone());
    let a = p.malloc(2048).unwrap();
    let b = p.malloc(2048).unwrap();
    drop(a);
    drop(b);
    assert_eq!(dev.in_use(), 4096, "device full of cached memory");
    // Two separate 2048 allocations cannot serve 3000 bytes: the pool must release them.
    let c = p.malloc(3000).unwrap();
    assert_eq!(c.mem_size(), 3072);
    assert_eq!(p.total_bytes(), 3072);
    assert_eq!(dev.in_use(), 3072);
    assert_eq!(
        hook.allocs(),
        [2048, 2048, 3072, 3072],
        "failed try, then retry"
    );
    assert_eq!(hook.releases.lock().unwrap()[0].bytes, 4096);
    assert!(hook.ooms.lock().unwrap().is_empty());

    let err = p.malloc(2048).unwrap_err();
    assert_eq!(
        err,
        PoolError::OutOfMemory {
            device_id: 0,
            requested: 2048,
            total: 3072,
            limit: 0
        }
    );
    assert_eq!(
        err.to_string(),
        "out of memory allocating 2.00 KiB (2048 bytes) on device 0: the pool holds 3072 bytes, no limit"
    );
    assert_eq!(hook.ooms.lock().unwrap().len(), 1);
    assert_eq!(
        p.total_bytes(),
        3072,
        "failed request leaves no reservation"
    );
    assert_eq!(p.used_bytes(), 3072);
    drop(c);
    assert!(p.malloc(2048).is_ok(), "fits once c is back in the pool");
}

#[test]
fn limit_is_never_exceeded_and_oom_message() {
    let (p, dev) = pool(64 * MIB);
    assert_eq!(p.get_limit(), 0);
    p.set_limit(2 * MIB);
    assert_eq!(p.get_limit(), 2 * MIB);
    let a = p.malloc(MIB).unwrap();
    drop(a);
    // 1 MiB cached + 2 MiB would cross the limit: the cache is released, then it fits.
    let b = p.malloc(2 * MIB).unwrap();
    assert_eq!(p.total_bytes(), 2 * MIB);
    assert_eq!(dev.in_use(), 2 * MIB);
    let err = p.malloc(1536 * 1024).unwrap_err();
    assert_eq!(
        err.to_string(),
        "out of memory allocating 1.50 MiB (1572864 bytes) on device 0: \
         the pool holds 2097152 bytes, limit 2097152"
    );
    assert_eq!(
        err,
        PoolError::OutOfMemory {
            device_id: 0,
            requested: 1572864,
            total: 2 * MIB,
            limit: 2 * MIB
        }
    );
    assert!(
        matches!(p.malloc(3 * MIB), Err(PoolError::OutOfMemory { requested, .. }) if requested == 3 * MIB),
        "larger than the limit itself"
    );
    drop(b);
    p.set_limit(0);
    let c = p.malloc(3 * MIB).unwrap();
    assert_eq!(
        p.total_bytes(),
        5 * MIB,
        "no limit: cached 2 MiB kept, 3 MiB added"
    );
    drop(c);
}

#[test]
fn copies_round_trip_and_are_bounded() {
    let (p, _dev) = pool(MIB);
    let m = p.malloc(1000).unwrap();
    let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
    m.copy_from_host(&data).unwrap();
    let mut back = vec![0u8; 1000];
    m.copy_to_host(&mut back).unwrap();
    assert_eq!(back, data);
    let mut tail = [0u8; 10];
    m.copy_to_host_at(990, &mut tail).unwrap();
    assert_eq!(tail[..], data[990..]);
    m.copy_from_host_at(500, &[1, 2, 3]).unwrap();
    let mut mid = [0u8; 3];
    m.copy_to_host_at(500, &mut mid).unwrap();
    assert_eq!(mid, [1, 2, 3]);
    assert_eq!(
        m.copy_from_host(&[0u8; 1001]),
        Err(PoolError::OutOfBounds {
            offset: 0,
            len: 1001,
            size: 1000
        })
    );
    assert!(m.copy_to_host_at(u64::MAX, &mut [0u8; 2]).is_err());
    // The device itself refuses ranges outside its allocations.
    let dev = p.device().clone();
    assert!(dev.copy_from_host(m.ptr() + 4096, &[1]).is_err());
}

#[test]
fn pmem_ids_are_unique_and_start_at_one() {
    let (p, _dev) = pool(MIB);
    let a = p.malloc(1).unwrap();
    let b = p.malloc(1).unwrap();
    assert_eq!((a.pmem_id(), b.pmem_id()), (1, 2));
    drop(a);
    let c = p.malloc(1).unwrap();
    assert_eq!(c.pmem_id(), 3);
    assert_eq!(c.device_id(), 0);
}

#[test]
fn dropping_everything_returns_memory_to_device() {
    let dev = Arc::new(HostDevice::new(0, MIB));
    let p = MemoryPool::new(dev.clone());
    drop(p.malloc(4096).unwrap());
    let kept = p.malloc(100).unwrap(); // splits the cached 4096
    let other = p.malloc(8192).unwrap();
    drop(other);
    drop(p);
    assert_eq!(dev.in_use(), 4096 + 8192, "the handle keeps the pool alive");
    kept.copy_from_host(&[42]).unwrap();
    drop(kept);
    assert_eq!(dev.in_use(), 0);
    assert_eq!(dev.allocation_count(), 0);
}

#[test]
fn concurrent_malloc_free_keeps_books_straight() {
    let (p, dev) = pool(256 * MIB);
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let p = p.clone();
            std::thread::spawn(move || {
                let mut live = Vec::new();
                let mut x = t * 7919 + 1;
                for i in 0..2000u64 {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let size = (x >> 33) % 20000;
                    let stream = (t + i) as u32 % 3;
                    let m = p.malloc_on(size, stream).unwrap();
                    if m.ptr() != 0 {
                        m.copy_from_host(&[t as u8]).unwrap();
                    }
                    live.push(m);
                    if live.len() > 20 {
                        let m = live.swap_remove((x % 20) as usize);
                        let mut b = [0u8];
                        if m.ptr() != 0 {
                            m.copy_to_host(&mut b).unwrap();
                            assert_eq!(b[0], t as u8, "memory handed to two owners");
                        }
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(p.used_bytes(), 0);
    assert_eq!(p.total_bytes(), dev.in_use());
    p.free_all_blocks(None);
    assert_eq!(
        p.total_bytes(),
        0,
        "all chunks merged back into whole allocations"
    );
    assert_eq!(dev.in_use(), 0);
    assert_eq!(p.n_free_blocks(), 0);
}

#[cfg(feature = "cuda")]
#[test]
fn cuda_device_without_driver_is_an_error_not_a_panic() {
    use poolsight_pool::device::{CudaDevice, DeviceError};
    // SAFETY: probing a library name; the handle is closed at once.
    let driver_present = [c"libcuda.so.1", c"libcuda.so"].iter().any(|lib| unsafe {
        let h = libc::dlopen(lib.as_ptr(), libc::RTLD_LAZY);
        if !h.is_null() {
            libc::dlclose(h);
        }
        !h.is_null()
    });
    match CudaDevice::new(0) {
        Err(DeviceError::Unavailable(msg)) => {
            if !driver_present {
                assert!(
                    msg.starts_with("no CUDA driver (libcuda.so.1 not found): "),
                    "{msg}"
                );
            }
        }
        Err(e) => panic!("expected Unavailable, got {e:?}"),
        Ok(dev) => {
            assert!(driver_present);
            // A real GPU: the pool works through it end to end.
            let p = MemoryPool::new(Arc::new(dev));
            let m = p.malloc(1000).unwrap();
            m.copy_from_host(&[9; 1000]).unwrap();
            let mut back = [0u8; 1000];
            m.copy_to_host(&mut back).unwrap();
            assert_eq!(back, [9; 1000]);
        }
    }
}

/// cupy/cuda/memory.pyx `SingleDeviceMemoryPool._try_malloc`: the device allocation is tried
/// a third time after `gc.collect()` and `free_all_blocks()`. The collector stand-in drops a
/// block the program kept; its memory goes back to the cache, the release returns it to the
/// device, and the third try fits.
#[test]
fn try_malloc_third_try_after_collector() {
    let (p, dev) = pool(4096);
    let held = Arc::new(Mutex::new(Some(p.malloc(4096).unwrap())));
    let calls = Arc::new(Mutex::new(0u32));
    {
        let (held, calls) = (held.clone(), calls.clone());
        p.set_collector(Some(Arc::new(move || {
            *calls.lock().unwrap() += 1;
            held.lock().unwrap().take();
        })));
    }
    let hook = Arc::new(Counter::default());
    let _g = hooks::register(hook.clone());
    let m = p.malloc(4096).unwrap();
    assert_eq!(hook.allocs(), [4096, 4096, 4096], "three device tries");
    assert_eq!(*calls.lock().unwrap(), 1, "collector runs before the third");
    assert_eq!(hook.releases.lock().unwrap()[0].bytes, 4096);
    assert_eq!(dev.in_use(), 4096);
    drop(m);

    // Without anything to collect, the request fails after three tries.
    let keep = p.malloc(4096).unwrap();
    let hook = Arc::new(Counter::default());
    let _g2 = hooks::register(hook.clone());
    p.set_collector(None);
    assert!(p.malloc(512).is_err());
    assert_eq!(hook.allocs(), [512, 512, 512]);
    assert_eq!(hook.ooms.lock().unwrap().len(), 1);
    assert_eq!(p.total_bytes(), 4096, "no reservation left behind");
    drop(keep);
}
