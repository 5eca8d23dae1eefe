//! A run's requests replayed through PyTorch's allocator under given settings and a device
//! capacity ([`crate::replay`] does the replay; this module drives it with [`Settings`]).

use super::allocator::{Allocator, Handle};
use super::settings::Settings;
use super::ROUND_LARGE;
use crate::replay::{self as generic, Model, Oom, Stats};

pub use crate::replay::{Failure, Op, Outcome, Request, LIVE_STACKS};

/// How to replay.
#[derive(Debug, Clone)]
pub struct Config {
    pub settings: Settings,
    /// Bytes the allocator can get from the device (`None`: without limit).
    pub capacity: Option<u64>,
    /// Stop at the first request that does not fit (a search needs no more).
    pub stop_at_failure: bool,
}

/// Replays `requests` through PyTorch's allocator under `config`.
pub fn replay(requests: &[Request], config: &Config) -> Outcome {
    let alloc = Allocator::new(config.settings.clone(), config.capacity);
    generic::replay(alloc, requests, config.stop_at_failure)
}

/// The smallest capacity (a multiple of 2 MiB, the granule of every segment and page) with
/// which the run has no failure ([`crate::replay::min_capacity`]), searched between the bytes
/// its requests hold at once and the reserved peak of a replay without limit (over the memory
/// fraction, when one is set).
pub fn min_capacity(requests: &[Request], settings: &Settings) -> Option<u64> {
    let unlimited = replay(
        requests,
        &Config {
            settings: settings.clone(),
            capacity: None,
            stop_at_failure: false,
        },
    );
    // The allocator may reserve only the fraction of the device: the blocks live at once,
    // and the reserved peak, over it.
    let fraction = settings.memory_fraction.unwrap_or(1.0);
    let over = |b: u64| (b as f64 / fraction).ceil() as u64;
    let floor = over(generic::requested_peak(requests));
    generic::min_capacity(
        requests,
        ROUND_LARGE,
        floor,
        over(unlimited.reserved_peak),
        |c| Allocator::new(settings.clone(), c),
    )
}

impl Model for Allocator {
    type Block = Handle;

    fn malloc(&mut self, size: u64, stream: u32) -> Result<Handle, Oom> {
        Allocator::malloc(self, size, stream)
    }

    fn block_size(block: &Handle) -> u64 {
        block.size
    }

    fn free_requested(&mut self, block: Handle) {
        Allocator::free_requested(self, block.id)
    }

    fn free_completed(&mut self, block: Handle) {
        Allocator::free_completed(self, block.id)
    }

    fn empty_cache(&mut self) {
        Allocator::empty_cache(self)
    }

    fn stats(&self) -> Stats {
        Allocator::stats(self)
    }

    fn release_recorded(&mut self, addr: u64, first_of_run: bool) {
        if self.settings().expandable_segments {
            // Pages are unmapped only by releasing the whole cache.
            if first_of_run {
                Allocator::empty_cache(self);
            }
        } else {
            self.release_segment(addr);
        }
    }
}
