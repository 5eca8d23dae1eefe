//! Every analysis command on bad or unusual input: a clear one-line error and exit 2, or a
//! result (with warnings for damaged parts) and exit 0 — never a panic, never another code.

use crate::support::{cli, scratch, Outcome};

use std::path::{Path, PathBuf};

use poolsight::recorder::{Recorder, RecorderConfig};

fn scratch(name: &str) -> scratch::Scratch {
    scratch::file(name)
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/traces")
        .join(name)
}

/// Each command with its arguments; `OUT` is replaced by a scratch output path.
const COMMANDS: &[&[&str]] = &[
    &["info"],
    &["functions", "--self"],
    &["lines", "--max-depth", "3"],
    &["timers"],
    &["epochs", "--format", "json"],
    &["report", "--format", "csv", "--table", "functions"],
    &["flamegraph", "-o", "OUT", "--metric", "peak"],
    &["flamegraph", "-o", "OUT", "--metric", "time"],
    &["timeline", "-o", "OUT"],
    &["export", "--format", "chrome", "-o", "OUT"],
    &["export", "--format", "folded", "-o", "OUT"],
    &["export", "--format", "json", "-o", "OUT"],
    &["export", "--format", "parquet", "-o", "OUTDIR"],
];

fn run(args: &[&str], trace: &Path) -> Outcome {
    let out_path = scratch("out");
    let out_dir = scratch("dataset");
    let args: Vec<String> = args
        .iter()
        .map(|a| {
            if *a == "OUT" {
                out_path.display().to_string()
            } else if *a == "OUTDIR" {
                out_dir.display().to_string()
            } else {
                a.to_string()
            }
        })
        .chain([trace.display().to_string()])
        .collect();
    cli(&args)
}

/// The contract for any input: exit 0, or exit 2 with exactly one error line (warnings about
/// damaged parts may precede it); no panic.
fn check_contract(args: &[&str], trace: &Path) -> Outcome {
    let o = run(args, trace);
    assert!(
        !o.stderr.contains("panicked"),
        "{args:?} on {} panicked: {}",
        trace.display(),
        o.stderr
    );
    assert!(
        o.code == 0 || o.code == 2,
        "{args:?} on {}: exit {}: {}",
        trace.display(),
        o.code,
        o.stderr
    );
    if o.code == 2 {
        let errors: Vec<&str> = o
            .stderr
            .lines()
            .filter(|l| !l.starts_with("poolsight: warning:"))
            .collect();
        assert_eq!(
            errors.len(),
            1,
            "{args:?} on {}: want one error line, got {:?}",
            trace.display(),
            o.stderr
        );
        assert!(errors[0].starts_with("poolsight: "), "{errors:?}");
    }
    o
}

#[test]
fn not_a_trace_is_one_clear_error() {
    let empty = scratch("empty.pstrace");
    std::fs::write(&empty, b"").expect("write");
    let foreign = scratch("foreign.pstrace");
    std::fs::write(&foreign, b"PK\x03\x04 this is a zip file, not a trace\n").expect("write");
    let future = scratch("future.pstrace");
    let mut bytes = std::fs::read(fixture("cupy_line_profile.pstrace")).expect("fixture");
    bytes[8] = 99; // format major
    std::fs::write(&future, &bytes).expect("write");
    for (path, says) in [(&empty, "trace"), (&foreign, "trace"), (&future, "99")] {
        for args in COMMANDS {
            let o = check_contract(args, path);
            assert_eq!(o.code, 2, "{args:?} on {}", path.display());
            assert!(o.stderr.contains(says), "{args:?}: {}", o.stderr);
        }
    }
    let o = check_contract(&["lines"], Path::new("/nonexistent/run.pstrace"));
    assert_eq!(o.code, 2);
    assert!(
        o.stderr.contains("/nonexistent/run.pstrace"),
        "{}",
        o.stderr
    );
}

