//! The HTML report, end to end without a browser: record a small run, build the page's data
//! and check it says what the trace says (the timeline's exact peak, the stacks live at it;
//! by category and by module, the bytes of every point and the figures of `poolsight
//! categories`), that snapshots stay bounded, that bands have names of their own, and that
//! names from user code reach the page only as escaped data. (tests/browser/ opens the page in
//! Chromium.)

use crate::support::{cli, fixture, record_on_pool, scratch};

use std::collections::{HashMap, HashSet};
use std::path::Path;

use poolsight::analyzer::read::names::FrameKind;
use poolsight::analyzer::replay::{live_over_time, Frame, LiveOverTime};
use poolsight::analyzer::views::html::data::{Bands, ReportData};
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
    let (d, profile, _) = page_data(&path);
    let run = &d.runs[0];
    let stacks = by(&d, 0, "stack");
    let pool = &profile.sources[0].pool;
    assert_eq!(run.peak_used_bytes, pool.peak_used_bytes);
    assert_eq!(
        run.used.iter().copied().max(),
        Some(pool.peak_used_bytes as i64)
    );
    // Every snapshot adds up to its point's maximum.
    for (i, flat) in stacks.live.iter().enumerate() {
        let bytes: u64 = flat.chunks(2).map(|p| p[1]).sum::<u64>() + stacks.other[i];
        assert_eq!(bytes as i64, run.used[i], "point {i}");
    }
    // At the peak point, the stacks are the live-at-peak flamegraph's.
    let at = run
        .used
        .iter()
        .position(|&u| u == pool.peak_used_bytes as i64)
        .expect("peak");
    let mut got: Vec<(String, u64)> = stacks.live[at]
        .chunks(2)
        .map(|p| {
            let path = &stacks.paths[p[0] as usize];
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
    let all = live_over_time(
        &trace,
        &profile.sources[0].series,
        usize::MAX,
        usize::MAX,
        &[],
    );
    let one = live_over_time(&trace, &profile.sources[0].series, 1, 1, &[]);
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

/// A trace's page data as `poolsight html` computes it (categories for a labelled trace).
fn page_data(path: &Path) -> (ReportData, Profile, LiveOverTime) {
    let (trace, profile) = replayed(path);
    let live = live_over_time(
        &trace,
        &profile.sources[0].series,
        html::LIVE_STACKS,
        html::LIVE_GROUPS,
        &[],
    );
    let parts = [Part {
        name: "run".into(),
        profile: &profile,
        live: &live,
    }];
    let d = data::report("t", &parts, &profile);
    (d, profile, live)
}

/// Run `run`'s bands split by `by` (`stack`, `category` or `module`).
fn by<'d>(d: &'d ReportData, run: usize, by: &str) -> &'d Bands {
    d.runs[run]
        .bands
        .iter()
        .find(|b| b.by == by)
        .unwrap_or_else(|| panic!("no bands by {by}"))
}

/// Bytes of `group` at each point of `bands`.
fn series_of(bands: &Bands, group: u32) -> Vec<u64> {
    bands
        .live
        .iter()
        .map(|flat| {
            flat.chunks(2)
                .find(|p| p[0] == u64::from(group))
                .map_or(0, |p| p[1])
        })
        .collect()
}

#[test]
fn the_timeline_stacks_by_category_module_or_stack_as_the_trace_allows() {
    let ways = |name: &str| -> Vec<&'static str> {
        let (d, _, _) = page_data(&fixture(name));
        d.runs[0].bands.iter().map(|b| b.by).collect()
    };
    assert_eq!(ways("torch/categories"), ["stack", "category", "module"]);
    assert_eq!(
        ways("chainer_nested"),
        ["stack", "module"],
        "links, no labels"
    );
    assert_eq!(ways("cupy_line_profile"), ["stack"], "neither");
}

#[test]
fn every_way_of_stacking_adds_up_to_the_used_bytes_of_each_point() {
    let (d, _, _) = page_data(&fixture("torch/categories"));
    let run = &d.runs[0];
    for bands in &run.bands {
        assert_eq!(bands.live.len(), run.used.len(), "{}", bands.by);
        assert_eq!(bands.other.len(), run.used.len(), "{}", bands.by);
        for (i, flat) in bands.live.iter().enumerate() {
            let bytes: u64 = flat.chunks(2).map(|p| p[1]).sum::<u64>() + bands.other[i];
            assert_eq!(bytes as i64, run.used[i], "by {}, point {i}", bands.by);
            let keep = if bands.by == "stack" {
                html::LIVE_STACKS
            } else {
                html::LIVE_GROUPS
            };
            assert!(flat.len() / 2 <= keep);
        }
        assert!(bands.top.len() <= data::TOP_STACKS);
        assert_eq!(bands.names.len(), bands.paths.len());
    }
    // PyTorch's categories, every one of them a band of its own.
    let categories = by(&d, 0, "category");
    let mut names = categories.names.clone();
    names.sort();
    assert_eq!(
        names,
        [
            "activation",
            "gradient",
            "input",
            "optimizer_state",
            "parameter",
            "temporary"
        ]
    );
    assert_eq!(categories.top.len(), names.len());
}

