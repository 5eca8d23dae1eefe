//! Epoch marks and their CPU figures, with the counting allocator installed in this test binary.
//!
//! Heap figures are process-wide and the test harness runs tests on several threads, so the
//! exact-byte checks live in one test function, run as consecutive phases: any allocation by a
//! concurrent test would make the exact comparisons flaky.

#[path = "support/mod.rs"]
mod support;

use support::common;

use std::hint::black_box;
use std::time::Duration;

use common::{trace_path, Trace};
use poolsight::recorder::MarkKind as Mark;
use poolsight::recorder::{CountingAllocator, CpuSource, Recorder, RecorderConfig};
use poolsight::schema::fb::MarkKind;

#[global_allocator]
static ALLOC: CountingAllocator = CountingAllocator::new();

const MIB: u64 = 1 << 20;

#[test]
fn cpu_figures_per_source() {
    // The harness's main thread is still bookkeeping the spawn of this test's thread for a
    // moment (about a kilobyte of allocations); let it finish before counting bytes.
    std::thread::sleep(Duration::from_millis(100));
    counting_allocator_is_exact();
    heap_epochs_carry_exact_used_and_peak();
    heap_epochs_count_only_blocks_allocated_since_the_begin();
    rss_epochs_see_a_peak_between_samples();
    one_rss_sample_raises_the_epoch_peak();
    no_source_records_marks_without_figures();
}

fn counting_allocator_is_exact() {
    assert!(CountingAllocator::is_installed());
    let before = CountingAllocator::current();
    let v = black_box(vec![1u8; MIB as usize]);
    assert_eq!(CountingAllocator::current(), before + MIB);
    drop(v);
    assert_eq!(CountingAllocator::current(), before);

    CountingAllocator::reset_peak();
    assert_eq!(CountingAllocator::peak(), before);
    drop(black_box(vec![1u8; 3 * MIB as usize]));
    let kept = black_box(vec![1u8; MIB as usize]);
    assert_eq!(
        CountingAllocator::peak(),
        before + 3 * MIB,
        "the freed 3 MiB set the peak"
    );
    assert_eq!(CountingAllocator::current(), before + MIB);

    let mut grown = black_box(Vec::<u8>::with_capacity(1000));
    grown.reserve_exact(5000);
    assert_eq!(
        CountingAllocator::current(),
        before + MIB + 5000,
        "realloc counts the change"
    );
    drop(grown);
    drop(kept);
}

fn heap_epochs_carry_exact_used_and_peak() {
    let path = trace_path("epochs-heap");
    let config = RecorderConfig {
        cpu_source: CpuSource::Heap,
        ..RecorderConfig::default()
    };
    let rec = Recorder::create(&path, config).expect("recorder");
    let h = rec.handle();
    // The first mark of a thread creates its writer; do that before measuring.
    h.record_mark(Mark::CpuSample, 0, 0, 0);

    h.epoch_begin(1);
    drop(black_box(vec![1u8; 5 * MIB as usize]));
    h.epoch_end(1);

    h.epoch_begin(2);
    let kept = black_box(vec![1u8; 2 * MIB as usize]);
    h.epoch_end(2);
    drop(kept);
    rec.finish().expect("finish");

    let t = Trace::read(&path);
    let m: Vec<_> = t
        .marks
        .iter()
        .filter(|m| m.kind() != MarkKind::CpuSample)
        .collect();
    assert_eq!(m.len(), 4);
    assert_eq!((m[0].kind(), m[0].aux()), (MarkKind::EpochBegin, 1));
    assert_eq!((m[1].kind(), m[1].aux()), (MarkKind::EpochEnd, 1));
    assert_eq!(m[1].a(), m[0].a(), "epoch 1 freed what it took");
    assert_eq!(
        m[1].b() - m[0].a(),
        5 * MIB,
        "epoch 1 peaked 5 MiB above its start"
    );
    assert_eq!((m[2].kind(), m[2].aux()), (MarkKind::EpochBegin, 2));
    assert_eq!(m[3].a() - m[2].a(), 2 * MIB, "epoch 2 kept 2 MiB");
    assert_eq!(m[3].b(), m[3].a(), "epoch 2 peaked where it ended");
    assert!(m[0].ticks() <= m[1].ticks() && m[1].ticks() <= m[2].ticks());
}

