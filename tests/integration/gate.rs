//! The CI gate: `diff` refuses partial runs (exit 2, one line) unless `--allow-incomplete`;
//! merging refuses the same trace or rank twice; usage errors are one line with exit 2.

use crate::support::scratch;

use std::process::{Command, Output};

fn poolsight(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_poolsight"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(args)
        .output()
        .expect("run poolsight")
}

fn scratch(name: &str) -> scratch::Scratch {
    scratch::file(name)
}

const GOOD: &str = "fixtures/traces/seed_fidelity.pstrace";

fn stderr_line(o: &Output) -> String {
    let e = String::from_utf8_lossy(&o.stderr).to_string();
    e.lines()
        .filter(|l| !l.contains("warning:"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every truncation of a good trace, at offsets spread over the file, is refused by `diff`
/// (exit 2, never 0 or 1) unless `--allow-incomplete`.
#[test]
fn a_damaged_trace_never_passes_diff() {
    let bytes = std::fs::read(GOOD).expect("fixture");
    let mut cuts: Vec<usize> = (0..bytes.len()).step_by(bytes.len() / 23 + 1).collect();
    cuts.extend([bytes.len() - 1, bytes.len() - 8, 0, 1]);
    for (i, cut) in cuts.into_iter().enumerate() {
        let p = scratch(&format!("cut-{i}.pstrace"));
        let mut damaged = bytes[..cut].to_vec();
        // Also flip a byte inside what remains, on every other cut.
        if i % 2 == 1 && cut > 600 {
            damaged[cut / 2] ^= 0x5a;
        }
        std::fs::write(&p, &damaged).expect("write");
        let p = p.display().to_string();
        for args in [
            vec!["diff", GOOD, &p, "--fail-on", "peak_used>+5%"],
            vec!["diff", &p, GOOD],
        ] {
            let o = poolsight(&args);
            assert_eq!(o.status.code(), Some(2), "cut at {cut}: {args:?} {o:?}");
            assert_eq!(stderr_line(&o).lines().count(), 1, "{o:?}");
        }
    }
}

#[test]
fn allow_incomplete_names_the_partial_side() {
    let bytes = std::fs::read(GOOD).expect("fixture");
    let p = scratch("half.pstrace");
    std::fs::write(&p, &bytes[..bytes.len() * 2 / 3]).expect("write");
    let p = p.display().to_string();
    let o = poolsight(&["diff", GOOD, &p]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr_line(&o).contains("new run is partial"), "{o:?}");
    assert!(stderr_line(&o).contains("--allow-incomplete"), "{o:?}");
    let o = poolsight(&["diff", "--allow-incomplete", GOOD, &p]);
    assert_ne!(o.status.code(), Some(2), "{o:?}");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.starts_with("warning: new run is partial"), "{out}");
    // In JSON the document says it, first, and a whole pair has no such key.
    let json = |args: &[&str]| -> serde_json::Value {
        let o = poolsight(args);
        serde_json::from_slice(&o.stdout).expect("one JSON document")
    };
    let d = json(&["diff", "--allow-incomplete", "--format", "json", GOOD, &p]);
    let partial = d["partial"].as_array().expect("partial");
    assert_eq!(partial.len(), 1, "{d}");
    assert!(
        partial[0]
            .as_str()
            .unwrap()
            .starts_with("new run is partial"),
        "{d}"
    );
    assert!(d["rows"].as_array().is_some_and(|r| !r.is_empty()), "{d}");
    let d = json(&["diff", "--format", "json", GOOD, GOOD]);
    assert!(d.get("partial").is_none(), "{d}");
    assert_eq!(d["violations"], serde_json::json!([]));
    let o = poolsight(&["info", &p]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("complete     no:"), "{out}");
}

#[test]
fn the_same_trace_or_rank_twice_is_an_error() {
    let copy = scratch("copy.pstrace");
    std::fs::copy(GOOD, &copy).expect("copy");
    for args in [
        vec!["functions", GOOD, GOOD],
        vec!["functions", GOOD, copy.to_str().expect("utf-8")],
    ] {
        let o = poolsight(&args);
        assert_eq!(o.status.code(), Some(2), "{o:?}");
        assert!(stderr_line(&o).contains("are the same trace"), "{o:?}");
    }
    // A missing rank and ranks of different runs: warnings, and the report goes on.
    let o = poolsight(&["functions", "fixtures/traces/two_ranks-rank0.pstrace", GOOD]);
    assert_eq!(o.status.code(), Some(0));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("rank(s) 1 not given"), "{err}");
    assert!(err.contains("from another run"), "{err}");
}

#[test]
fn usage_errors_are_one_line_and_list_valid_values() {
    for (args, needle) in [
        (vec!["functions", "--unit", "XB", GOOD], "ZB"),
        (vec!["timers", "--unit", "hours", GOOD], "auto_foreach"),
        (vec!["info", "--format", "xml", GOOD], "table, json, csv"),
        (vec!["functions"], "required"),
        (vec!["info", "fixtures"], "is a directory"),
    ] {
        let o = poolsight(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    let o = poolsight(&["info", "--format", "csv", GOOD]);
    assert_eq!(o.status.code(), Some(0));
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(out.lines().count(), 2, "one header, one row: {out}");
}

/// Runs of a multi-rank job on each side of a diff: rank 0 of one run and rank 0 of another
/// are two runs, not the same rank given twice.
#[test]
fn several_runs_of_rank_0_compare_per_run() {
    use poolsight::recorder::{MemKind, MemRecord, Recorder, RecorderConfig};
    let run = |name: &str, bytes: u64| {
        let path = scratch::process_file(name);
        let rec = Recorder::create(
            &path,
            RecorderConfig {
                rank: Some(0),
                world_size: Some(1),
                ..RecorderConfig::default()
            },
        )
        .expect("recorder");
        let h = rec.handle();
        for kind in [MemKind::MallocPost, MemKind::FreePost] {
            h.record_mem(MemRecord {
                kind,
                device: 0,
                stream: 0,
                ptr: 0x1000,
                bytes,
                stack: 0,
                pmem: 0,
            });
        }
        drop(h);
        rec.finish().expect("finish");
        path.display().to_string()
    };
    let (b1, b2) = (
        run("runs-b1.pstrace", 1 << 20),
        run("runs-b2.pstrace", 1 << 20),
    );
    let (n1, n2) = (
        run("runs-n1.pstrace", 2 << 20),
        run("runs-n2.pstrace", 2 << 20),
    );
    let o = poolsight(&[
        "diff",
        "--base",
        &b1,
        &b2,
        "--new",
        &n1,
        &n2,
        "--fail-on",
        "peak_used>+50%",
    ]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("peak_used"), "{out}");
}

/// A reader that stops reading (`poolsight ... | head`) is no error: exit 0 and nothing on
/// stderr, except that `diff`'s verdict stands.
#[test]
fn a_reader_that_stops_reading_is_not_an_error() {
    use std::process::Stdio;
    for (args, code) in [
        (vec!["lines", GOOD], 0),
        (vec!["report", "--format", "json", GOOD], 0),
        (vec!["diff", "--all", GOOD, GOOD], 0),
        (vec!["diff", "--all", "--format", "json", GOOD, GOOD], 0),
        (vec!["diff", "--fail-on", "peak_used>=+0%", GOOD, GOOD], 1),
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_poolsight"))
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run poolsight");
        // The pipe's reading end is closed before anything is written to it.
        drop(child.stdout.take());
        let o = child.wait_with_output().expect("wait");
        assert_eq!(o.status.code(), Some(code), "{args:?} {o:?}");
        assert!(o.stderr.is_empty(), "{args:?} {o:?}");
    }
}
