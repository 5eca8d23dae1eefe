//! The README's CI recipe, `scripts/ci-gate.sh`, run as a CI job would run it: a git repository
//! whose "training" (the demo, sized by a file in the repository) grows on the change.

use crate::support::scratch;

use std::path::Path;
use std::process::{Command, Output};

fn git(repo: &Path, args: &[&str]) {
    let out = Command::new("git")
        .current_dir(repo)
        .args(["-c", "user.name=ci", "-c", "user.email=ci@example.invalid"])
        .args(args)
        .output()
        .expect("git runs");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A repository with two commits: `base` trains a 32-wide hidden layer, `change` a 256-wide one.
fn repo(name: &str) -> scratch::Scratch {
    let dir = scratch::file(name);
    std::fs::create_dir_all(&dir).expect("mkdir");
    git(&dir, &["init", "--quiet"]);
    std::fs::write(dir.join("width"), "32\n").expect("write");
    git(&dir, &["add", "width"]);
    git(&dir, &["commit", "--quiet", "-m", "base"]);
    git(&dir, &["tag", "base"]);
    std::fs::write(dir.join("width"), "256\n").expect("write");
    git(&dir, &["commit", "--quiet", "-am", "change"]);
    git(&dir, &["tag", "change"]);
    dir
}

const RECORD: &str = "\"$POOLSIGHT\" demo --epochs 1 --steps-per-epoch 10 --eval-batches 1 \
                      --eval-batch 64 --hidden \"$(cat width)\" --out \"$POOLSIGHT_TRACE\"";

fn gate(repo: &Path, base: &str, head: &str, record: &str, rules: &[&str]) -> Output {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/ci-gate.sh");
    Command::new("sh")
        .arg(script)
        .args(rules)
        .current_dir(repo)
        .env("BASE", base)
        .env("HEAD", head)
        .env("RECORD", record)
        .env("RUNS", "1")
        .env("POOLSIGHT", env!("CARGO_BIN_EXE_poolsight"))
        .output()
        .expect("the gate runs")
}

#[test]
fn the_gate_fails_a_change_that_costs_memory_and_passes_one_that_does_not() {
    let repo = repo("gate");
    let grew = gate(&repo, "base", "change", RECORD, &[]);
    let report = String::from_utf8_lossy(&grew.stdout);
    assert_eq!(
        grew.status.code(),
        Some(1),
        "{report}\n{}",
        String::from_utf8_lossy(&grew.stderr)
    );
    assert!(report.contains("peak_used"), "{report}");
    assert!(
        repo.join("poolsight-gate/diff.svg").exists(),
        "the flamegraph artifact"
    );

    let same = gate(
        &repo,
        "base",
        "base",
        RECORD,
        &["--fail-on", "peak_used>+5%"],
    );
    assert_eq!(
        same.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&same.stdout)
    );
    // The gate never switched the repository's own checkout.
    let head = std::fs::read_to_string(repo.join("width")).expect("read");
    assert_eq!(head, "256\n");
}

#[test]
fn the_gate_exits_2_on_bad_input() {
    let repo = repo("gate-bad");
    let missing = gate(&repo, "no-such-rev", "change", RECORD, &[]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no revision no-such-rev"));

    let failing = gate(&repo, "base", "change", "exit 3", &[]);
    assert_eq!(failing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&failing.stderr).contains("the base run 1 failed"));

    let silent = gate(&repo, "base", "change", "true", &[]);
    assert_eq!(silent.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&silent.stderr).contains("wrote no trace"));
}
