//! Golden files: each report, in every format, of the committed fixture traces
//! (`fixtures/traces/`), compared byte for byte with `fixtures/expected/`. A fresh recording
//! of each scenario must give the same memory reports as its committed trace, so the
//! recorder and the analyzer are checked end to end.
//!
//! After an intended change of output: `POOLSIGHT_BLESS=1 cargo test --test integration golden::` records
//! the scenarios again and rewrites the expected files; review them as a diff.
//! `POOLSIGHT_BLESS=outputs` rewrites the expected files from the committed traces as they
//! are (a change of the analysis only: the diff then holds nothing but the change).

use crate::scenarios;

use crate::support::scratch;

use poolsight::analyzer::tables;

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn blessing() -> bool {
    std::env::var_os("POOLSIGHT_BLESS").is_some_and(|v| v != "0")
}

/// Compares `got` with the golden file at `path` (rewrites it when blessing), adding a
/// mismatch report to `mismatches`.
fn compare_golden(path: &std::path::Path, got: &str, mismatches: &mut Vec<String>) {
    if blessing() {
        std::fs::write(path, got).expect("write expected");
        return;
    }
    let want = std::fs::read_to_string(path).unwrap_or_default();
    if got != want {
        mismatches.push(format!(
            "{}:\n--- expected\n{want}\n--- got\n{got}",
            path.display()
        ));
    }
}

/// The trace arguments of a scenario, relative to the repository root.
fn traces(name: &str, dir: &str) -> Vec<String> {
    if name == "two_ranks" {
        (0..2)
            .map(|r| format!("{dir}/two_ranks-rank{r}.pstrace"))
            .collect()
    } else {
        vec![format!("{dir}/{name}.pstrace")]
    }
}

/// The tables of the list that are commands of their own.
fn table_commands() -> Vec<&'static str> {
    let commands = poolsight::cli::command_names();
    tables::names()
        .into_iter()
        .filter(|t| commands.iter().any(|c| c == t))
        .collect()
}

/// (expected file name, arguments before the traces): from the list of tables, each table
/// that is a command of its own in every format, the others as `report --format csv --table`
/// gives them; `report`; and the seeds' options.
fn cases(name: &str) -> Vec<(String, Vec<&'static str>)> {
    let commands = table_commands();
    let mut c = Vec::new();
    for table in tables::names() {
        if commands.contains(&table) {
            for (fmt, ext) in [("table", "txt"), ("json", "json"), ("csv", "csv")] {
                c.push((format!("{table}.{ext}"), vec![table, "--format", fmt]));
            }
        } else {
            // A CSV file holds one table: report's headline is one of them.
            c.push((
                format!("report-{table}.csv"),
                vec!["report", "--format", "csv", "--table", table],
            ));
        }
    }
    for (fmt, ext) in [("table", "txt"), ("json", "json")] {
        c.push((format!("report.{ext}"), vec!["report", "--format", fmt]));
    }
    c.push(("functions-self.txt".into(), vec!["functions", "--self"]));
    c.push((
        "functions-auto_foreach.txt".into(),
        vec!["functions", "--unit", "auto_foreach"],
    ));
    c.push((
        "lines-max-depth-2.txt".into(),
        vec!["lines", "--max-depth", "2"],
    ));
    if name == "two_ranks" {
        c.push(("report-per-rank.txt".into(), vec!["report", "--per-rank"]));
        c.push((
            "epochs-per-rank.json".into(),
            vec!["epochs", "--per-rank", "--format", "json"],
        ));
    }
    c
}

