//! Flamegraphs and the timeline, end to end: record a small run, replay it, and check that the
//! pictures say what the trace says (widths add up to the reports' totals, one band per epoch,
//! the peak where the pool peaked), that they are the same bytes every time, and that names
//! from user code cannot inject markup.

use crate::support::{record_on_pool, scratch};

use std::path::Path;
use std::time::Duration;

use poolsight::analyzer::tables::render::humanized;
use poolsight::analyzer::views::flamegraph::{
    diff_folded, differential_svg, flamegraph_svg, folded, FlameError, Metric,
};
use poolsight::analyzer::views::timeline::{timeline_svg, TimelineError};
use poolsight::analyzer::{replay, Profile, ReplayOptions, Trace};
use poolsight::pool::MemoryPool;
use poolsight::recorder::{Handle, Phase};

/// A fresh trace path, in a folder of its own removed when the test ends.
fn trace_path(name: &str) -> scratch::Scratch {
    scratch::file(&format!("{name}.pstrace"))
}

fn profile(path: &Path) -> Profile {
    let trace = Trace::open(path).expect("open");
    replay(
        &trace,
        0,
        &ReplayOptions {
            live_at_peak: true,
            ..Default::default()
        },
    )
}

/// A small training step: a link around forward and backward functions, some blocks freed and
/// reused, some kept until the end.
fn mlp_step(h: &Handle, pool: &MemoryPool) {
    let _link = h.link("MLP");
    let kept = {
        let _f = h.function("LinearFunction", Phase::Forward);
        drop(pool.malloc(1000).expect("malloc"));
        pool.malloc(3000).expect("malloc")
    };
    {
        let _f = h.function("ReLU", Phase::Forward);
        drop(pool.malloc(600).expect("malloc"));
    }
    let _b = h.function("LinearFunction", Phase::Backward);
    drop(pool.malloc(5000).expect("malloc"));
    drop(kept);
}

fn sum(lines: &[String]) -> u64 {
    lines
        .iter()
        .map(|l| {
            let (_, v) = l.rsplit_once(' ').expect("a count");
            v.parse::<u64>().expect("an integer count")
        })
        .sum()
}

fn text(svg: Vec<u8>) -> String {
    String::from_utf8(svg).expect("utf-8 svg")
}

#[test]
fn folded_bytes_add_up_to_the_root_totals() {
    let path = trace_path("folded-sums");
    record_on_pool(&path, mlp_step);
    let p = profile(&path);
    let root = p.tree.root().total;
    assert!(root.used_bytes > 0 && root.acquired_bytes > 0);

    let used = folded(&p, Metric::Used);
    assert_eq!(sum(&used), root.used_bytes);
    assert_eq!(sum(&folded(&p, Metric::Acquired)), root.acquired_bytes);
    // 1000 and 600 round to 1024 and 1024 (512-byte unit), 3000 to 3072, 5000 to 5120.
    assert_eq!(root.used_bytes, 1024 + 3072 + 1024 + 5120);

    // Every line is a path under the link, frames `name (file:line)`, in the tree's DFS order.
    for l in &used {
        let first = l.split(';').next().expect("a frame");
        assert!(first.starts_with("MLP ("), "{l}");
        assert!(first.contains(&format!("({}:", file!())), "{l}");
        assert!(first.ends_with(')'), "{l}");
    }
    let positions: Vec<usize> = ["LinearFunction", "ReLU"]
        .iter()
        .map(|n| used.iter().position(|l| l.contains(n)).expect("a line"))
        .collect();
    assert!(positions[0] < positions[1], "first-seen order: {used:?}");
}

