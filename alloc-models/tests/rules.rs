//! One test per rule of PyTorch's caching allocator that the model follows: each sets up a
//! state in which the rule decides the outcome, so that the test fails if the rule is
//! removed or changed.

use poolsight_alloc_models::pytorch::replay::{min_capacity, replay, Config, Op, Request};
use poolsight_alloc_models::pytorch::{
    check::check, get_allocation_size, round_size, Allocator, SegmentOp, Settings,
};

const MIB: u64 = 1 << 20;
const KIB: u64 = 1 << 10;

fn alloc(conf: &str, capacity: Option<u64>) -> Allocator {
    Allocator::new(Settings::parse(conf).unwrap(), capacity).with_log()
}

fn seg_allocs(a: &Allocator) -> Vec<u64> {
    a.segment_log()
        .iter()
        .filter(|e| matches!(e.op, SegmentOp::Alloc | SegmentOp::Map))
        .map(|e| e.size)
        .collect()
}

#[test]
fn round_size_512_minimum_and_steps() {
    let d = Settings::default();
    assert_eq!(round_size(&d, 1), 512);
    assert_eq!(round_size(&d, 512), 512);
    assert_eq!(round_size(&d, 513), 1024);
    assert_eq!(round_size(&d, 5 * MIB + 1), 5 * MIB + 512);
    let mut a = alloc("", None);
    assert_eq!(a.malloc(513, 0).unwrap().size, 1024);
}

#[test]
fn roundup_power2_divisions_rounds_to_steps_between_powers_of_two() {
    let s = Settings::parse("roundup_power2_divisions:4").unwrap();
    // 5 MiB lies in [4, 8) MiB: steps of 1 MiB.
    assert_eq!(round_size(&s, 5 * MIB + 1), 6 * MIB);
    assert_eq!(round_size(&s, 6 * MIB), 6 * MIB);
    assert_eq!(round_size(&s, 8 * MIB), 8 * MIB);
    // Too small for the steps (<= 512 * divisions): 512-byte steps.
    assert_eq!(round_size(&s, 1500), 1536);
    // PyTorch's own example: 1200 with 4 divisions in [1024, 2048) is 1280, once past 2048.
    assert_eq!(round_size(&s, 2100), 2560);
}

#[test]
fn roundup_power2_divisions_per_interval() {
    let s = Settings::parse("roundup_power2_divisions:[1:0,4:4,8:0]").unwrap();
    assert_eq!(round_size(&s, 5 * MIB + 1), 6 * MIB);
    assert_eq!(round_size(&s, 9 * MIB + 1), 9 * MIB + 512);
    assert_eq!(round_size(&s, 3 * MIB + 1), 3 * MIB + 512);
    // Rounding changes which cached block a request takes: 5 MiB + 1 becomes 6 MiB, and a
    // cached 5.5 MiB block no longer serves it.
    let mut a = alloc("roundup_power2_divisions:[1:0,4:4,8:0]", None);
    let h = a.malloc(11 * MIB, 0).unwrap();
    let r = a.malloc(5 * MIB + 1, 0).unwrap();
    assert_eq!(r.size, 6 * MIB);
    a.free(h.id);
    a.free(r.id);
}

#[test]
fn segment_sizes_from_get_allocation_size() {
    assert_eq!(get_allocation_size(512), 2 * MIB);
    assert_eq!(get_allocation_size(MIB), 2 * MIB);
    assert_eq!(get_allocation_size(MIB + 512), 20 * MIB);
    assert_eq!(get_allocation_size(10 * MIB - 512), 20 * MIB);
    assert_eq!(get_allocation_size(10 * MIB), 10 * MIB);
    assert_eq!(get_allocation_size(11 * MIB + 512), 12 * MIB);
    let mut a = alloc("", None);
    a.malloc(100, 0).unwrap();
    // 11 MiB in a 12 MiB segment: 1 MiB remains, too little to split off; so 3 MiB needs a
    // segment of its own, 20 MiB.
    a.malloc(11 * MIB, 0).unwrap();
    a.malloc(3 * MIB, 0).unwrap();
    assert_eq!(seg_allocs(&a), vec![2 * MIB, 12 * MIB, 20 * MIB]);
}