fn poolsight(args: &[&str], traces: &[String]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_poolsight"))
        .current_dir(root())
        .args(args)
        .args(traces)
        .output()
        .expect("run poolsight");
    assert!(
        out.status.success(),
        "poolsight {args:?} {traces:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

fn expected_dir(name: &str) -> PathBuf {
    root().join("fixtures/expected").join(name)
}

#[test]
fn reports_of_the_committed_traces_match_the_golden_files() {
    if blessing() && std::env::var_os("POOLSIGHT_BLESS").is_some_and(|v| v != "outputs") {
        let dir = root().join("fixtures/traces");
        std::fs::create_dir_all(&dir).expect("mkdir");
        for name in scenarios::NAMES {
            scenarios::record(name, &dir);
        }
        // The packed fixture is the packed form of the trace just recorded.
        std::fs::create_dir_all(dir.join("packed")).expect("mkdir");
        poolsight(
            &[
                "pack",
                "fixtures/traces/chainer_nested.pstrace",
                "-o",
                "fixtures/traces/packed/chainer_nested.pstrace",
            ],
            &[],
        );
    }
    let mut mismatches = Vec::new();
    for name in scenarios::NAMES {
        let traces = traces(name, "fixtures/traces");
        std::fs::create_dir_all(expected_dir(name)).expect("mkdir");
        for (file, args) in cases(name) {
            let got = poolsight(&args, &traces);
            compare_golden(&expected_dir(name).join(&file), &got, &mut mismatches);
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} golden file(s) differ (POOLSIGHT_BLESS=1 rewrites them after an intended change):\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
}

/// The seeds' own examples, spelled out rather than only blessed.
#[test]
fn the_seed_examples_hold() {
    if blessing() {
        return;
    }
    let read = |name: &str, file: &str| {
        std::fs::read_to_string(expected_dir(name).join(file)).expect("golden file")
    };
    assert!(read("cupy_line_profile", "lines.txt").starts_with("_root (3.00KB, 2.00KB)\n"));
    let functions: serde_json::Value =
        serde_json::from_str(&read("chainer_nested", "functions.json")).expect("json");
    let row = |n: &str| {
        functions["functions"]
            .as_array()
            .and_then(|rows| rows.iter().find(|r| r["name"] == n))
            .cloned()
            .unwrap_or_default()
    };
    let mb = 1u64 << 20;
    // Outer (twice): its own 1 MB, Inner's 3 MB and the nested Outer's 512 B, plus the nested
    // Outer call's 512 B again (Chainer's double count).
    assert_eq!(row("Outer")["used_bytes"], 2 * (4 * mb + 512 + 512));
    assert_eq!(row("Outer")["occurrence"], 4);
    assert_eq!(row("Outer")["self_used_bytes"], 2 * (mb + 512));
    assert_eq!(row("Inner")["used_bytes"], 2 * 3 * mb);
    let epochs: serde_json::Value =
        serde_json::from_str(&read("fastai_epochs", "epochs.json")).expect("json");
    let e = &epochs["epochs"];
    assert_eq!(
        (e[0]["gpu_used_mb"].as_i64(), e[0]["gpu_peak_mb"].as_i64()),
        (Some(80), Some(220))
    );
    assert_eq!(
        (e[1]["gpu_used_mb"].as_i64(), e[1]["gpu_peak_mb"].as_i64()),
        (Some(-50), Some(60))
    );
    seed_fidelity_holds(&read);
}

/// The `seed_fidelity` scenario (tests/scenarios), by the upstream rules its doc cites.
fn seed_fidelity_holds(read: &dyn Fn(&str, &str) -> String) {
    let mb = 1u64 << 20;
    // chainer/function_hooks/cupy_memory_profile.py: malloc_preprocess / alloc_preprocess
    // count the failed 4 MB request once as used and its three device tries as acquired.
    let functions: serde_json::Value =
        serde_json::from_str(&read("seed_fidelity", "functions.json")).expect("json");
    let step = &functions["functions"][0];
    assert_eq!(step["name"], "Step");
    assert_eq!(step["used_bytes"], 5 * mb);
    assert_eq!(step["acquired_bytes"], 13 * mb);
    assert_eq!(step["failed_used_bytes"], 4 * mb);
    assert_eq!(step["failed_acquired_bytes"], 12 * mb);
    let table = read("seed_fidelity", "functions.txt");
    assert!(
        table.contains("   Step     5.00MB        13.00MB           1"),
        "{table}"
    );
    assert!(
        table.contains("  Empty     0.00MB         0.00MB           1"),
        "{table}"
    );
    // cupy/cuda/memory_hooks/line_profile.py: the failing line is in the tree, and the 0-byte
    // malloc's line shows `(0.00B, 0.00B)`.
    let lines = read("seed_fidelity", "lines.txt");
    assert!(lines.starts_with("_root (5.00MB, 13.00MB)\n"), "{lines}");
    assert!(lines.contains("Step (5.00MB, 13.00MB)"), "{lines}");
    assert!(lines.contains("Empty (0.00B, 0.00B)"), "{lines}");
    assert!(lines.contains("(4.00MB, 12.00MB)"), "{lines}");
    assert!(lines.contains("(0.00B, 0.00B)\n"), "{lines}");
    // chainer/function_hooks/timer.py print_report: 'auto' is one unit for the table.
    let timers = read("seed_fidelity", "timers.txt");
    let function_rows: Vec<&str> = timers
        .lines()
        .skip_while(|l| !l.contains("FunctionName"))
        .skip(1)
        .collect();
    assert_eq!(function_rows.len(), 5, "{timers}");
    assert!(function_rows.iter().all(|l| l.contains("sec ")), "{timers}");
    // fastai: held bytes, whole MB per reading; the cache emptied at both ends. Held: begin 0,
    // max 1 MB (the failed tries hold nothing), end 0: used 0, peak 1.
    let epochs = read("seed_fidelity", "epochs.txt");
    assert_eq!(
        epochs,
        "epoch     cpu used  peak      gpu used  peak    \n\
         1         0         0         0         1         \n"
    );
}

/// Recording each scenario again gives the same memory reports as its committed trace.
#[test]
fn fresh_recordings_give_the_committed_memory_reports() {
    if blessing() {
        return;
    }
    let dir = scratch::dir();
    let dir_arg = dir.display().to_string();
    for name in scenarios::NAMES {
        scenarios::record(name, &dir);
        let fresh = traces(name, &dir_arg);
        for (file, args) in [
            ("functions.json", vec!["functions", "--format", "json"]),
            ("lines.txt", vec!["lines"]),
            ("epochs.txt", vec!["epochs"]),
        ] {
            let want = std::fs::read_to_string(expected_dir(name).join(file)).expect("golden");
            assert_eq!(poolsight(&args, &fresh), want, "{name} {file}");
        }
    }
}

/// The same trace gives the same bytes whatever the parallelism: replay merges per-chunk
/// results by sums and minima, never in the order workers finish. A trace of many small
/// chunks from four threads makes rayon split the work differently at 1 and 4 threads.
#[test]
fn output_does_not_depend_on_the_number_of_threads() {
    use poolsight::pool::device::HostDevice;
    use poolsight::pool::{MemoryPool, TraceHook};
    use poolsight::recorder::{Phase, Recorder, RecorderConfig};
    use std::sync::Arc;

    let path = scratch::file("threads.pstrace");
    let rec = Recorder::create(
        &path,
        RecorderConfig {
            chunk_size: 4096,
            ..RecorderConfig::default()
        },
    )
    .expect("create");
    let h = rec.handle();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let h = h.clone();
            s.spawn(move || {
                let pool = MemoryPool::new(Arc::new(HostDevice::new(0, 1 << 30)));
                let _hook = TraceHook::for_pool(h.clone(), &pool).install();
                for i in 0..3000u64 {
                    let _f = h.function(if i % 3 == 0 { "A" } else { "B" }, Phase::Forward);
                    let _l = h.link("L");
                    drop(pool.malloc(512 * (1 + (i + t) % 7)).expect("malloc"));
                }
            });
        }
    });
    drop(h);
    rec.finish().expect("finish");
    let run = |threads: &str, args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_poolsight"))
            .env("RAYON_NUM_THREADS", threads)
            .args(args)
            .arg(&path)
            .output()
            .expect("run");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    for args in [
        &["report", "--format", "json"][..],
        &[
            "export", "--format", "folded", "-o", "-", "--metric", "time",
        ][..],
        &["export", "--format", "chrome", "-o", "-"][..],
    ] {
        let one = run("1", args);
        assert!(!one.is_empty());
        assert_eq!(
            one,
            run("4", args),
            "{args:?} differs between 1 and 4 threads"
        );
    }
}

