//! CuPy's pool as a model, rule by rule (`cupy/cuda/memory.pyx`): each test sets up a state in
//! which the rule decides the outcome, so that it fails if the rule is removed or changed; and
//! a run replayed through it.

use poolsight_alloc_models::cupy::{round_size, Pool};
use poolsight_alloc_models::replay::{min_capacity, replay, requested_peak, Op, Request};

const MIB: u64 = 1 << 20;

#[test]
fn requests_round_up_to_512_bytes() {
    assert_eq!(round_size(1), Some(512));
    assert_eq!(round_size(512), Some(512));
    assert_eq!(round_size(513), Some(1024));
    assert_eq!(round_size(0), Some(0));
    assert_eq!(round_size(u64::MAX), None);
    let mut p = Pool::new(None);
    assert_eq!(p.malloc(513, 0).unwrap().size, 1024);
    // A 0-byte request is a null block that touches nothing.
    let z = p.malloc(0, 0).unwrap();
    assert_eq!((z.addr, z.size), (0, 0));
    assert_eq!(p.stats().device_allocs, 1);
}

#[test]
fn a_miss_allocates_exactly_the_rounded_size() {
    // Unlike PyTorch's 2 MiB / 20 MiB segments, CuPy asks the device for the request itself.
    let mut p = Pool::new(None);
    p.malloc(3 * MIB + 1, 0).unwrap();
    assert_eq!(p.stats().reserved, 3 * MIB + 512);
}

#[test]
fn best_fit_takes_the_smallest_free_chunk_that_fits() {
    let mut p = Pool::new(None);
    let big = p.malloc(4 * MIB, 0).unwrap();
    let _hold1 = p.malloc(512, 0).unwrap();
    let small = p.malloc(2 * MIB, 0).unwrap();
    let _hold2 = p.malloc(512, 0).unwrap();
    p.free(big.id);
    p.free(small.id);
    // 1 MiB fits both; the 2 MiB chunk is the smaller.
    let b = p.malloc(MIB, 0).unwrap();
    assert_eq!(b.addr, small.addr);
    assert_eq!(p.stats().device_allocs, 4);
}

#[test]
fn the_rest_of_a_chunk_is_split_off_and_cached() {
    let mut p = Pool::new(None);
    let a = p.malloc(4 * MIB, 0).unwrap();
    p.free(a.id);
    let b = p.malloc(MIB, 0).unwrap();
    assert_eq!(b.addr, a.addr);
    // The other 3 MiB serve the next request without a device allocation.
    let c = p.malloc(3 * MIB, 0).unwrap();
    assert_eq!(c.addr, a.addr + MIB);
    assert_eq!(p.stats().device_allocs, 1);
}

#[test]
fn a_freed_chunk_merges_with_free_neighbours() {
    let mut p = Pool::new(None);
    let a = p.malloc(4 * MIB, 0).unwrap();
    p.free(a.id);
    let x = p.malloc(MIB, 0).unwrap();
    let y = p.malloc(MIB, 0).unwrap();
    p.free(x.id);
    p.free(y.id);
    // Merged back into one 4 MiB chunk: it serves 4 MiB without a new allocation.
    assert_eq!(p.n_free_blocks(), 1);
    let b = p.malloc(4 * MIB, 0).unwrap();
    assert_eq!(b.addr, a.addr);
    assert_eq!(p.stats().device_allocs, 1);
}

#[test]
fn memory_freed_on_one_stream_serves_only_that_stream() {
    let mut p = Pool::new(None);
    let a = p.malloc(MIB, 1).unwrap();
    p.free(a.id);
    let b = p.malloc(MIB, 0).unwrap();
    assert_ne!(b.addr, a.addr);
    assert_eq!(p.stats().device_allocs, 2);
    let c = p.malloc(MIB, 1).unwrap();
    assert_eq!(c.addr, a.addr);
}

#[test]
fn free_all_blocks_returns_only_whole_free_allocations() {
    let mut p = Pool::new(None);
    let whole = p.malloc(2 * MIB, 0).unwrap();
    let split = p.malloc(4 * MIB, 0).unwrap();
    p.free(whole.id);
    p.free(split.id);
    // Only the 4 MiB chunk fits 3 MiB: it is split, the 2 MiB allocation stays whole.
    let _part = p.malloc(3 * MIB, 0).unwrap();
    p.free_all_blocks();
    // The 2 MiB allocation went back; the 4 MiB one is split (3 MiB in use) and stays.
    assert_eq!(p.stats().reserved, 4 * MIB);
    assert_eq!(p.stats().device_frees, 1);
}

