//! `poolsight diff` end to end, as a CI job runs it: record the demo on the base branch and on
//! the change, then let the exit status gate the build (the README's recipe). Identical runs
//! pass, a bigger layer fails with the rows that grew, renamed functions show as added and
//! removed, and bad rules are refused with exit 2.

use crate::support::{cli, record_on_pool, scratch, Outcome};

use std::path::Path;
use std::sync::OnceLock;

use poolsight::pool::MemoryPool;
use poolsight::recorder::{Handle, Phase};
use serde_json::Value;

/// This process's scratch directory, removed when the tests end.
fn dir() -> &'static Path {
    scratch::process_dir()
}

fn poolsight(args: &[&str]) -> Outcome {
    cli(args)
}

/// The demo, small enough for a debug build: `hidden` is the size the "change" alters.
fn record_demo(name: &str, hidden: usize) -> String {
    let out = dir().join(format!("{name}.pstrace")).display().to_string();
    let hidden = hidden.to_string();
    let run = poolsight(&[
        "demo",
        "--out",
        &out,
        "--epochs",
        "2",
        "--hidden",
        &hidden,
        "--steps-per-epoch",
        "20",
        "--eval-batches",
        "2",
    ]);
    assert_eq!(run.code, 0, "demo runs: {}", run.stderr);
    out
}

/// Two runs of the base branch and two of a change that widens the hidden layer, recorded
/// once for every test of this file.
struct Runs {
    base: [String; 2],
    bigger: [String; 2],
}

fn runs() -> &'static Runs {
    static RUNS: OnceLock<Runs> = OnceLock::new();
    RUNS.get_or_init(|| Runs {
        base: [record_demo("base-1", 32), record_demo("base-2", 32)],
        bigger: [record_demo("bigger-1", 64), record_demo("bigger-2", 64)],
    })
}

/// Records `body` with a TraceHook on a fresh host pool.
fn record(name: &str, body: impl FnOnce(&Handle, &MemoryPool)) -> String {
    let path = dir().join(format!("{name}.pstrace"));
    record_on_pool(&path, body);
    path.display().to_string()
}

fn rows_with_key<'a>(json: &'a Value, key: &str) -> Vec<&'a Value> {
    json["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .filter(|r| r["key"] == key)
        .collect()
}

const MEMORY_RULES: [&str; 8] = [
    "--fail-on",
    "peak_used>+0%",
    "--fail-on",
    "acquired>0",
    "--fail-on",
    "function:*.used>+0%",
    "--fail-on",
    "line:*.used>0",
];

#[test]
fn identical_runs_exit_0_with_no_violations() {
    let r = runs();
    // The same file on both sides: every figure, time included, is equal.
    let same = poolsight(&[
        "diff",
        &r.base[0],
        &r.base[0],
        "--fail-on",
        "time>+0%",
        "--fail-on",
        "link:*.time>0",
        "--format",
        "json",
    ]);
    assert_eq!(same.code, 0, "{}", same.stderr);
    let json = same.json();
    assert_eq!(json["violations"], Value::Array(vec![]));
    let rows = json["rows"].as_array().expect("rows");
    assert!(rows
        .iter()
        .all(|r| r["section"] == "headline" && r["delta"] == 0));

    // Two recordings of the same run: memory is deterministic, so memory rules hold at 0%.
    let mut args = vec!["diff", &r.base[0], &r.base[1]];
    args.extend(MEMORY_RULES);
    let twice = poolsight(&args);
    assert_eq!(twice.code, 0, "{}{}", twice.stdout, twice.stderr);
    assert!(
        twice.stdout.ends_with("OK: no rule crossed (4 checked)\n"),
        "{}",
        twice.stdout
    );
}

