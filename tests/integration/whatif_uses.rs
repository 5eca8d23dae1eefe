//! The model of `whatif` where other commands use it: `diff --whatif` (two settings of one run,
//! two runs under one setting, rules on the figures), `oom`'s advice from the model, and
//! `whatif --allocator cupy` (CuPy's pool, the policy poolsight's own pool runs).

use crate::support::{cli, Outcome};

const MIB: u64 = 1 << 20;
const OOM: &str = "fixtures/pytorch/whatif_oom.pickle";
const SETTINGS: &str = "fixtures/pytorch/whatif_settings.pickle";

fn usage_error(o: &Outcome) {
    assert_eq!(o.code, 2, "stdout: {}\nstderr: {}", o.stdout, o.stderr);
    assert_eq!(o.stderr.trim().lines().count(), 1, "{}", o.stderr);
    assert!(!o.stderr.contains("panicked"), "{}", o.stderr);
}

/// `diff --format json`'s row `key` as (base, new).
fn row(j: &serde_json::Value, key: &str) -> (Option<u64>, Option<u64>) {
    let r = j["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["key"] == key)
        .unwrap_or_else(|| panic!("no row {key}: {j}"));
    (r["base"].as_u64(), r["new"].as_u64())
}

/// `whatif --format json`'s run under `setting` (over the recorded settings) of `file`.
fn whatif_run(file: &str, setting: &str) -> serde_json::Value {
    let j = cli(&[
        "whatif",
        file,
        "--setting",
        setting,
        "--min-capacity",
        "--format",
        "json",
    ])
    .json();
    let runs = j["runs"].as_array().unwrap();
    runs.last().unwrap().clone()
}

#[test]
fn diff_compares_two_settings_of_one_run_and_gates_on_them() {
    let base = [
        "diff",
        OOM,
        OOM,
        "--new-setting",
        "expandable_segments:True",
        "--all",
        "--format",
        "json",
    ];
    let o = cli(&base);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let j = o.json();
    // As recorded the run fails once and needs 80 MiB; with expandable segments it fits in 60.
    assert_eq!(row(&j, "whatif:0.failures"), (Some(1), Some(0)));
    assert_eq!(
        row(&j, "whatif:0.min_capacity"),
        (Some(80 * MIB), Some(60 * MIB))
    );
    let exp = whatif_run(OOM, "expandable_segments:True");
    assert_eq!(
        row(&j, "whatif:0.reserved_peak").1,
        exp["reserved_peak_bytes"].as_u64()
    );
    assert_eq!(
        row(&j, "whatif:0.allocated_peak").1,
        exp["allocated_peak_bytes"].as_u64()
    );
    // A rule on a figure that grew fails the diff; one on a figure that did not passes.
    let mut grew = base.to_vec();
    grew.extend(["--fail-on", "whatif:*.allocated_peak>0"]);
    let o = cli(&grew);
    assert_eq!(o.code, 1, "{}", o.stdout);
    assert_eq!(o.json()["violations"][0]["key"], "whatif:0.allocated_peak");
    let mut same = base.to_vec();
    same.extend(["--fail-on", "whatif:0.reserved_peak>0"]);
    assert_eq!(cli(&same).code, 0);
    // The other way round, the recorded settings fail where expandable segments fit.
    let o = cli(&[
        "diff",
        OOM,
        OOM,
        "--base-setting",
        "expandable_segments:True",
        "--fail-on",
        "whatif:*.failures>0",
    ]);
    assert_eq!(o.code, 1, "{}", o.stdout);
    assert!(
        o.stdout
            .contains("base under expandable_segments:True over its recorded settings, new under its recorded settings"),
        "{}",
        o.stdout
    );
    assert!(o.stdout.contains("whatif:0.failures"), "{}", o.stdout);
}

#[test]
fn diff_compares_two_runs_under_one_setting() {
    // The same requests recorded under two settings, both replayed under a split limit of
    // 20 MiB over their own: each side's figures are what whatif gives for it.
    let j = cli(&[
        "diff",
        OOM,
        SETTINGS,
        "--setting",
        "max_split_size_mb:20",
        "--all",
        "--format",
        "json",
    ])
    .json();
    for (side, file) in [(0, OOM), (1, SETTINGS)] {
        let w = whatif_run(file, "max_split_size_mb:20");
        let r = row(&j, "whatif:0.min_capacity");
        let v = if side == 0 { r.0 } else { r.1 };
        assert_eq!(v, w["min_capacity_bytes"].as_u64(), "{file}");
        let r = row(&j, "whatif:0.fragmentation");
        let v = if side == 0 { r.0 } else { r.1 };
        assert_eq!(v, w["fragmentation_bytes"].as_u64(), "{file}");
    }
    // Without --whatif there is no such section.
    let j = cli(&["diff", OOM, SETTINGS, "--all", "--format", "json"]).json();
    assert!(!j.to_string().contains("whatif:"), "{j}");
    // --capacity decides what fails: everything fits in 1 GiB.
    let j = cli(&[
        "diff",
        OOM,
        SETTINGS,
        "--capacity",
        "1GiB",
        "--all",
        "--format",
        "json",
    ])
    .json();
    assert_eq!(row(&j, "whatif:0.failures"), (Some(0), Some(0)));
}

#[test]
fn diff_whatif_wrong_arguments_are_one_line_and_exit_2() {
    usage_error(&cli(&["diff", OOM, OOM, "--setting", "bogus:1"]));
    usage_error(&cli(&[
        "diff",
        OOM,
        OOM,
        "--setting",
        "expandable_segments:True",
        "--base-setting",
        "max_split_size_mb:20",
    ]));
    usage_error(&cli(&["diff", OOM, OOM, "--capacity", "12XB"]));
    for rule in ["whatif:0.bogus>0", "whatif:0.failures>1MB"] {
        usage_error(&cli(&["diff", OOM, OOM, "--whatif", "--fail-on", rule]));
    }
}

#[test]
fn oom_advice_says_what_the_model_found() {
    let j = cli(&["oom", OOM, "--format", "json"]).json();
    let o = &j["ooms"][0];
    let w = &o["whatif"];
    assert_eq!(w["capacity_bytes"], 70 * MIB);
    let runs = w["runs"].as_array().unwrap();
    let labels: Vec<&str> = runs.iter().map(|r| r["label"].as_str().unwrap()).collect();
    assert_eq!(
        labels,
        [
            "default",
            "expandable_segments:True",
            "max_split_size_mb:20"
        ]
    );
    // The same figures as whatif's for the same settings and capacity.
    for r in runs {
        let label = r["label"].as_str().unwrap();
        let setting = if label == "default" {
            "max_non_split_rounding_mb:20"
        } else {
            label
        };
        let wr = whatif_run(OOM, setting);
        assert_eq!(
            r["reserved_peak_bytes"], wr["reserved_peak_bytes"],
            "{label}"
        );
        assert_eq!(r["fits"], wr["fits"], "{label}");
        assert_eq!(r["min_capacity_bytes"], wr["min_capacity_bytes"], "{label}");
    }
    let advice = o["advice"].to_string();
    assert!(
        advice.contains("with expandable_segments:True this run peaks at 60.00MB reserved and fits in the 70.00MB (it needs 60.00MB)"),
        "{advice}"
    );
    assert!(
        advice.contains("runs out of memory in the 70.00MB it had too; the run needs 80.00MB"),
        "{advice}"
    );
    // `report` ends with the same advice, under the settings the snapshot recorded.
    let r = cli(&["report", SETTINGS]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stdout.contains("with its settings (max_split_size_mb:64,max_non_split_rounding_mb:32,roundup_power2_divisions:4)"),
        "{}",
        r.stdout
    );
    // A snapshot converted once is still PyTorch's allocator's recording (its settings are
    // not in the trace: PyTorch's defaults, which are this snapshot's).
    let dir = crate::support::scratch::dir();
    let converted = dir.join("oom.pstrace");
    let c = converted.to_str().unwrap();
    assert_eq!(cli(&["import", OOM, "-o", c]).code, 0);
    let j2 = cli(&["oom", c, "--format", "json"]).json();
    assert_eq!(j2["ooms"][0]["whatif"], *w);
    let check = cli(&["whatif", "--check", "--format", "json", c]).json();
    assert_eq!(check["checks"][0]["recorded_by"], "pytorch");
    assert_eq!(check["checks"][0]["exact"], true);
    // A poolsight trace's out-of-memory was not PyTorch's allocator's: no model there.
    let j = cli(&[
        "oom",
        "fixtures/traces/seed_fidelity.pstrace",
        "--format",
        "json",
    ])
    .json();
    assert!(j["ooms"][0]["requested_bytes"].as_u64().is_some(), "{j}");
    assert!(j["ooms"][0].get("whatif").is_none(), "{j}");
}

#[test]
fn cupy_replays_runs_recorded_by_poolsights_pool_as_they_were() {
    // poolsight's pool runs CuPy's policy: the model reproduces what it held.
    for t in [
        "fixtures/traces/chainer_nested.pstrace",
        "fixtures/traces/fastai_epochs.pstrace",
        "fixtures/traces/seed_fidelity.pstrace",
    ] {
        let j = cli(&["whatif", "--allocator", "cupy", "--format", "json", t]).json();
        assert_eq!(j["allocator"], "cupy", "{t}");
        let runs = j["runs"].as_array().unwrap();
        assert_eq!(runs.len(), 1, "{t}");
        assert_eq!(runs[0]["label"], "cupy");
        assert_eq!(
            runs[0]["reserved_peak_bytes"], j["recorded_reserved_peak_bytes"],
            "{t}"
        );
    }
    // CuPy asks the device for each request itself: seven 7 MiB requests (the last the one
    // that failed, freed at once) fit in 49 MiB (PyTorch's allocator needs 80).
    let j = cli(&[
        "whatif",
        OOM,
        "--allocator",
        "cupy",
        "--min-capacity",
        "--format",
        "json",
    ])
    .json();
    let r = &j["runs"][0];
    assert_eq!(r["fits"], true, "{j}");
    assert_eq!(r["reserved_peak_bytes"], 49 * MIB);
    assert_eq!(r["min_capacity_bytes"], 49 * MIB);
    let t = cli(&["whatif", OOM, "--allocator", "cupy"]);
    assert_eq!(t.code, 0);
    assert!(
        t.stdout.lines().nth(2).unwrap().starts_with("cupy "),
        "{}",
        t.stdout
    );
    usage_error(&cli(&[
        "whatif",
        OOM,
        "--allocator",
        "cupy",
        "--setting",
        "expandable_segments:True",
    ]));
    usage_error(&cli(&["whatif", OOM, "--allocator", "cupy", "--check"]));
    usage_error(&cli(&["whatif", OOM, "--allocator", "tensorflow"]));
}

#[test]
fn the_importer_and_the_analyzer_name_held_segments_alike() {
    assert_eq!(
        poolsight::analyzer::whatif::devices::HELD_BEFORE,
        poolsight::import::events::HELD_BEFORE
    );
}