#[test]
fn a_grouping_counts_every_live_stack_not_only_those_kept() {
    let path = fixture("torch/categories");
    let (trace, profile) = replayed(&path);
    let series = &profile.sources[0].series;
    let all = live_over_time(&trace, series, usize::MAX, usize::MAX, &[]);
    let one = live_over_time(&trace, series, 1, 1, &[]);
    assert_eq!(all.points.len(), series.points.len());
    let label = |frames: &[Frame]| {
        frames
            .iter()
            .rev()
            .find(|f| f.kind == FrameKind::Label)
            .map(|f| f.name.to_string())
    };
    let links = |frames: &[Frame]| -> Vec<Frame> {
        frames
            .iter()
            .filter(|f| f.kind == FrameKind::Link)
            .cloned()
            .collect()
    };
    for (i, point) in all.points.iter().enumerate() {
        assert_eq!(point.other, 0, "every stack kept");
        // Each live stack's bytes by its innermost label and by its chain of links.
        let mut categories: HashMap<Option<String>, u64> = HashMap::new();
        let mut modules: HashMap<Vec<Frame>, u64> = HashMap::new();
        for &(stack, bytes) in &point.stacks {
            let frames = &all.stacks[&stack];
            *categories.entry(label(frames)).or_default() += bytes;
            *modules.entry(links(frames)).or_default() += bytes;
        }
        let got: HashMap<Option<String>, u64> = all.by_category[i]
            .stacks
            .iter()
            .map(|&(c, b)| (all.categories[c as usize].clone(), b))
            .collect();
        assert_eq!(got, categories, "point {i}");
        let got: HashMap<Vec<Frame>, u64> = all.by_module[i]
            .stacks
            .iter()
            .map(|&(m, b)| (all.modules[m as usize].clone(), b))
            .collect();
        assert_eq!(got, modules, "point {i}");
        // Keeping one: the largest, the rest in `other`, the same total.
        for (a, o) in [
            (&all.by_category[i], &one.by_category[i]),
            (&all.by_module[i], &one.by_module[i]),
        ] {
            assert_eq!(o.stacks.first(), a.stacks.first());
            let total = |s: &poolsight::analyzer::replay::Snapshot| {
                s.stacks.iter().map(|p| p.1).sum::<u64>() + s.other
            };
            assert_eq!(total(o), total(a), "point {i}");
        }
    }
}

#[test]
fn the_category_section_shows_the_figures_of_poolsight_categories() {
    let path = fixture("torch/categories");
    let (d, profile, _) = page_data(&path);
    let cli = cli(&[
        "categories",
        "--format",
        "json",
        path.to_str().expect("path"),
    ]);
    assert_eq!(cli.code, 0, "{}", cli.stderr);
    let want = cli.json();
    let table = |id: &str| {
        d.views[0]
            .tables
            .iter()
            .find(|t| t.id == id)
            .unwrap_or_else(|| panic!("no {id}"))
    };
    let categories = table("categories-table");
    let want_categories = want["categories"].as_array().expect("categories");
    assert_eq!(categories.rows.len(), want_categories.len());
    for (got, want) in categories.rows.iter().zip(want_categories) {
        assert_eq!(got, want);
    }
    let modules = table("modules-table");
    let want_modules = want["modules"].as_array().expect("modules");
    assert_eq!(modules.rows.len(), want_modules.len());
    for (got, want) in modules.rows.iter().zip(want_modules) {
        for (key, value) in want.as_object().expect("module") {
            assert_eq!(&got[key], value, "{key} of {}", want["module"]);
        }
    }
    // The category bands at the peak's point are the table's bytes at the peak: the same
    // instant, right after the event that reached the peak.
    let run = &d.runs[0];
    let peak = profile.sources[0].pool.peak_used_bytes;
    let at = run
        .used
        .iter()
        .position(|&u| u == peak as i64)
        .expect("the peak's point");
    let bands = by(&d, 0, "category");
    for c in want_categories {
        let name = c["category"].as_str().expect("name");
        let g = bands.names.iter().position(|n| n == name).expect("band") as u32;
        assert_eq!(
            series_of(bands, g)[at],
            c["at_peak_bytes"].as_u64().expect("bytes"),
            "{name}"
        );
    }
}