#[test]
fn a_bigger_layer_exits_1_with_the_rows_that_grew() {
    let r = runs();
    let mut args = vec!["diff", &r.base[0], &r.bigger[0], "--format", "json"];
    args.extend(["--fail-on", "peak_used>+5%"]);
    args.extend(["--fail-on", "function:LinearFunction.used>+10%"]);
    args.extend(["--fail-on", "allocations>+5%"]);
    let o = poolsight(&args);
    assert_eq!(o.code, 1, "{}", o.stderr);
    let json = o.json();

    for row in json["rows"].as_array().expect("rows") {
        let keys: Vec<&str> = row
            .as_object()
            .expect("row")
            .keys()
            .map(String::as_str)
            .collect();
        // A `peak.line` row also names the stack behind its line; no other row has one.
        let mut want = vec!["base", "delta", "delta_pct", "key", "new", "section"];
        if row["key"]
            .as_str()
            .is_some_and(|k| k.starts_with("peak.line."))
        {
            want.push("stack");
        }
        assert_eq!(keys, want, "{row}");
    }
    let peak = rows_with_key(&json, "peak_used")[0];
    assert!(peak["new"].as_i64() > peak["base"].as_i64(), "{peak}");
    let linear = rows_with_key(&json, "function:LinearFunction.used");
    assert_eq!(linear.len(), 1, "{json:#}");
    assert_eq!(linear[0]["section"], "functions");
    assert!(
        linear[0]["delta_pct"].as_f64() > Some(10.0),
        "{}",
        linear[0]
    );

    let violated: Vec<(&str, &str)> = json["violations"]
        .as_array()
        .expect("violations")
        .iter()
        .map(|v| {
            let keys: Vec<&str> = v
                .as_object()
                .expect("violation")
                .keys()
                .map(String::as_str)
                .collect();
            assert_eq!(keys, ["key", "rule", "value"]);
            (
                v["rule"].as_str().expect("rule"),
                v["key"].as_str().expect("key"),
            )
        })
        .collect();
    assert_eq!(
        violated,
        [
            ("peak_used>+5%", "peak_used"),
            (
                "function:LinearFunction.used>+10%",
                "function:LinearFunction.used"
            ),
        ],
        "the layer's width changes its bytes, not how many allocations a step makes"
    );

    // The same in the table, verdict last, and the markdown for the pull request.
    let table = poolsight(&[
        "diff",
        &r.base[0],
        &r.bigger[0],
        "--fail-on",
        "peak_used>+5%",
    ]);
    assert_eq!(table.code, 1);
    assert!(
        table
            .stdout
            .contains("FAIL: 1 violation(s) of 1 rule(s):\n  peak_used>+5%  peak_used  +"),
        "{}",
        table.stdout
    );
    let md = poolsight(&[
        "diff",
        &r.base[0],
        &r.bigger[0],
        "--fail-on",
        "peak_used>+5%",
        "--format",
        "markdown",
    ]);
    assert_eq!(md.code, 1);
    assert!(md.stdout.contains("❌ **1 violation(s)**"), "{}", md.stdout);
    assert!(
        md.stdout.contains("| `peak_used>+5%` | `peak_used` | +"),
        "{}",
        md.stdout
    );
}

/// The README's recipe: several runs per side, rules from the team's file, markdown for the
/// pull request, and the exit status deciding the job.
#[test]
fn the_ci_recipe_gates_on_a_rules_file_over_several_runs() {
    let r = runs();
    let rules = dir().join("poolsight-rules.toml");
    std::fs::write(
        &rules,
        "# memory is deterministic: no growth allowed; time is noisy: medians, 50%\n\
         fail_on = [\"peak_used > +0%\", \"function:*.used > +0%\", \"time > +50%\"]\n",
    )
    .expect("rules file");
    let rules = rules.display().to_string();
    let gate = |new: &[String; 2]| {
        poolsight(&[
            "diff", "--base", &r.base[0], &r.base[1], "--new", &new[0], &new[1], "--rules", &rules,
            "--format", "markdown", "--top", "15",
        ])
    };
    let pass = gate(&r.base);
    assert_eq!(pass.code, 0, "{}{}", pass.stdout, pass.stderr);
    assert!(
        pass.stdout
            .contains("✅ **No rule crossed** (3 checked; base: 2 runs (medians)"),
        "{}",
        pass.stdout
    );
    let fail = gate(&r.bigger);
    assert_eq!(fail.code, 1, "{}{}", fail.stdout, fail.stderr);
    assert!(fail.stdout.contains("`peak_used > +0%`"), "{}", fail.stdout);
}

#[test]
fn renamed_functions_appear_as_added_and_removed() {
    let step = |name: &'static str| {
        move |h: &Handle, pool: &MemoryPool| {
            let _f = h.function(name, Phase::Forward);
            drop(pool.malloc(4096).expect("malloc"));
        }
    };
    let base = record("renamed-base", step("Conv"));
    let new = record("renamed-new", step("Conv2d"));
    let o = poolsight(&[
        "diff",
        &base,
        &new,
        "--format",
        "json",
        "--fail-on",
        "function:*.used>+10%",
    ]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    let json = o.json();
    let added = rows_with_key(&json, "function:Conv2d.used");
    assert_eq!(
        (added[0]["base"].clone(), added[0]["new"].clone()),
        (Value::Null, 4096.into())
    );
    assert_eq!(added[0]["delta_pct"], Value::Null);
    let removed = rows_with_key(&json, "function:Conv.used");
    assert_eq!(
        (removed[0]["base"].clone(), removed[0]["new"].clone()),
        (4096.into(), Value::Null)
    );
    assert_eq!(removed[0]["delta"], -4096);
    // Growth from nothing crosses a percentage rule; the removal does not.
    assert_eq!(json["violations"][0]["key"], "function:Conv2d.used");
    assert_eq!(json["violations"][0]["value"], Value::Null);
    assert_eq!(json["violations"].as_array().map(Vec::len), Some(1));
    let peak = rows_with_key(&json, "peak_used");
    assert_eq!(peak[0]["delta"], 0, "same bytes, another name");

    let table = poolsight(&["diff", &base, &new]);
    assert_eq!(table.code, 0);
    assert!(
        table.stdout.contains("function:Conv2d.used"),
        "{}",
        table.stdout
    );
    assert!(table
        .stdout
        .lines()
        .any(|l| l.starts_with("function:Conv2d.used") && l.ends_with("added")));
    assert!(table
        .stdout
        .lines()
        .any(|l| l.starts_with("function:Conv.used") && l.ends_with("removed")));
}