#[test]
fn live_at_peak_adds_up_to_the_pool_peak() {
    let path = trace_path("folded-peak");
    record_on_pool(&path, |h, pool| {
        let _s = h.scope("step");
        let a = {
            let _f = h.function("Embed", Phase::Forward);
            pool.malloc(1 << 20).expect("malloc")
        };
        let b = {
            let _f = h.function("Attention", Phase::Forward);
            drop(pool.malloc(100).expect("malloc"));
            pool.malloc(3 << 20).expect("malloc")
        };
        drop(a);
        drop(b);
        let _f = h.function("Small", Phase::Backward);
        drop(pool.malloc(512).expect("malloc"));
    });
    let p = profile(&path);
    let peak = p.sources[0].pool.peak_used_bytes;
    assert_eq!(peak, 4 << 20);
    let lines = folded(&p, Metric::Peak);
    assert_eq!(sum(&lines), peak);
    assert!(
        lines.iter().all(|l| !l.contains(":Small")),
        "Small ran after the peak: {lines:?}"
    );
}

#[test]
fn time_is_self_time_and_adds_up_to_the_outermost_scope() {
    let path = trace_path("folded-time");
    record_on_pool(&path, |h, _| {
        let _outer = h.link("Model");
        std::thread::sleep(Duration::from_millis(2));
        for _ in 0..2 {
            let _inner = h.function("MatMul", Phase::Forward);
            std::thread::sleep(Duration::from_millis(3));
        }
    });
    let p = profile(&path);
    let model = p.tree.root().children[0];
    let outer = p.tree.nodes[model].agg.time_ns;
    let lines = folded(&p, Metric::Time);
    assert_eq!(sum(&lines), outer, "self times partition the outer scope");
    let (model_line, matmul_line) = (&lines[0], &lines[1]);
    let value = |l: &str| -> u64 { l.rsplit_once(' ').expect("count").1.parse().expect("int") };
    assert!(!model_line.contains(';') && model_line.starts_with("Model ("));
    let frames: Vec<&str> = matmul_line.split(';').collect();
    assert!(frames.len() == 2 && frames[0].starts_with("Model ("));
    assert!(frames[1].starts_with("MatMul ("), "{matmul_line}");
    assert!(
        value(matmul_line) >= 6_000_000,
        "two 3 ms calls: {matmul_line}"
    );
    assert!(value(model_line) >= 2_000_000 && value(model_line) < outer);
}

#[test]
fn flamegraph_svg_is_the_same_bytes_every_time() {
    let path = trace_path("svg-deterministic");
    record_on_pool(&path, mlp_step);
    let once = flamegraph_svg(&profile(&path), Metric::Used, "used bytes").expect("svg");
    let again = flamegraph_svg(&profile(&path), Metric::Used, "used bytes").expect("svg");
    assert!(once == again, "two replays, two renders, one output");
    let svg = text(once);
    assert!(svg.starts_with("<?xml") || svg.starts_with("<svg"));
    assert!(svg.trim_end().ends_with("</svg>"));
    for name in ["MLP", "LinearFunction", "ReLU", "used bytes"] {
        assert!(svg.contains(name), "{name} drawn");
    }
    assert!(svg.contains("bytes"), "counts are labelled in bytes");
}

#[test]
fn names_from_user_code_cannot_inject_markup() {
    let path = trace_path("svg-escape");
    let evil = r#"<script>alert("x")&</script>"#;
    record_on_pool(&path, |h, pool| {
        let _f = h.function(&format!("{evil}\u{7}"), Phase::Forward);
        drop(pool.malloc(2048).expect("malloc"));
    });
    let svg = text(flamegraph_svg(&profile(&path), Metric::Used, evil).expect("svg"));
    assert!(!svg.contains(evil), "raw name in the SVG");
    assert!(
        !svg.contains('\u{7}'),
        "no control character XML cannot carry"
    );
    assert!(!svg.contains("<script>alert"));
    assert!(!svg.contains("</script>\""));
    assert!(svg.contains("&lt;script&gt;alert("), "escaped name drawn");
}