#[test]
fn bands_have_names_of_their_own_that_lead_with_where_the_bytes_come_from() {
    let (d, _, live) = page_data(&fixture("torch/categories"));
    // track()'s memory is observed outside any pool: the page speaks of no pool there.
    assert!(d.observed);
    for bands in &d.runs[0].bands {
        let distinct: HashSet<&String> = bands.names.iter().collect();
        assert_eq!(
            distinct.len(),
            bands.names.len(),
            "by {}: {:?}",
            bands.by,
            bands.names
        );
        for name in &bands.names {
            assert!(!name.contains("(:0)"), "{name}");
        }
    }
    // A stack's name ends with its category alone and leads with its innermost frame that has
    // a location, as frames read.
    let stacks = by(&d, 0, "stack");
    for (g, path) in stacks.paths.iter().enumerate() {
        let frames: Vec<&str> = path
            .iter()
            .map(|&f| d.frames[f as usize].as_str())
            .collect();
        let name = &stacks.names[g];
        let last = frames.last().expect("a frame");
        assert!(name.ends_with(last), "{name} ends with {last}");
        if let Some(lead) = frames.iter().rev().find(|f| f.ends_with(')')) {
            assert!(name.contains(lead), "{name} names {lead}");
        }
    }
    // Modules of one class read apart: each is named in its parent (`linear1: Linear`).
    let modules = by(&d, 0, "module");
    let linear: Vec<&String> = modules
        .names
        .iter()
        .filter(|n| n.contains(": Linear ("))
        .collect();
    assert_eq!(linear.len(), 3, "{:?}", modules.names);
    for name in ["linear1: Linear (", "linear2: Linear (", "head: Linear ("] {
        assert!(
            linear.iter().any(|n| n.starts_with(name)),
            "{name} in {linear:?}"
        );
    }
    assert!(modules
        .names
        .contains(&"(outside every module)".to_string()));
    assert_eq!(live.modules.last(), Some(&Vec::new()));
}

/// A run with more calling contexts than a screen can show: 3,000 functions each calling 3
/// of their own, every one allocating.
fn many_contexts(h: &Handle, pool: &MemoryPool) {
    let mut kept = Vec::new();
    for i in 0..3_000u64 {
        let _f = h.function(&format!("f{i}"), Phase::Forward);
        kept.push(pool.malloc(512 * (i % 17 + 1)).expect("malloc"));
        for j in 0..3 {
            let _g = h.function(&format!("g{i}_{j}"), Phase::Forward);
            drop(pool.malloc(512).expect("malloc"));
        }
    }
}

#[test]
fn a_page_carries_what_a_screen_can_show_and_says_what_it_left_out() {
    use poolsight::analyzer::views::html::bound::{MAX_TABLE_ROWS, MAX_TREE_NODES};
    let path = trace_path("contexts");
    record_on_pool(&path, many_contexts);
    let (d, profile, _) = page_data(&path);
    let nodes = profile.tree.nodes.len();
    assert!(nodes > 12_000, "{nodes}");
    let view = &d.views[0];
    let tree = &view.tree;
    assert_eq!(tree.parent.len(), MAX_TREE_NODES);
    assert_eq!(view.elided.tree_nodes, nodes - MAX_TREE_NODES);
    // Every byte is still in the tree: the root's totals are exact.
    let all: u64 = tree.used.iter().sum();
    let want: u64 = profile.tree.nodes.iter().map(|n| n.agg.used_bytes).sum();
    assert_eq!(all, want);
    // Only the frames the tree and the bands show are named: every name is used by one of them,
    // and their count follows the kept nodes, not the whole tree. (How many stacks the bands
    // keep depends on how the run's time falls into points, so it is counted, not guessed.)
    let mut used = vec![false; d.frames.len()];
    let shown = tree.frame.iter().skip(1).copied().chain(
        d.runs
            .iter()
            .flat_map(|r| &r.bands)
            .flat_map(|b| &b.paths)
            .flatten()
            .copied(),
    );
    for f in shown {
        used[f as usize] = true;
    }
    assert!(
        used.iter().all(|&u| u),
        "a frame is named that nothing shows"
    );
    assert!(d.frames.len() < nodes / 2, "{} of {nodes}", d.frames.len());
    let lines = view
        .tables
        .iter()
        .find(|t| t.id == "lines-table")
        .expect("lines");
    assert_eq!(lines.rows.len(), MAX_TABLE_ROWS);
    assert!(view
        .elided
        .table_rows
        .contains(&("lines-table", nodes - MAX_TABLE_ROWS)));
    // Its first row, the root, is kept, and the rows keep their order.
    let order: Vec<u64> = lines
        .rows
        .iter()
        .map(|r| r["order"].as_u64().unwrap())
        .collect();
    assert_eq!(order[0], 0);
    assert!(order.windows(2).all(|w| w[0] < w[1]));
    // The page says so, and stays small.
    let (trace, profile) = replayed(&path);
    let page = html::report_page("t", &[trace], &[profile]);
    assert!(page.contains("\"elided\":{\"tree_nodes\":"));
    assert!(page.len() < 3_000_000, "{}", page.len());
}