#[test]
fn bad_rules_and_bad_input_exit_2_with_a_clear_error() {
    let trace = record("bad-input", |_, pool| {
        drop(pool.malloc(512).expect("malloc"))
    });
    for (rule, says) in [
        ("peak_used+5%", "expected METRIC>VALUE"),
        ("peak_usd>+5%", "unknown metric `peak_usd`"),
        ("peak_used>+5 apples", "`+5 apples` is not a value"),
        (
            "time>64MB",
            "`time` is a duration, but `64MB` is a size in bytes",
        ),
        (
            "function:Linear.bytes>1%",
            "unknown figure `bytes` for function",
        ),
        ("peak_used<5%", "only `>` and `>=` are supported"),
    ] {
        let o = poolsight(&["diff", &trace, &trace, "--fail-on", rule]);
        assert_eq!(o.code, 2, "{rule}: {}", o.stdout);
        assert!(o.stdout.is_empty());
        assert!(
            o.stderr.contains(&format!("bad rule `{rule}`: {says}")),
            "{rule}: {}",
            o.stderr
        );
    }

    let rules = dir().join("bad-rules.toml");
    std::fs::write(&rules, "fail_on = [\"peak_used>+5%\", \"peak>1\"]\n").expect("write");
    let o = poolsight(&[
        "diff",
        &trace,
        &trace,
        "--rules",
        &rules.display().to_string(),
    ]);
    assert_eq!(o.code, 2);
    assert!(o.stderr.starts_with("poolsight: "), "{}", o.stderr);
    assert!(
        o.stderr.contains("rule 2 of `fail_on`: bad rule `peak>1`"),
        "{}",
        o.stderr
    );
    assert_eq!(o.stderr.lines().count(), 1, "{}", o.stderr);

    std::fs::write(&rules, "fail-on = [\"peak_used>+5%\"]\n").expect("write");
    let o = poolsight(&[
        "diff",
        &trace,
        &trace,
        "--rules",
        &rules.display().to_string(),
    ]);
    assert_eq!(o.code, 2, "a misspelt key must not quietly check nothing");

    let missing = dir().join("missing.pstrace").display().to_string();
    assert_eq!(poolsight(&["diff", &trace, &missing]).code, 2);
    assert_eq!(poolsight(&["diff", &trace]).code, 2);
    assert_eq!(poolsight(&["diff", "--base", &trace]).code, 2);

    // A rule that names nothing is a warning, not a silent pass.
    let o = poolsight(&["diff", &trace, &trace, "--fail-on", "function:Typo.used>1%"]);
    assert_eq!(o.code, 0);
    assert!(
        o.stdout
            .contains("warning: rule `function:Typo.used>1%` matched no figure"),
        "{}",
        o.stdout
    );
}

#[test]
fn unchanged_rows_show_with_all_and_the_flamegraph_is_written() {
    let r = runs();
    let svg = dir().join("diff.svg");
    let o = poolsight(&[
        "diff",
        &r.base[0],
        &r.bigger[0],
        "--all",
        "--format",
        "json",
        "--flamegraph",
        &svg.display().to_string(),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let json = o.json();
    let unchanged = json["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .filter(|r| r["delta"] == 0)
        .count();
    assert!(unchanged > 0, "--all shows unchanged rows");
    let text = std::fs::read_to_string(&svg).expect("svg written");
    assert!(
        text.contains("<svg") && text.contains("LinearFunction"),
        "{}",
        &text[..200.min(text.len())]
    );
}

/// The figure the issue asks for: two traces of about 10M events each, diffed. Run with
/// `cargo test --release --test integration diff:: -- --ignored --nocapture`.
#[test]
#[ignore]
fn diff_of_two_10m_event_traces() {
    let make = |name: &str, extra: u64| {
        record(name, |h, pool| {
            let names = ["LinearFunction", "ReLU", "SoftmaxCrossEntropy", "Accuracy"];
            // Per iteration: a malloc, a free and a function scope, about 3 events.
            for i in 0..3_400_000u64 {
                let _l = h.link("MLP");
                let _f = h.function(names[(i % 4) as usize], Phase::Forward);
                drop(pool.malloc(512 * (1 + i % 64) + extra).expect("malloc"));
            }
        })
    };
    let base = make("big-base", 0);
    let new = make("big-new", 4096);
    let info = poolsight(&["info", &base, "--format", "json"]);
    let events: u64 = info.json()["events"]
        .as_object()
        .expect("events")
        .values()
        .filter_map(Value::as_u64)
        .sum();
    let started = std::time::Instant::now();
    let o = poolsight(&["diff", &base, &new, "--fail-on", "peak_used>+5%"]);
    let secs = started.elapsed().as_secs_f64();
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    println!(
        "diff of two traces of {events} events each: {secs:.2} s\n{}",
        o.stdout
    );
}