#[test]
fn small_and_large_pools_are_apart() {
    let mut a = alloc("", None);
    // A free 2 MiB small segment does not serve a 1.5 MiB (large) request.
    let s = a.malloc(MIB, 0).unwrap();
    a.free(s.id);
    a.malloc(MIB + MIB / 2, 0).unwrap();
    assert_eq!(seg_allocs(&a), vec![2 * MIB, 20 * MIB]);
    // And a free part of a large segment does not serve a small request.
    a.malloc(4 * KIB, 0).unwrap();
    assert_eq!(seg_allocs(&a), vec![2 * MIB, 20 * MIB]);
    let mut b = alloc("", None);
    let l = b.malloc(MIB + 512, 0).unwrap();
    b.free(l.id);
    b.malloc(MIB, 0).unwrap();
    assert_eq!(seg_allocs(&b), vec![20 * MIB, 2 * MIB]);
}

#[test]
fn best_fit_by_size_then_address() {
    let mut a = alloc("", None);
    let x = a.malloc(16 * MIB, 0).unwrap();
    let y = a.malloc(12 * MIB, 0).unwrap();
    let z = a.malloc(12 * MIB, 0).unwrap();
    a.free(z.id);
    a.free(x.id);
    a.free(y.id);
    // The smallest block that fits (12 MiB, not 16), and of two equal, the lower address.
    let r = a.malloc(11 * MIB, 0).unwrap();
    assert_eq!(r.addr, y.addr.min(z.addr));
    let r2 = a.malloc(11 * MIB, 0).unwrap();
    assert_eq!(r2.addr, y.addr.max(z.addr));
    let r3 = a.malloc(11 * MIB, 0).unwrap();
    assert_eq!(r3.addr, x.addr);
    assert_eq!(seg_allocs(&a).len(), 3);
}

#[test]
fn a_block_is_reused_only_on_its_stream() {
    let mut a = alloc("", None);
    let x = a.malloc(12 * MIB, 0).unwrap();
    a.free(x.id);
    let y = a.malloc(12 * MIB, 1).unwrap();
    assert_ne!(y.addr, x.addr);
    assert_eq!(seg_allocs(&a).len(), 2);
    let z = a.malloc(12 * MIB, 0).unwrap();
    assert_eq!(z.addr, x.addr);
    // Stream 1's free block, though it fits, does not serve stream 0.
    a.free(y.id);
    let w = a.malloc(11 * MIB, 0).unwrap();
    assert_ne!(w.addr, y.addr);
    assert_eq!(seg_allocs(&a).len(), 3);
}

#[test]
fn oversize_blocks_serve_only_oversize_requests() {
    let mut a = alloc("max_split_size_mb:20", None);
    let big = a.malloc(25 * MIB, 0).unwrap();
    a.free(big.id);
    // 5 MiB is below max_split_size: the cached 26 MiB block is refused, a new segment made.
    a.malloc(5 * MIB, 0).unwrap();
    assert_eq!(seg_allocs(&a), vec![26 * MIB, 20 * MIB]);
    // Without the limit the cached block is split and used.
    let mut b = alloc("", None);
    let big = b.malloc(25 * MIB, 0).unwrap();
    b.free(big.id);
    let r = b.malloc(5 * MIB, 0).unwrap();
    assert_eq!(r.addr, big.addr);
}

#[test]
fn oversize_blocks_round_up_only_within_max_non_split_rounding() {
    let mut a = alloc("max_split_size_mb:20", None);
    let big = a.malloc(40 * MIB, 0).unwrap();
    a.free(big.id);
    // 21 MiB: the 40 MiB block is less than 21 + 20 MiB: it serves, unsplit.
    let r = a.malloc(21 * MIB, 0).unwrap();
    assert_eq!((r.addr, r.size), (big.addr, 40 * MIB));
    a.free(r.id);
    // 20 MiB: 40 >= 20 + 20: refused, a new segment.
    let r = a.malloc(20 * MIB, 0).unwrap();
    assert_ne!(r.addr, big.addr);
    // A larger rounding limit accepts it.
    let mut b = alloc("max_split_size_mb:20,max_non_split_rounding_mb:64", None);
    let big = b.malloc(40 * MIB, 0).unwrap();
    b.free(big.id);
    assert_eq!(b.malloc(20 * MIB, 0).unwrap().addr, big.addr);
}

