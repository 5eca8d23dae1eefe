//! `poolsight whatif`: the model of PyTorch's caching allocator over the hand-made snapshots of
//! fixtures/pytorch/make_whatif.py (each decision in them worked out from PyTorch's rules), the
//! worked example of docs/whatif.md run as written, the JSON keys of SPEC §5.2, and bad input.

use std::path::{Path, PathBuf};

use crate::support::{cli, scratch, Outcome};

const MIB: u64 = 1 << 20;

fn fixture(name: &str) -> String {
    Path::new("fixtures/pytorch")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

fn ok(o: &Outcome) {
    assert_eq!(o.code, 0, "stdout: {}\nstderr: {}", o.stdout, o.stderr);
}

fn usage_error(o: &Outcome) {
    assert_eq!(o.code, 2, "stdout: {}\nstderr: {}", o.stdout, o.stderr);
    assert_eq!(o.stderr.trim().lines().count(), 1, "{}", o.stderr);
    assert!(!o.stderr.contains("panicked"), "{}", o.stderr);
}

#[test]
fn check_agrees_with_the_hand_made_snapshots() {
    for (name, segments, blocks, initial) in [
        ("whatif_oom.pickle", 3, 6, 0),
        ("whatif_settings.pickle", 3, 6, 0),
        ("whatif_mixed.pickle", 5, 12, 0),
        // Its first six entries gone: the state it began in comes from its segments.
        ("whatif_midway.pickle", 3, 8, 2),
    ] {
        let j = cli(&["whatif", "--check", "--format", "json", &fixture(name)]).json();
        let c = &j["checks"][0];
        assert_eq!(c["device"], 0);
        assert_eq!(c["segments_recorded"], segments, "{name}: {c}");
        assert_eq!(c["segments_simulated"], segments, "{name}: {c}");
        assert_eq!(c["segments_matching"], segments, "{name}: {c}");
        assert_eq!(c["blocks_checked"], blocks, "{name}: {c}");
        assert_eq!(c["block_offsets_matching"], blocks, "{name}: {c}");
        assert_eq!(c["starts_empty"], initial == 0);
        assert_eq!(c["initial_segments"], initial);
        assert_eq!(c["exact"], true);
        assert_eq!(c["recorded_by"], "pytorch");
    }
    let own = cli(&[
        "whatif",
        "--check",
        "fixtures/traces/chainer_nested.pstrace",
    ]);
    ok(&own);
    assert!(own.stdout.contains("agreement is not expected here"));
    let t = cli(&["whatif", "--check", &fixture("whatif_mixed.pickle")]);
    ok(&t);
    assert!(t
        .stdout
        .contains("agrees with every recorded segment and block"));
    assert!(t.stdout.contains("12 of 12"));
}

#[test]
fn the_recorded_settings_are_the_first_row() {
    let o = cli(&["whatif", &fixture("whatif_settings.pickle")]);
    ok(&o);
    let row = o.stdout.lines().nth(2).unwrap();
    assert!(
        row.starts_with(
            "recorded (max_split_size_mb:64,max_non_split_rounding_mb:32,roundup_power2_divisions:4)"
        ),
        "{}",
        o.stdout
    );
    // An alternative keeps the recorded options it does not set.
    let j = cli(&[
        "whatif",
        &fixture("whatif_settings.pickle"),
        "--setting",
        "expandable_segments:True",
        "--format",
        "json",
    ])
    .json();
    let alt = &j["runs"][1]["settings"];
    assert_eq!(alt["expandable_segments"], "True");
    assert_eq!(alt["max_split_size_mb"], "64");
    let c = cli(&["whatif", "--check", &fixture("whatif_settings.pickle")]);
    assert!(
        c.stdout.contains("settings max_split_size_mb:64"),
        "{}",
        c.stdout
    );
}

#[test]
fn each_device_is_replayed_on_its_own() {
    let f = fixture("whatif_two_devices.pickle");
    let j = cli(&["whatif", "--check", "--format", "json", &f]).json();
    let checks = j["checks"].as_array().unwrap();
    assert_eq!(checks.len(), 2);
    for (c, (device, segments, blocks)) in checks.iter().zip([(0, 3, 6), (1, 5, 12)]) {
        assert_eq!(c["device"], device);
        assert_eq!(c["segments_matching"], segments, "{c}");
        assert_eq!(c["block_offsets_matching"], blocks, "{c}");
        assert_eq!(c["exact"], true, "{c}");
    }
    let j = cli(&["whatif", "--format", "json", &f]).json();
    let reports = j.as_array().unwrap();
    assert_eq!(reports.len(), 2);
    assert_eq!(reports[0]["device"], 0);
    assert_eq!(reports[0]["runs"][0]["fits"], false);
    assert_eq!(reports[1]["device"], 1);
    assert_eq!(reports[1]["recorded_reserved_peak_bytes"], 74 * MIB);
    assert!(reports[1]["trace"]
        .as_str()
        .unwrap()
        .ends_with("(device 1)"));
}

#[test]
fn check_says_where_the_model_and_a_recording_part() {
    // The old fixture places small blocks 1 MiB apart, which no caching allocator does.
    let j = cli(&[
        "whatif",
        "--check",
        "--format",
        "json",
        &fixture("snapshot_small.pickle"),
    ])
    .json();
    let c = &j["checks"][0];
    assert_eq!(c["exact"], false);
    assert!(c["block_offsets_matching"].as_u64() < c["blocks_checked"].as_u64());
    let m = c["first_mismatch"].as_str().unwrap();
    assert!(m.contains("recorded at offset 1048576"), "{m}");
}

/// The console block of docs/whatif.md that runs `command`: its command and output lines.
fn docs_example(command: &str) -> (String, String) {
    let page =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/whatif.md"))
            .unwrap();
    let start = page
        .find(&format!("$ {command}"))
        .unwrap_or_else(|| panic!("docs/whatif.md has no `$ {command}`"));
    let rest = &page[start..];
    let end = rest.find("```").unwrap();
    let block = &rest[..end];
    let (first, output) = block.split_once('\n').unwrap();
    (first[2..].to_string(), output.to_string())
}

#[test]
fn the_worked_example_runs_as_written() {
    let (command, expected) =
        docs_example("poolsight whatif fixtures/pytorch/whatif_oom.pickle --setting");
    let args: Vec<&str> = command.split_whitespace().skip(1).collect();
    let o = cli(&args);
    ok(&o);
    let trim = |s: &str| {
        s.lines()
            .map(str::trim_end)
            .collect::<Vec<_>>()
            .join("\n")
            .trim_end()
            .to_string()
    };
    assert_eq!(trim(&o.stdout), trim(&expected));
    // What the example says: the recorded settings fail, expandable segments fit.
    assert!(o.stdout.contains("recorded (default)"));
    let (check, expected) =
        docs_example("poolsight whatif fixtures/pytorch/whatif_oom.pickle --check");
    let args: Vec<&str> = check.split_whitespace().skip(1).collect();
    let o = cli(&args);
    ok(&o);
    assert_eq!(trim(&o.stdout), trim(&expected));
}

#[test]
fn json_has_the_keys_of_the_spec() {
    let j = cli(&[
        "whatif",
        &fixture("whatif_oom.pickle"),
        "--setting",
        "expandable_segments:True",
        "--setting",
        "max_split_size_mb:20,roundup_power2_divisions:[1:4,2:4,>:2]",
        "--min-capacity",
        "--format",
        "json",
    ])
    .json();
    assert_eq!(j["allocator"], "pytorch");
    assert_eq!(j["capacity_bytes"], 70 * MIB);
    let runs = j["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 3);
    for r in runs {
        for key in [
            "settings",
            "reserved_peak_bytes",
            "allocated_peak_bytes",
            "fragmentation_bytes",
            "fits",
            "first_failure",
            "min_capacity_bytes",
        ] {
            assert!(r.get(key).is_some(), "{key} missing: {r}");
        }
    }
    let recorded = &runs[0];
    assert_eq!(recorded["settings"], serde_json::json!({}));
    assert_eq!(recorded["fits"], false);
    assert_eq!(recorded["reserved_peak_bytes"], 60 * MIB);
    let f = &recorded["first_failure"];
    assert_eq!(f["requested_bytes"], 7 * MIB);
    assert_eq!(f["line"], "train.py:22:backward");
    assert_eq!(
        f["live_top_lines"],
        serde_json::json!([{"line": "train.py:22:forward", "bytes": 42 * MIB}])
    );
    assert!(f["ns"].as_u64().unwrap() > 0);
    assert_eq!(recorded["min_capacity_bytes"], 80 * MIB);
    let exp = &runs[1];
    assert_eq!(exp["settings"]["expandable_segments"], "True");
    assert_eq!(exp["fits"], true);
    assert_eq!(exp["first_failure"], serde_json::Value::Null);
    assert_eq!(exp["min_capacity_bytes"], 60 * MIB);
    let combo = &runs[2];
    assert_eq!(combo["settings"]["max_split_size_mb"], "20");
    // As PyTorch parses it, `>` fills from the last interval named, that one included.
    assert_eq!(combo["settings"]["roundup_power2_divisions"], "[1:4,2:2]");
}

#[test]
fn capacity_in_human_units() {
    for (cap, fits) in [
        ("80MiB", true),
        ("80MB", true),
        ("83886080", true),
        ("70MiB", false),
    ] {
        let j = cli(&[
            "whatif",
            &fixture("whatif_oom.pickle"),
            "--capacity",
            cap,
            "--format",
            "json",
        ])
        .json();
        assert_eq!(
            j["capacity_bytes"],
            80 * MIB - if fits { 0 } else { 10 * MIB }
        );
        assert_eq!(j["runs"][0]["fits"], fits, "{cap}");
    }
    // Without a capacity nothing fails, and the table says so.
    let o = cli(&["whatif", &fixture("whatif_mixed.pickle")]);
    ok(&o);
    assert!(o.stdout.contains("capacity none known"), "{}", o.stdout);
    assert_eq!(o.stdout.lines().count(), 7, "{}", o.stdout);
}

#[test]
fn poolsight_traces_replay_too() {
    for t in [
        "fixtures/traces/chainer_nested.pstrace",
        "fixtures/traces/fastai_epochs.pstrace",
    ] {
        let j = cli(&["whatif", t, "--format", "json"]).json();
        let runs = j["runs"].as_array().unwrap();
        assert_eq!(runs.len(), 5, "{t}");
        assert!(
            runs[0]["reserved_peak_bytes"].as_u64().unwrap() > 0,
            "{t}: {j}"
        );
        assert!(
            runs[0]["reserved_peak_bytes"].as_u64() >= runs[0]["allocated_peak_bytes"].as_u64()
        );
    }
}

#[test]
fn bad_input_is_one_line_and_exit_2() {
    let oom = fixture("whatif_oom.pickle");
    usage_error(&cli(&["whatif", &oom, "--setting", "bogus:1"]));
    usage_error(&cli(&["whatif", &oom, "--setting", "max_split_size_mb:5"]));
    usage_error(&cli(&[
        "whatif",
        &oom,
        "--setting",
        "roundup_power2_divisions:3",
    ]));
    usage_error(&cli(&["whatif", &oom, "--capacity", "12XB"]));
    usage_error(&cli(&["whatif", &oom, "--capacity", "0"]));
    usage_error(&cli(&["whatif", &oom, "--format", "csv"]));
    usage_error(&cli(&["whatif", "no-such-file.pickle"]));
    let data = std::fs::read(&oom).unwrap();
    let cut = scratch::file("cut.pickle");
    for n in [10, data.len() / 2, data.len() - 1] {
        std::fs::write(&cut, &data[..n]).unwrap();
        let o = cli(&["whatif", cut.to_str().unwrap()]);
        assert!(!o.stderr.contains("panicked"), "{}", o.stderr);
        assert!(o.code == 2 || o.code == 0, "{}", o.stderr);
    }
    let dir: PathBuf = scratch::file("adir").to_path_buf();
    std::fs::create_dir_all(&dir).unwrap();
    usage_error(&cli(&["whatif", dir.to_str().unwrap()]));
}

#[test]
fn empty_cut_and_corrupt_traces_never_panic() {
    use poolsight::recorder::{Recorder, RecorderConfig};
    let empty = scratch::file("no-events.pstrace");
    Recorder::create(&*empty, RecorderConfig::default())
        .expect("create")
        .finish()
        .expect("finish");
    let o = cli(&["whatif", empty.to_str().unwrap(), "--min-capacity"]);
    ok(&o);
    assert!(o.stdout.contains("0 requests"), "{}", o.stdout);
    ok(&cli(&["whatif", "--check", empty.to_str().unwrap()]));

    let data = std::fs::read("fixtures/traces/fastai_epochs.pstrace").unwrap();
    let bad = scratch::file("bad.pstrace");
    let step = (data.len() / 23).max(1);
    let mut variants: Vec<Vec<u8>> = (1..data.len())
        .step_by(step)
        .map(|n| data[..n].to_vec())
        .collect();
    for at in (0..data.len()).step_by(step) {
        let mut d = data.clone();
        d[at] ^= 0x5a;
        variants.push(d);
    }
    for v in variants {
        std::fs::write(&bad, &v).unwrap();
        for args in [
            vec!["whatif"],
            vec!["whatif", "--check"],
            vec!["whatif", "--min-capacity"],
        ] {
            let mut a = args.clone();
            a.push(bad.to_str().unwrap());
            let o = cli(&a);
            assert!(!o.stderr.contains("panicked"), "{}", o.stderr);
            match o.code {
                0 => {}
                2 => assert_eq!(o.stderr.trim().lines().count(), 1, "{}", o.stderr),
                c => panic!("exit {c}: {}", o.stderr),
            }
        }
    }
}

#[test]
fn a_converted_trace_replays_as_its_snapshot_under_the_recorded_settings() {
    // `poolsight import` keeps the allocator's settings and held segments in the trace (format
    // 1.7): whatif, --check and oom answer on it exactly as on the pickle.
    let mut kept = Vec::new();
    for name in [
        "whatif_settings.pickle",
        "whatif_oom.pickle",
        "whatif_midway.pickle",
    ] {
        let pickle = fixture(name);
        kept.push(scratch::file(&format!("{name}.pstrace")));
        let trace = kept.last().unwrap().to_str().unwrap();
        ok(&cli(&["import", &pickle, "-o", trace, "--force"]));
        for args in [
            vec!["whatif", "--format", "json"],
            vec!["whatif", "--check", "--format", "json"],
            vec!["whatif", "--min-capacity", "--format", "json"],
        ] {
            let from_pickle = cli(&[&args[..], &[pickle.as_str()]].concat()).json();
            let from_trace = cli(&[&args[..], &[trace]].concat()).json();
            let strip = |mut v: serde_json::Value| {
                // The file's name is each side's own.
                for r in v.as_array_mut().into_iter().flatten() {
                    r.as_object_mut().map(|o| o.remove("trace"));
                }
                if let Some(o) = v.as_object_mut() {
                    o.remove("trace");
                    for r in o.values_mut().filter_map(|x| x.as_array_mut()).flatten() {
                        r.as_object_mut().map(|o| o.remove("trace"));
                    }
                }
                v
            };
            assert_eq!(strip(from_pickle), strip(from_trace), "{name}: {args:?}");
        }
    }
    let o = cli(&["whatif", kept[0].to_str().unwrap()]);
    ok(&o);
    assert!(
        (o.stdout.lines().nth(2).unwrap())
            .starts_with("recorded (max_split_size_mb:64,max_non_split_rounding_mb:32"),
        "{}",
        o.stdout
    );
}

#[test]
fn a_snapshots_pinned_host_memory_is_not_replayed_as_a_gpus() {
    // Pinned host memory is its own device (`pinned`), but not the CUDA caching allocator's:
    // beside the GPU, whatif replays the GPU alone.
    let j = cli(&[
        "whatif",
        &fixture("snapshot_newer_fields.pickle"),
        "--format",
        "json",
    ])
    .json();
    let reports = j.as_array().map_or_else(|| vec![j.clone()], |a| a.clone());
    assert_eq!(reports.len(), 1, "{j}");
    assert_eq!(reports[0]["device"], 0, "{j}");
}
