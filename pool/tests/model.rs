//! The pool that serves real memory and CuPy's model in `poolsight-alloc-models`, which
//! `poolsight whatif --allocator cupy` replays runs through, make the same decisions: both keep
//! their chunks in the one policy (`cupy::State`), and this checks the rest (the device, the
//! limit, the release-and-retry path) agrees, operation by operation, on random runs.

use std::sync::Arc;

use poolsight_alloc_models::cupy;
use poolsight_pool::device::HostDevice;
use poolsight_pool::MemoryPool;

const MIB: u64 = 1 << 20;

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

#[test]
fn the_pool_and_the_model_agree_operation_by_operation() {
    for seed in 1..5 {
        let capacity = 24 * MIB;
        let pool = MemoryPool::new(Arc::new(HostDevice::new(0, capacity)));
        let mut model = cupy::Pool::new(Some(capacity));
        let mut g = Lcg(seed);
        let mut live = Vec::new();
        let (mut served, mut failed) = (0, 0);
        for step in 0..2000 {
            let what = g.next(10);
            if what < 6 || live.is_empty() {
                // Sizes from 1 byte to 4 MiB, most small, on two streams.
                let size = if g.next(4) == 0 {
                    g.next(4 * MIB) + 1
                } else {
                    g.next(64 * 1024) + 1
                };
                let stream = g.next(2) as u32;
                let real = pool.malloc_on(size, stream);
                let sim = model.malloc(size, stream);
                assert_eq!(real.is_ok(), sim.is_ok(), "seed {seed}, step {step}");
                if let (Ok(r), Ok(s)) = (real, sim) {
                    assert_eq!(r.mem_size(), s.size);
                    live.push((r, s.id));
                    served += 1;
                } else {
                    failed += 1;
                }
            } else if what < 9 {
                let (r, id) = live.swap_remove(g.next(live.len() as u64) as usize);
                drop(r);
                model.free(id);
            } else {
                pool.free_all_blocks(None);
                model.free_all_blocks();
            }
            let s = model.stats();
            assert_eq!(pool.used_bytes(), s.allocated, "seed {seed}, step {step}");
            assert_eq!(pool.total_bytes(), s.reserved, "seed {seed}, step {step}");
            assert_eq!(
                pool.n_free_blocks(),
                model.n_free_blocks(),
                "seed {seed}, step {step}"
            );
        }
        // The runs reach both paths: served requests and out-of-memory after the retries.
        assert!(
            served > 500 && failed > 0,
            "seed {seed}: {served} served, {failed} failed"
        );
    }
}