#[test]
fn should_split_large_only_past_1mib_small_past_512_bytes() {
    let mut a = alloc("", None);
    // 19.5 MiB in a 20 MiB segment: 0.5 MiB would remain, not more than 1 MiB: no split.
    let r = a.malloc(19 * MIB + MIB / 2, 0).unwrap();
    assert_eq!(r.size, 20 * MIB);
    // 5 MiB in a 20 MiB segment: 15 MiB remain, split: the next 5 MiB shares the segment.
    let x = a.malloc(5 * MIB, 0).unwrap();
    let y = a.malloc(5 * MIB, 0).unwrap();
    assert_eq!(y.addr, x.addr + 5 * MIB);
    // Small pool: 1 MiB of a 2 MiB segment leaves 1 MiB, split.
    let s1 = a.malloc(MIB, 0).unwrap();
    let s2 = a.malloc(MIB, 0).unwrap();
    assert_eq!(s2.addr, s1.addr + MIB);
    assert_eq!(seg_allocs(&a), vec![20 * MIB, 20 * MIB, 2 * MIB]);
    // With max_split_size, a request at or above it is never split.
    let mut b = alloc("max_split_size_mb:20", None);
    let r = b.malloc(30 * MIB, 0).unwrap();
    b.free(r.id);
    let r = b.malloc(25 * MIB, 0).unwrap();
    assert_eq!(r.size, 30 * MIB);
}

#[test]
fn freed_blocks_merge_with_free_neighbours() {
    let mut a = alloc("", None);
    let x = a.malloc(5 * MIB, 0).unwrap();
    let y = a.malloc(5 * MIB, 0).unwrap();
    let _z = a.malloc(5 * MIB, 0).unwrap();
    a.free(y.id);
    a.free(x.id);
    // x and y merged: 10 MiB at the segment's start serve 9 MiB.
    let r = a.malloc(9 * MIB, 0).unwrap();
    assert_eq!(r.addr, x.addr);
    assert_eq!(seg_allocs(&a).len(), 1);
    // 1 MiB would remain of the merged 10 MiB: not split; the free 5 MiB at the end is the
    // segment's only inactive split.
    assert_eq!(r.size, 10 * MIB);
    assert_eq!(a.stats().inactive_split, 5 * MIB);
}

#[test]
fn garbage_collection_frees_old_cached_segments_past_the_threshold() {
    let conf = "garbage_collection_threshold:0.5,per_process_memory_fraction:0.5";
    let mut a = alloc(conf, Some(100 * MIB));
    let x = a.malloc(12 * MIB, 0).unwrap();
    a.free(x.id);
    let y = a.malloc(14 * MIB, 0).unwrap();
    a.free(y.id);
    // 26 MiB reserved is past 0.5 x 50 MiB: collection frees the cached segments before the
    // new one is made.
    a.malloc(16 * MIB, 0).unwrap();
    assert!(a.stats().reserved < 42 * MIB, "{:?}", a.stats());
    // Without a threshold nothing is freed (the fraction alone allows 50 MiB).
    let mut b = alloc("per_process_memory_fraction:0.5", Some(100 * MIB));
    let x = b.malloc(12 * MIB, 0).unwrap();
    b.free(x.id);
    let y = b.malloc(14 * MIB, 0).unwrap();
    b.free(y.id);
    b.malloc(16 * MIB, 0).unwrap();
    assert_eq!(b.stats().reserved, 42 * MIB);
}

#[test]
fn memory_fraction_limits_what_may_be_reserved() {
    let mut a = alloc("per_process_memory_fraction:0.5", Some(100 * MIB));
    a.malloc(40 * MIB, 0).unwrap();
    let e = a.malloc(12 * MIB, 0).unwrap_err();
    assert_eq!(e.alloc_size, 12 * MIB);
    let mut b = alloc("", Some(100 * MIB));
    b.malloc(40 * MIB, 0).unwrap();
    assert!(b.malloc(12 * MIB, 0).is_ok());
}