#[test]
fn a_failed_device_allocation_is_retried_after_free_all_blocks() {
    let mut p = Pool::new(Some(6 * MIB));
    let a = p.malloc(4 * MIB, 0).unwrap();
    p.free(a.id);
    // 4 MiB cached + 3 MiB new > 6 MiB: the cache goes back, and the request fits.
    let b = p.malloc(3 * MIB, 1).unwrap();
    assert_eq!(b.size, 3 * MIB);
    assert_eq!(p.stats().reserved, 3 * MIB);
    // Nothing cached left to release: out of memory, with the figures of the moment.
    let e = p.malloc(4 * MIB, 1).unwrap_err();
    assert_eq!(
        (e.size, e.reserved, e.allocated),
        (4 * MIB, 3 * MIB, 3 * MIB)
    );
}

/// A small deterministic generator (no dependency for one test).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// (malloc size or free index, stream) operations of a random run.
fn run_ops(seed: u64, n: usize) -> Vec<(bool, u64, u32)> {
    let mut g = Lcg(seed);
    (0..n)
        .map(|_| {
            (
                g.next(5) < 3,
                g.next(64) * 512 + g.next(512) + 1,
                g.next(2) as u32,
            )
        })
        .collect()
}

fn apply(p: &mut Pool, ops: &[(bool, u64, u32)]) {
    let mut live = Vec::new();
    for &(alloc, size, stream) in ops {
        if alloc || live.is_empty() {
            live.push(p.malloc(size, stream).unwrap().id);
        } else {
            let id = live.swap_remove((size as usize) % live.len());
            p.free(id);
        }
    }
}

#[test]
fn inactive_split_bytes_are_the_free_bytes_free_all_blocks_cannot_return() {
    for seed in 1..6 {
        let ops = run_ops(seed, 300);
        for k in (0..ops.len()).step_by(7) {
            let mut p = Pool::new(None);
            apply(&mut p, &ops[..k]);
            let before = p.stats();
            p.free_all_blocks();
            let after = p.stats();
            assert_eq!(
                before.inactive_split,
                after.reserved - after.allocated,
                "seed {seed}, {k} operations"
            );
            assert_eq!(before.allocated, after.allocated);
        }
    }
}

fn req(op: Op, addr: u64, size: u64) -> Request {
    Request {
        op,
        stream: 0,
        addr,
        size,
        ns: addr,
        stack: 0,
    }
}

#[test]
fn a_run_replays_through_the_pool() {
    // Three 3 MiB blocks, each its own device allocation; the first two freed; then a 5 MiB
    // request. Chunks merge only inside one allocation, so the two free 3 MiB chunks cannot
    // serve it: a fourth allocation, 14 MiB reserved, unless the device is full, when
    // `free_all_blocks` first returns the two.
    let m = 3 * MIB;
    let run = [
        req(Op::Malloc, 1, m),
        req(Op::Malloc, 2, m),
        req(Op::Malloc, 3, m),
        req(Op::Free, 1, m),
        req(Op::Free, 2, m),
        req(Op::Malloc, 4, 5 * MIB),
    ];
    let o = replay(Pool::new(None), &run, false);
    assert_eq!(o.reserved_peak, 14 * MIB);
    assert_eq!(o.allocated_peak, 9 * MIB);
    assert_eq!(o.device_allocs, 4);
    let o = replay(Pool::new(Some(9 * MIB)), &run, false);
    assert_eq!(o.first_failure, None);
    assert_eq!((o.reserved_peak, o.device_frees), (9 * MIB, 2));
    // With 8 MiB the third request fails: nothing cached to give back.
    let o = replay(Pool::new(Some(8 * MIB)), &run, false);
    assert_eq!(o.first_failure.as_ref().map(|f| f.index), Some(2));
    assert_eq!(
        min_capacity(&run, 512, 0, 0, Pool::new),
        Some(9 * MIB),
        "the smallest device: the three blocks"
    );
    // The three blocks are the most the requests hold at once: a floor the search may start
    // from, with the same answer.
    assert_eq!(requested_peak(&run), 9 * MIB);
    assert_eq!(
        min_capacity(&run, 512, 9 * MIB, 9 * MIB, Pool::new),
        Some(9 * MIB)
    );
}