/// tracemalloc, started at the epoch's begin as fastai's `PeakMemMetric` starts it, does not
/// see a block allocated before the epoch: freeing it during the epoch lowers neither figure.
/// (A delta of the live bytes, clamped at 0, read 0 used here.)
fn heap_epochs_count_only_blocks_allocated_since_the_begin() {
    let path = trace_path("epochs-heap-old-blocks");
    let config = RecorderConfig {
        cpu_source: CpuSource::Heap,
        ..RecorderConfig::default()
    };
    let rec = Recorder::create(&path, config).expect("recorder");
    let h = rec.handle();
    h.record_mark(Mark::CpuSample, 0, 0, 0);
    let old = black_box(vec![1u8; 4 * MIB as usize]);
    let mut grown_old = black_box(Vec::<u8>::with_capacity(MIB as usize));
    h.epoch_begin(1);
    drop(old);
    let kept = black_box(vec![1u8; MIB as usize]);
    // A block from before, reallocated during the epoch, counts as a new block of its new size.
    grown_old.reserve_exact(3 * MIB as usize);
    h.epoch_end(1);
    drop((kept, grown_old));
    rec.finish().expect("finish");

    let t = Trace::read(&path);
    let m: Vec<_> = t
        .marks
        .iter()
        .filter(|m| m.kind() != MarkKind::CpuSample)
        .collect();
    assert_eq!(m.len(), 2);
    assert_eq!(m[0].a(), 0, "nothing allocated yet when the epoch begins");
    assert_eq!(
        m[1].a() - m[0].a(),
        4 * MIB,
        "1 MiB kept + the 3 MiB reallocated"
    );
    assert_eq!(m[1].b(), 4 * MIB);
}

fn rss_epochs_see_a_peak_between_samples() {
    let path = trace_path("epochs-rss");
    let config = RecorderConfig {
        cpu_source: CpuSource::Rss,
        ..RecorderConfig::default()
    };
    let rec = Recorder::create(&path, config).expect("recorder");
    let h = rec.handle();
    {
        let _sampler = h.start_cpu_sampler(Duration::from_millis(1));
        h.epoch_begin(1);
        {
            // Touched pages count in RSS; large blocks are mapped and unmapped by the system
            // allocator, so RSS falls again when the block is freed.
            let v = black_box(vec![7u8; 64 * MIB as usize]);
            std::thread::sleep(Duration::from_millis(50));
            drop(v);
        }
        h.epoch_end(1);
    }
    rec.finish().expect("finish");

    let t = Trace::read(&path);
    let samples = t
        .marks
        .iter()
        .filter(|m| m.kind() == MarkKind::CpuSample)
        .count();
    assert!(samples >= 5, "the sampler ran: {samples} samples");
    let begin = t
        .marks
        .iter()
        .find(|m| m.kind() == MarkKind::EpochBegin)
        .expect("begin");
    let end = t
        .marks
        .iter()
        .find(|m| m.kind() == MarkKind::EpochEnd)
        .expect("end");
    assert!(begin.a() > 0, "RSS is readable");
    assert!(
        end.b() >= begin.a() + 48 * MIB,
        "the sampler saw the 64 MiB block: begin {} peak {}",
        begin.a(),
        end.b()
    );
    assert!(end.b() >= end.a());
}

/// `Handle::cpu_sample` (what the Python package calls) is one sample of the sampler's kind.
fn one_rss_sample_raises_the_epoch_peak() {
    let path = trace_path("epochs-rss-one");
    let config = RecorderConfig {
        cpu_source: CpuSource::Rss,
        ..RecorderConfig::default()
    };
    let rec = Recorder::create(&path, config).expect("recorder");
    let h = rec.handle();
    h.epoch_begin(1);
    {
        let v = black_box(vec![7u8; 64 * MIB as usize]);
        h.cpu_sample();
        drop(v);
    }
    h.epoch_end(1);
    rec.finish().expect("finish");
    let t = Trace::read(&path);
    let kinds: Vec<_> = t.marks.iter().map(|m| m.kind()).collect();
    assert_eq!(
        kinds,
        [
            MarkKind::EpochBegin,
            MarkKind::CpuSample,
            MarkKind::EpochEnd
        ]
    );
    let (begin, sample, end) = (&t.marks[0], &t.marks[1], &t.marks[2]);
    assert!(
        sample.a() >= begin.a() + 48 * MIB,
        "the sample saw the block"
    );
    assert_eq!(
        end.b(),
        sample.a().max(end.a()),
        "the end's peak is the sample's"
    );
}

fn no_source_records_marks_without_figures() {
    let path = trace_path("epochs-none");
    let rec = Recorder::create(&path, RecorderConfig::default()).expect("recorder");
    let h = rec.handle();
    let sampler = h.start_cpu_sampler(Duration::from_millis(1));
    h.epoch_begin(7);
    h.epoch_end(7);
    drop(sampler);
    rec.finish().expect("finish");
    let t = Trace::read(&path);
    let figures: Vec<_> = t
        .marks
        .iter()
        .map(|m| (m.kind(), m.aux(), m.a(), m.b()))
        .collect();
    assert_eq!(
        figures,
        [
            (MarkKind::EpochBegin, 7, 0, 0),
            (MarkKind::EpochEnd, 7, 0, 0)
        ],
        "no samples and no figures without a CPU source"
    );
}