#[test]
fn oversize_cached_blocks_are_released_before_everything_else() {
    let mut a = alloc("max_split_size_mb:25", Some(80 * MIB));
    let big = a.malloc(40 * MIB, 0).unwrap();
    let _b = a.malloc(4 * MIB, 0).unwrap();
    let s = a.malloc(KIB, 0).unwrap();
    a.free(big.id);
    a.free(s.id);
    assert_eq!(a.stats().reserved, 62 * MIB);
    // 62 + 20 > 80: the cached 40 MiB oversize block goes, and only it: the free small
    // segment stays.
    a.malloc(19 * MIB + MIB / 2, 0).unwrap();
    assert_eq!(a.stats().reserved, 42 * MIB);
    assert_eq!(a.stats().device_frees, 1);
}

#[test]
fn all_cached_blocks_are_released_and_the_request_retried() {
    let mut a = alloc("", Some(40 * MIB));
    let x = a.malloc(12 * MIB, 0).unwrap();
    a.free(x.id);
    let r = a.malloc(30 * MIB, 0).unwrap();
    assert_eq!(r.size, 30 * MIB);
    assert_eq!(a.stats().reserved, 30 * MIB);
    let log = a.segment_log();
    assert_eq!(log[1].op, SegmentOp::Free);
}

#[test]
fn out_of_memory_when_nothing_can_be_released() {
    let mut a = alloc("", Some(40 * MIB));
    let _x = a.malloc(12 * MIB, 0).unwrap();
    let e = a.malloc(30 * MIB, 0).unwrap_err();
    assert_eq!((e.requested, e.alloc_size), (30 * MIB, 30 * MIB));
    assert_eq!(e.reserved, 12 * MIB);
}

#[test]
fn empty_cache_releases_unsplit_cached_segments() {
    let mut a = alloc("", None);
    let x = a.malloc(12 * MIB, 0).unwrap();
    let y = a.malloc(5 * MIB, 0).unwrap();
    let _z = a.malloc(5 * MIB, 0).unwrap();
    a.free(x.id);
    a.free(y.id);
    a.empty_cache();
    // The 12 MiB segment is free and goes; the 20 MiB one still holds z.
    assert_eq!(a.stats().reserved, 20 * MIB);
}

#[test]
fn a_free_requested_block_waits_for_its_completion() {
    let mut a = alloc("", None);
    let x = a.malloc(5 * MIB, 0).unwrap();
    a.free_requested(x.id);
    assert_eq!(a.stats().allocated, 0);
    let y = a.malloc(5 * MIB, 0).unwrap();
    assert_ne!(y.addr, x.addr);
    a.free_completed(x.id);
    let z = a.malloc(5 * MIB, 0).unwrap();
    assert_eq!(z.addr, x.addr);
}

#[test]
fn releasing_the_cache_waits_for_pending_frees() {
    let mut a = alloc("", Some(20 * MIB));
    let x = a.malloc(12 * MIB, 0).unwrap();
    a.free_requested(x.id);
    // 12 + 10 > 20: the release path synchronizes, x's free completes and its segment goes.
    assert!(a.malloc(10 * MIB, 0).is_ok());
    assert_eq!(a.stats().reserved, 10 * MIB);
    // Its recorded completion later changes nothing.
    a.free_completed(x.id);
    assert_eq!(a.stats().reserved, 10 * MIB);
}

#[test]
fn expandable_segments_grow_one_segment_in_pages() {
    let mut a = alloc("expandable_segments:True", Some(1 << 30));
    let x = a.malloc(5 * MIB, 0).unwrap();
    let y = a.malloc(5 * MIB, 0).unwrap();
    assert_eq!(a.stats().reserved, 20 * MIB);
    let z = a.malloc(30 * MIB, 0).unwrap();
    // The free 10 MiB at the end grows by one 20 MiB page: 40 MiB, one address range.
    assert_eq!(a.stats().reserved, 40 * MIB);
    assert_eq!(y.addr, x.addr + 5 * MIB);
    assert_eq!(z.addr, x.addr + 10 * MIB);
    assert_eq!(seg_allocs(&a), vec![20 * MIB, 20 * MIB]);
    // Small requests map 2 MiB pages of a segment of their own.
    a.malloc(KIB, 0).unwrap();
    assert_eq!(a.stats().reserved, 42 * MIB);
    a.free(x.id);
    a.free(y.id);
    a.free(z.id);
    a.empty_cache();
    // The small segment still holds its block; the large one is unmapped.
    assert_eq!(a.stats().reserved, 2 * MIB);
    let unmaps = a
        .segment_log()
        .iter()
        .filter(|e| e.op == SegmentOp::Unmap)
        .count();
    assert_eq!(unmaps, 1);
    // Without expandable segments the same requests take 20 + 30 MiB.
    let mut b = alloc("", None);
    b.malloc(5 * MIB, 0).unwrap();
    b.malloc(5 * MIB, 0).unwrap();
    b.malloc(30 * MIB, 0).unwrap();
    assert_eq!(b.stats().reserved, 50 * MIB);
}