#[test]
fn a_trace_without_events_gives_empty_tables_or_a_clear_error() {
    let path = scratch("no-events.pstrace");
    Recorder::create(&path, RecorderConfig::default())
        .expect("create")
        .finish()
        .expect("finish");
    for args in COMMANDS {
        check_contract(args, &path);
    }
    let o = check_contract(&["report"], &path);
    assert_eq!(o.code, 0);
    assert!(o.stdout.contains("no function scopes in this trace"));
    assert!(o.stdout.contains("_root (0.00B, 0.00B)"));
    assert!(o.stdout.contains("no link scopes in this trace"));
    assert!(o.stdout.contains("no epochs in this trace"));
    let o = check_contract(&["flamegraph", "-o", "OUT"], &path);
    assert_eq!(o.code, 2);
    assert!(o.stderr.contains("nothing to draw"), "{}", o.stderr);
}

#[test]
fn a_trace_without_scopes_or_epochs_still_reports_memory() {
    let path = fixture("cupy_line_profile.pstrace");
    for args in COMMANDS {
        check_contract(args, &path);
    }
    let o = check_contract(&["timers"], &path);
    assert_eq!(o.code, 0);
    assert!(o.stdout.contains("no link scopes") && o.stdout.contains("no function scopes"));
    let o = check_contract(&["epochs"], &path);
    assert!(o.stdout.contains("no epochs"));
}

/// Cut a trace anywhere: every command either reads what remains, warning about the rest,
/// or says clearly that it cannot.
#[test]
fn truncated_traces_never_panic() {
    let bytes = std::fs::read(fixture("chainer_nested.pstrace")).expect("fixture");
    let cut = scratch("cut.pstrace");
    let step = (bytes.len() / 23).max(1);
    for at in (0..bytes.len()).step_by(step) {
        std::fs::write(&cut, &bytes[..at]).expect("write");
        for args in COMMANDS {
            check_contract(args, &cut);
        }
    }
}

/// Flipped bytes inside chunks: the damaged chunk is skipped with a warning naming its
/// offset, the rest is analyzed.
#[test]
fn corrupted_chunks_are_skipped_with_a_warning() {
    let bytes = std::fs::read(fixture("chainer_nested.pstrace")).expect("fixture");
    let bad = scratch("corrupt.pstrace");
    let mut seen_warning = false;
    for at in (1024..bytes.len()).step_by(bytes.len() / 11) {
        let mut b = bytes.clone();
        b[at] ^= 0x5a;
        std::fs::write(&bad, &b).expect("write");
        for args in COMMANDS {
            let o = check_contract(args, &bad);
            seen_warning |= o.stderr.contains("poolsight: warning:") && o.stderr.contains("offset");
        }
    }
    assert!(seen_warning, "no corruption was reported");
}

/// A run killed inside an epoch: the epoch is reported up to the trace's end, and marked.
#[test]
fn an_epoch_the_trace_ended_inside_is_marked() {
    use poolsight::pool::device::HostDevice;
    use poolsight::pool::{MemoryPool, TraceHook};
    use std::sync::Arc;

    let path = scratch("cut-epoch.pstrace");
    let rec = Recorder::create(&path, RecorderConfig::default()).expect("create");
    let h = rec.handle();
    let pool = MemoryPool::new(Arc::new(HostDevice::new(0, 1 << 30)));
    let hook = TraceHook::for_pool(h.clone(), &pool).install();
    h.epoch_begin(1);
    let kept = pool.malloc(3 << 20).expect("malloc");
    drop(hook);
    rec.finish().expect("finish");
    drop(kept);
    let o = check_contract(&["epochs"], &path);
    assert_eq!(o.code, 0);
    assert!(o.stdout.contains("\n1*        "), "{}", o.stdout);
    assert!(o.stdout.contains("ended inside this epoch"), "{}", o.stdout);
    let o = check_contract(&["epochs", "--format", "json"], &path);
    let j: serde_json::Value = serde_json::from_str(&o.stdout).expect("json");
    assert_eq!(j["epochs"][0]["complete"], false);
    assert_eq!(j["epochs"][0]["gpu_used_mb"], 3);
}
