//! The HTML report, end to end without a browser: record a small run, build the page's data
//! and check it says what the trace says (the timeline's exact peak, the stacks live at it),
//! that snapshots stay bounded, and that names from user code reach the page only as escaped
//! data. (tests/browser/ opens the page in Chromium.)

use crate::support::{record_on_pool, scratch};

use std::path::Path;

use poolsight::analyzer::replay::live_over_time;
use poolsight::analyzer::views::html::{self, data, Part};
use poolsight::analyzer::{replay, Profile, ReplayOptions, Trace};
use poolsight::pool::MemoryPool;
use poolsight::recorder::{Handle, Phase};

const HOSTILE: &str = "</script><img src=x onerror=alert(1)>";

fn trace_path(name: &str) -> scratch::Scratch {
    scratch::file(&format!("{name}.pstrace"))
}

fn replayed(path: &Path) -> (Trace, Profile) {
    let trace = Trace::open(path).expect("open");
    let opts = ReplayOptions {
        live_at_peak: true,
        ..Default::default()
    };
    let profile = replay(&trace, 0, &opts);
    (trace, profile)
}

/// Steps that each allocate under a hostile and a plain function, keeping some blocks for a
/// while; the peak is in the middle.
fn steps(h: &Handle, pool: &MemoryPool) {
    let mut kept = Vec::new();
    for step in 0..40u64 {
        let _f = h.function(HOSTILE, Phase::Forward);
        kept.push(pool.malloc(1024 * (step % 7 + 1)).expect("malloc"));
        let _g = h.function("Plain", Phase::Backward);
        drop(pool.malloc(4096).expect("malloc"));
        if step == 20 {
            kept.clear();
        }
    }
}

#[test]
fn the_timeline_holds_the_exact_peak_and_what_was_live_at_it() {
    let path = trace_path("peak");
    record_on_pool(&path, steps);
    let (trace, profile) = replayed(&path);
    let live = live_over_time(&trace, &profile.sources[0].series, html::LIVE_STACKS);
    let parts = [Part {
        name: "run".into(),
        profile: &profile,
        live: &live,
    }];
    let d = data::report("t", &parts, &profile);
    let run = &d.runs[0];
    let pool = &profile.sources[0].pool;
    assert_eq!(run.peak_used_bytes, pool.peak_used_bytes);
    assert_eq!(
        run.used.iter().copied().max(),
        Some(pool.peak_used_bytes as i64)
    );
    // Every snapshot adds up to its point's maximum.
    for (i, flat) in run.live.iter().enumerate() {
        let bytes: u64 = flat.chunks(2).map(|p| p[1]).sum::<u64>() + run.live_other[i];
        assert_eq!(bytes as i64, run.used[i], "point {i}");
    }
    // At the peak point, the stacks are the live-at-peak flamegraph's.
    let at = run
        .used
        .iter()
        .position(|&u| u == pool.peak_used_bytes as i64)
        .expect("peak");
    let mut got: Vec<(String, u64)> = run.live[at]
        .chunks(2)
        .map(|p| {
            let path = &run.stacks[p[0] as usize];
            (
                d.frames[*path.last().expect("frame") as usize].clone(),
                p[1],
            )
        })
        .collect();
    got.sort();
    let tree = &profile.tree;
    let mut want: Vec<(String, u64)> = (1..tree.nodes.len())
        .filter(|&i| tree.nodes[i].agg.live_at_peak_bytes > 0)
        .map(|i| {
            let f = &tree.nodes[i].frame;
            (
                format!("{} ({}:{})", f.name, f.file, f.line),
                tree.nodes[i].agg.live_at_peak_bytes,
            )
        })
        .collect();
    want.sort();
    assert_eq!(got, want);
    assert!(got[0].0.starts_with(HOSTILE), "{got:?}");
}

#[test]
fn snapshots_keep_the_largest_stacks_and_sum_the_rest() {
    let path = trace_path("keep");
    record_on_pool(&path, steps);
    let (trace, profile) = replayed(&path);
    let all = live_over_time(&trace, &profile.sources[0].series, usize::MAX);
    let one = live_over_time(&trace, &profile.sources[0].series, 1);
    for (a, o) in all.points.iter().zip(&one.points) {
        assert!(o.stacks.len() <= 1);
        assert_eq!(o.stacks.first(), a.stacks.first());
        let rest: u64 = a.stacks.iter().skip(1).map(|s| s.1).sum();
        assert_eq!(o.other, rest + a.other);
    }
}

#[test]
fn hostile_names_reach_the_page_only_as_escaped_data() {
    let path = trace_path("hostile");
    record_on_pool(&path, steps);
    let (trace, profile) = replayed(&path);
    let page = html::report_page(HOSTILE, &[trace], &[profile]);
    assert!(!page.contains("<img"), "no markup from the trace");
    assert_eq!(
        page.matches("</script>").count(),
        2,
        "the page's own two scripts end, nothing else"
    );
    assert!(page.contains("\\u003c/script\\u003e\\u003cimg src=x onerror=alert(1)\\u003e"));
}