#[test]
fn expandable_segments_are_per_stream() {
    let mut a = alloc("expandable_segments:True", Some(1 << 30));
    let x = a.malloc(5 * MIB, 0).unwrap();
    let y = a.malloc(5 * MIB, 1).unwrap();
    assert_eq!(a.stats().reserved, 40 * MIB);
    assert!(y.addr.abs_diff(x.addr) >= 1 << 30);
}

fn req(op: Op, addr: u64, size: u64, ns: u64) -> Request {
    Request {
        op,
        stream: 0,
        addr,
        size,
        ns,
        stack: 0,
    }
}

/// A run that fragments: 12 MiB blocks freed between 14 MiB ones, then 14 MiB requests that
/// the 12 MiB holes cannot take.
fn fragmenting_run() -> Vec<Request> {
    let mut v = Vec::new();
    let mut ns = 0;
    let mut next = |op, addr, size| {
        ns += 1000;
        req(op, addr, size, ns)
    };
    for i in 0..4 {
        v.push(next(Op::Malloc, 0x1000 + i * 0x10_0000_0000, 12 * MIB));
        v.push(next(Op::Malloc, 0x2000 + i * 0x10_0000_0000, 14 * MIB));
    }
    for i in 0..4 {
        v.push(next(Op::Free, 0x1000 + i * 0x10_0000_0000, 12 * MIB));
    }
    for i in 0..3 {
        v.push(next(Op::Malloc, 0x3000 + i * 0x10_0000_0000, 14 * MIB));
    }
    v
}

#[test]
fn replay_reports_the_peak_fragmentation_and_first_failure() {
    let run = fragmenting_run();
    let cfg = |conf: &str, cap| Config {
        settings: Settings::parse(conf).unwrap(),
        capacity: cap,
        stop_at_failure: false,
    };
    let out = replay(&run, &cfg("", None));
    // 4 x 12 + 4 x 14 + 3 x 14 MiB.
    assert_eq!(out.reserved_peak, 146 * MIB);
    assert_eq!(out.allocated_peak, 104 * MIB);
    assert_eq!(out.fragmentation, 48 * MIB);
    assert!(out.first_failure.is_none());
    // On 120 MiB the second 14 MiB request does not fit beside the cached 12 MiB segments:
    // they are released and it is retried.
    let out = replay(&run, &cfg("", Some(120 * MIB)));
    assert!(out.first_failure.is_none());
    assert_eq!(out.reserved_peak, 118 * MIB);
    // On 100 MiB the fourth 14 MiB block does not fit beside the other seven live ones.
    let out = replay(&run, &cfg("", Some(100 * MIB)));
    let f = out.first_failure.unwrap();
    assert_eq!((f.index, f.requested), (7, 14 * MIB));
    assert_eq!(f.reserved, 90 * MIB);

    // Eight 7 MiB blocks: two per 20 MiB segment (6 MiB left in each), 80 MiB; expandable
    // segments tile them into three 20 MiB pages.
    let sevens: Vec<Request> = (0..8)
        .map(|i| req(Op::Malloc, 0x1000 * (i + 1), 7 * MIB, 1000 * (i + 1)))
        .collect();
    assert_eq!(replay(&sevens, &cfg("", None)).reserved_peak, 80 * MIB);
    let out = replay(&sevens, &cfg("", Some(70 * MIB)));
    assert_eq!(out.first_failure.unwrap().index, 6);
    let out = replay(&sevens, &cfg("expandable_segments:True", Some(70 * MIB)));
    assert!(out.first_failure.is_none(), "{out:?}");
    assert_eq!(out.reserved_peak, 60 * MIB);
}