/// Traces of every released format version stay readable and keep giving the same reports:
/// `fixtures/traces/v<version>/` holds traces written by that version's recorder (never
/// re-recorded), `fixtures/expected/v<version>/` their reports (rewritten by
/// `POOLSIGHT_BLESS=1` only if the analysis itself changes, never the traces).
#[test]
fn older_format_versions_stay_readable() {
    let mut mismatches = Vec::new();
    for version in ["1.0", "1.2"] {
        let dir = format!("fixtures/traces/v{version}");
        for name in [
            "chainer_nested",
            "cupy_line_profile",
            "fastai_epochs",
            "two_ranks",
        ] {
            let traces = traces(name, &dir);
            for t in &traces {
                let info: serde_json::Value = serde_json::from_str(&poolsight(
                    &["info", "--format", "json"],
                    std::slice::from_ref(t),
                ))
                .expect("info json");
                assert_eq!(info["format_version"], version, "{t}");
                assert_eq!(info["finished"], true, "{t}");
                assert_eq!(info["warnings"], serde_json::json!([]), "{t}");
            }
            let expected = root()
                .join("fixtures/expected")
                .join(format!("v{version}"))
                .join(name);
            std::fs::create_dir_all(&expected).expect("mkdir");
            for cmd in ["functions", "lines", "epochs"] {
                let got = poolsight(&[cmd, "--format", "json"], &traces);
                compare_golden(&expected.join(format!("{cmd}.json")), &got, &mut mismatches);
            }
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}

/// A packed trace says what its live trace says: every golden case, and the demo's report, give
/// the same bytes from the packed copies (packed into a folder of their own, under the same
/// names, so that the paths in the reports are the same too).
#[test]
fn packed_traces_give_the_same_outputs() {
    let dir = scratch::dir();
    let (live, packed) = (dir.join("live"), dir.join("packed"));
    for d in [&live, &packed] {
        std::fs::create_dir_all(d).expect("mkdir");
    }
    let run = |cwd: &Path, args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_poolsight"))
            .current_dir(cwd)
            .args(args)
            .output()
            .expect("run poolsight");
        assert!(
            out.status.success(),
            "poolsight {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("utf-8 output")
    };
    run(
        &live,
        &[
            "demo",
            "--out",
            "demo.pstrace",
            "--epochs",
            "2",
            "--steps-per-epoch",
            "60",
        ],
    );
    let mut names: Vec<String> = vec!["demo.pstrace".into()];
    for name in scenarios::NAMES {
        for t in traces(name, "") {
            let file = t.trim_start_matches('/').to_owned();
            std::fs::copy(root().join("fixtures/traces").join(&file), live.join(&file))
                .expect("copy fixture");
            names.push(file);
        }
    }
    for file in &names {
        let out = packed.join(file).display().to_string();
        run(&live, &["pack", file, "-o", &out]);
        assert!(
            std::fs::metadata(packed.join(file)).unwrap().len()
                < std::fs::metadata(live.join(file)).unwrap().len(),
            "{file}: packing did not make it smaller"
        );
    }
    let mut checked = 0;
    let mut cases_of: Vec<(Vec<String>, Vec<&str>)> = scenarios::NAMES
        .iter()
        .flat_map(|name| {
            let ts: Vec<String> = traces(name, "")
                .into_iter()
                .map(|t| t.trim_start_matches('/').to_owned())
                .collect();
            cases(name)
                .into_iter()
                .map(move |(_, args)| (ts.clone(), args))
        })
        .collect();
    for cmd in table_commands().into_iter().chain(["report"]) {
        cases_of.push((vec!["demo.pstrace".into()], vec![cmd, "--format", "json"]));
    }
    cases_of.push((vec!["demo.pstrace".into()], vec!["report"]));
    for (ts, args) in &cases_of {
        let all: Vec<&str> = args
            .iter()
            .copied()
            .chain(ts.iter().map(String::as_str))
            .collect();
        let (a, b) = (run(&live, &all), run(&packed, &all));
        assert!(a == b, "poolsight {all:?}: the packed trace gives another output:\n--- live\n{a}\n--- packed\n{b}");
        checked += 1;
    }
    assert!(checked > 50, "{checked} cases");
}

/// The committed packed fixture (format 1.2, `poolsight pack` of `chainer_nested`) gives the
/// golden outputs of its live trace; only the JSON report names the file it read.
#[test]
fn the_committed_packed_fixture_matches_the_golden_files() {
    let traces = vec!["fixtures/traces/packed/chainer_nested.pstrace".to_owned()];
    for (file, args) in cases("chainer_nested") {
        let got = poolsight(&args, &traces).replace("traces/packed/", "traces/");
        let want =
            std::fs::read_to_string(expected_dir("chainer_nested").join(&file)).unwrap_or_default();
        assert!(got == want, "{file}:\n--- expected\n{want}\n--- got\n{got}");
    }
}

#[test]
fn timers_links_or_functions_alone_hold_in_json_and_csv_too() {
    let trace = vec!["fixtures/traces/chainer_nested.pstrace".to_string()];
    let both: serde_json::Value =
        serde_json::from_str(&poolsight(&["timers", "--format", "json"], &trace)).unwrap();
    let links: serde_json::Value = serde_json::from_str(&poolsight(
        &["timers", "--links", "--format", "json"],
        &trace,
    ))
    .unwrap();
    let functions: serde_json::Value = serde_json::from_str(&poolsight(
        &["timers", "--functions", "--format", "json"],
        &trace,
    ))
    .unwrap();
    assert!(!both["links"].as_array().unwrap().is_empty());
    assert!(!both["functions"].as_array().unwrap().is_empty());
    let keys = |v: &serde_json::Value| {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    assert_eq!(keys(&links), ["links", "links_total_ns"]);
    assert_eq!(keys(&functions), ["functions", "functions_total_ns"]);
    assert_eq!(links["links"], both["links"]);
    assert_eq!(links["links_total_ns"], both["links_total_ns"]);
    assert_eq!(functions["functions"], both["functions"]);

    let csv = |args: &[&str]| -> Vec<String> {
        poolsight(args, &trace)
            .lines()
            .skip(1)
            .map(|l| l.split(',').next().unwrap().to_string())
            .collect()
    };
    let all = csv(&["timers", "--format", "csv"]);
    let only_links = csv(&["timers", "--links", "--format", "csv"]);
    let only_functions = csv(&["timers", "--functions", "--format", "csv"]);
    assert!(only_links.iter().all(|k| k == "link") && !only_links.is_empty());
    assert!(only_functions.iter().all(|k| k == "function") && !only_functions.is_empty());
    assert_eq!(only_links.len() + only_functions.len(), all.len());
}