#[test]
fn semicolons_and_spaces_in_names_keep_one_frame_and_one_count() {
    let path = trace_path("folded-separators");
    record_on_pool(&path, |h, pool| {
        let _f = h.function("split;me 42", Phase::Forward);
        drop(pool.malloc(512).expect("malloc"));
    });
    let p = profile(&path);
    let lines = folded(&p, Metric::Used);
    assert_eq!(lines.len(), 1);
    let (stack, count) = lines[0].rsplit_once(' ').expect("count");
    assert_eq!(count, "512");
    assert_eq!(
        stack.split(';').count(),
        2,
        "function and call site: {stack}"
    );
    // The name keeps its ordinary space: the count is read after the line's last one.
    assert!(stack.starts_with("split:me 42 ("), "{stack}");
    let svg = text(flamegraph_svg(&p, Metric::Used, "t").expect("renders"));
    assert!(svg.contains("split:me 42 ("), "the name drawn as written");
    assert!(!svg.contains('\u{a0}'), "no stand-in characters drawn");
}

/// A frame without a file reads as its name alone, so a name that ends in a number ends the
/// line: it must not read as a count (plain) or as the base count (differential).
#[test]
fn a_name_ending_in_a_number_is_not_read_as_a_count() {
    use poolsight::recorder::{Frame, FrameKind, MemKind, MemRecord};
    let path = trace_path("folded-number");
    record_on_pool(&path, |h, _| {
        let step = h.intern_frame(&Frame {
            kind: FrameKind::Scope,
            phase: Phase::None,
            file: String::new(),
            line: 0,
            name: "step 3".into(),
        });
        let stack = h.intern_stack(0, step);
        h.record_mem(MemRecord {
            kind: MemKind::MallocPost,
            device: 0,
            stream: 0,
            ptr: 4096,
            bytes: 1024,
            stack,
            pmem: 1,
        });
    });
    let p = profile(&path);
    let lines = folded(&p, Metric::Used);
    assert!(
        lines.iter().any(|l| l.starts_with("step\u{a0}3")),
        "{lines:?}"
    );
    let svg = text(flamegraph_svg(&p, Metric::Used, "t").expect("renders"));
    // inferno read one count per line and kept the whole name (a misread takes "3" for a
    // base count and names the frame "step").
    assert!(
        svg.contains("all (1,024 bytes, 100%)"),
        "one count per line"
    );
    assert!(
        svg.contains("<title>step\u{a0}3 (1,024 bytes"),
        "the whole name"
    );
    let diff = diff_folded(&lines, &lines).expect("diff");
    assert!(diff.iter().all(|l| l.ends_with(" 1024 1024")), "{diff:?}");
}

#[test]
fn empty_traces_give_errors_not_pictures() {
    let path = trace_path("empty");
    record_on_pool(&path, |_, _| {});
    let p = profile(&path);
    for metric in Metric::ALL {
        assert!(folded(&p, metric).is_empty());
        match flamegraph_svg(&p, metric, "t") {
            Err(FlameError::Empty { metric: m }) => assert_eq!(m, metric),
            other => panic!("{metric}: expected Empty, got {other:?}"),
        }
    }
    let err = timeline_svg(&p).expect_err("nothing to plot");
    assert_eq!(err, TimelineError::NoMemoryEvents);
    assert!(err.to_string().contains("no memory events"));

    // Scopes without memory: a time flamegraph, but no byte one.
    let path = trace_path("scopes-only");
    record_on_pool(&path, |h, _| {
        let _f = h.function("Idle", Phase::Forward);
        std::thread::sleep(Duration::from_millis(1));
    });
    let p = profile(&path);
    assert!(flamegraph_svg(&p, Metric::Time, "t").is_ok());
    let err = flamegraph_svg(&p, Metric::Used, "t").expect_err("no mallocs");
    assert!(err.to_string().contains("no pool mallocs"), "{err}");
}

#[test]
fn metrics_parse_from_their_cli_names() {
    for m in Metric::ALL {
        assert_eq!(m.to_string().parse::<Metric>(), Ok(m));
    }
    let err = "bytes".parse::<Metric>().expect_err("unknown");
    assert!(err.to_string().contains("used, acquired, peak or time"));
}