#[test]
fn min_capacity_is_the_smallest_that_fits() {
    let run = fragmenting_run();
    let d = Settings::default();
    let c = min_capacity(&run, &d).unwrap();
    let fits = |cap| {
        replay(
            &run,
            &Config {
                settings: d.clone(),
                capacity: Some(cap),
                stop_at_failure: true,
            },
        )
        .first_failure
        .is_none()
    };
    assert!(fits(c));
    assert!(!fits(c - 2 * MIB));
    assert_eq!(c, 104 * MIB);
}

#[test]
fn check_agrees_with_a_recording_made_by_the_same_rules() {
    // What PyTorch records for: 5 MiB, 5 MiB, free the first, 3 MiB, 11 MiB.
    let base = 0x7f00_0000_0000u64;
    let run = vec![
        req(Op::Acquire, base, 20 * MIB, 1),
        req(Op::Malloc, base, 5 * MIB, 2),
        req(Op::Malloc, base + 5 * MIB, 5 * MIB, 3),
        req(Op::FreeRequested, base, 5 * MIB, 4),
        req(Op::Free, base, 5 * MIB, 4),
        req(Op::Malloc, base, 3 * MIB, 5),
        req(Op::Acquire, base + 40 * MIB, 12 * MIB, 6),
        req(Op::Malloc, base + 40 * MIB, 11 * MIB, 6),
    ];
    let a = check(&run, &Settings::default(), None, &[]);
    assert!(a.exact(), "{a:?}");
    assert_eq!((a.segments_recorded, a.blocks_checked), (2, 4));
    assert!(a.starts_empty);
    // A recording that placed the 3 MiB block elsewhere disagrees, and says where.
    let mut other = run.clone();
    other[5].addr = base + 10 * MIB;
    let a = check(&other, &Settings::default(), None, &[]);
    assert_eq!(a.block_offsets_matching, 3);
    assert!(a.first_mismatch.unwrap().contains("offset 10485760"));
    // With other settings the segments differ.
    let a = check(
        &run,
        &Settings::parse("expandable_segments:True").unwrap(),
        None,
        &[],
    );
    assert!(!a.exact());
}

#[test]
fn expandable_best_fit_counts_the_unmapped_range_after_a_block() {
    let mut a = alloc("expandable_segments:True", Some(1 << 30));
    let x = a.malloc(10 * MIB, 0).unwrap();
    let _y = a.malloc(2 * MIB, 0).unwrap();
    a.free(x.id);
    // Free: 10 MiB at the start (before y), 8 MiB at the end of the mapped page (before the
    // unmapped rest). By size the 8 MiB block fits 7 MiB best; counted with the range it can
    // grow into, it is the larger, and the 10 MiB block is taken.
    let r = a.malloc(7 * MIB, 0).unwrap();
    assert_eq!(r.addr, x.addr);
}

#[test]
fn absurd_requests_fail_without_disturbing_the_model() {
    let mut a = alloc("", None);
    let x = a.malloc(5 * MIB, 0).unwrap();
    for _ in 0..3 {
        assert!(a.malloc(u64::MAX, 0).is_err());
        assert!(a.malloc(1 << 60, 1).is_err());
    }
    a.free(x.id);
    assert_eq!(a.stats().reserved, 20 * MIB);
    assert_eq!(a.malloc(5 * MIB, 0).unwrap().addr, x.addr);
}

#[test]
fn oversize_cached_blocks_are_released_largest_first_until_enough() {
    let mut a = alloc("max_split_size_mb:25", Some(110 * MIB));
    let x = a.malloc(30 * MIB, 0).unwrap();
    let y = a.malloc(40 * MIB, 0).unwrap();
    let s = a.malloc(KIB, 0).unwrap();
    a.free(x.id);
    a.free(y.id);
    a.free(s.id);
    // No cached block holds 60 MiB, and 72 + 60 > 110: the 40 MiB block goes, then the
    // 30 MiB one (70 MiB >= 60): the small segment stays.
    let r = a.malloc(60 * MIB, 0).unwrap();
    assert_eq!(r.size, 60 * MIB);
    assert_eq!(a.stats().reserved, 62 * MIB);
    let frees: Vec<u64> = a
        .segment_log()
        .iter()
        .filter(|e| e.op == SegmentOp::Free)
        .map(|e| e.size)
        .collect();
    assert_eq!(frees, vec![40 * MIB, 30 * MIB]);
}