#[test]
fn differential_flamegraph_compares_the_same_stacks() {
    let base_path = trace_path("diff-base");
    let new_path = trace_path("diff-new");
    // One function, so both traces have the same call-site lines.
    fn run(h: &Handle, pool: &MemoryPool, sizes: &[u64]) {
        for &size in sizes {
            let _f = h.function("Linear", Phase::Forward);
            drop(pool.malloc(size).expect("malloc"));
        }
    }
    record_on_pool(&base_path, |h, pool| run(h, pool, &[1024]));
    record_on_pool(&new_path, |h, pool| run(h, pool, &[1024, 2048]));
    let (base, new) = (profile(&base_path), profile(&new_path));

    let lines =
        diff_folded(&folded(&base, Metric::Used), &folded(&new, Metric::Used)).expect("diff");
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].starts_with("Linear ("), "{lines:?}");
    assert!(lines[0].ends_with(") 1024 3072"), "{lines:?}");

    let once = differential_svg(&base, &new, Metric::Used, "diff").expect("svg");
    let again = differential_svg(&base, &new, Metric::Used, "diff").expect("svg");
    assert!(once == again);
    assert!(text(once).contains("Linear"));

    let empty = trace_path("diff-empty");
    record_on_pool(&empty, |_, _| {});
    assert!(matches!(
        differential_svg(&base, &profile(&empty), Metric::Used, "diff"),
        Err(FlameError::Empty { .. })
    ));
}

#[test]
fn timeline_shades_each_epoch_and_marks_the_peak() {
    // A path with markup characters: it is printed in the title and must be escaped.
    let path = trace_path("timeline-<b>&");
    record_on_pool(&path, |h, pool| {
        let mut kept = Vec::new();
        for epoch in 1..=3 {
            h.epoch_begin(epoch);
            let scope = h.scope("train");
            drop(pool.malloc(u64::from(epoch) << 20).expect("malloc"));
            kept.push(pool.malloc(256 << 10).expect("malloc"));
            std::thread::sleep(Duration::from_millis(2));
            drop(scope);
            h.epoch_end(epoch);
        }
    });
    let p = profile(&path);
    let svg = text(timeline_svg(&p).expect("svg"));
    assert!(svg.starts_with("<?xml") && svg.trim_end().ends_with("</svg>"));
    assert_eq!(svg.matches(r#"<g class="epoch">"#).count(), 3);
    for n in 1..=3 {
        assert!(svg.contains(&format!(">epoch {n}</text>")));
    }
    let peak = p.sources[0].pool.peak_used_bytes;
    assert_eq!(
        peak,
        (3 << 20) + 2 * (256 << 10),
        "epoch 3's block over the kept ones"
    );
    assert_eq!(svg.matches(r#"<g class="peak">"#).count(), 1);
    assert!(svg.contains(&format!("peak {}", humanized(peak))));
    assert!(svg.contains("peak 3.50MB at "), "{}", humanized(peak));
    assert!(svg.contains("used bytes") && svg.contains("acquired bytes"));
    assert!(
        svg.contains(">2MB</text>") && svg.contains(">0</text>"),
        "byte ticks"
    );
    assert!(svg.contains("ms</text>"), "time ticks");
    assert!(svg.contains("timeline-&lt;b&gt;&amp;"), "path escaped");
    assert!(!svg.contains("<b>"));
    assert_eq!(svg.matches("<g").count(), svg.matches("</g>").count());
    assert!(timeline_svg(&p).expect("svg") == svg.into_bytes());
}

#[test]
fn timeline_draws_one_panel_per_rank() {
    let (a, b) = (trace_path("timeline-rank-a"), trace_path("timeline-rank-b"));
    let idle = trace_path("timeline-rank-idle");
    record_on_pool(&a, mlp_step);
    record_on_pool(&b, |h, pool| {
        mlp_step(h, pool);
        mlp_step(h, pool);
    });
    record_on_pool(&idle, |_, _| {});
    let merged = Profile::merge(vec![profile(&a), profile(&b), profile(&idle)]);
    let svg = text(timeline_svg(&merged).expect("svg"));
    assert_eq!(svg.matches(r#"<g class="peak">"#).count(), 2);
    assert_eq!(svg.matches("no memory events in this trace").count(), 1);
    let a = a.display().to_string();
    let b = b.display().to_string();
    assert!(svg.contains(&format!(">{a}</text>")) && svg.contains(&format!(">{b}</text>")));
}
