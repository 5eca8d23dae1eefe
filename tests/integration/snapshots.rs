//! PyTorch's files as inputs (fixtures/pytorch, written by make.py): every command reads a
//! snapshot or a profiler trace where it reads a trace; `import` converts once to the same
//! figures; a snapshot cut at every byte or with any bit flipped, a hostile pickle, and files
//! that are neither give one error line and exit 2, or a result — never a panic.

use std::path::{Path, PathBuf};

use crate::support::{cli, scratch, Outcome};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/pytorch")
        .join(name)
}

fn ok(o: &Outcome) {
    assert_eq!(o.code, 0, "stdout: {}\nstderr: {}", o.stdout, o.stderr);
}

/// Exit 0, or exit 2 with one line; never a panic.
fn contract(o: &Outcome) {
    assert!(!o.stderr.contains("panicked"), "{}", o.stderr);
    match o.code {
        0 => {}
        2 => assert_eq!(o.stderr.trim().lines().count(), 1, "{}", o.stderr),
        c => panic!("exit {c}: {}", o.stderr),
    }
}

#[test]
fn every_command_reads_a_snapshot() {
    let snap = fixture("snapshot_small.pickle");
    let s = snap.to_str().unwrap();
    let out = scratch::file("out");
    let dir = scratch::file("dataset");
    let (o, d) = (out.to_str().unwrap(), dir.to_str().unwrap());
    for args in [
        vec!["info", s],
        vec!["functions", s],
        vec!["lines", s],
        vec!["timers", s],
        vec!["epochs", s],
        vec!["report", s],
        vec!["flamegraph", "-o", o, "--metric", "peak", s],
        vec!["timeline", "-o", o, s],
        vec!["html", "-o", o, s],
        vec!["export", "--format", "chrome", "-o", o, s],
        vec!["export", "--format", "parquet", "-o", d, s],
        vec!["pack", s, "-o", o],
    ] {
        let r = cli(&args);
        ok(&r);
        assert!(!r.stderr.contains("warning"), "{args:?}: {}", r.stderr);
    }
    let info = cli(&["info", "--format", "json", s]).json();
    // The hand-made run (make.py): 8 blocks of 512 B x i, the first 6 freed, one of 4 KiB.
    let pool = &info["pool"];
    assert_eq!(pool["peak_used_bytes"], 36 * 512);
    assert_eq!(pool["used_at_end_bytes"], (7 + 8) * 512 + 4096);
    assert_eq!(pool["out_of_memory"], 1);
    assert_eq!(info["events"]["free_requested"], 6);
    assert_eq!(info["events"]["device_free"], 1);
    assert_eq!(info["imported_from"]["kind"], "pytorch-snapshot");
    assert_eq!(info["imported_from"]["overflowed"], false);
    // The header's process is the one that converted the file, and the text says so.
    let text = cli(&["info", s]).stdout;
    assert!(text.contains("converted by pid "), "{text}");
    assert!(!text.contains("process      pid"), "{text}");
    let epochs = cli(&["epochs", "--format", "json", s]).json();
    assert_eq!(epochs["epochs"].as_array().unwrap().len(), 1);
}

#[test]
fn frames_are_filtered_as_the_viewer_does() {
    let s = fixture("snapshot_small.pickle");
    let s = s.to_str().unwrap();
    let viewer = cli(&["lines", s]).stdout;
    assert!(viewer.contains("train.py:12:forward"), "{viewer}");
    assert!(
        !viewer.contains("unwind")
            && !viewer.contains("ceval")
            && !viewer.contains("CUDACachingAllocator")
    );
    let all = cli(&["lines", "--frames", "all", s]).stdout;
    assert!(all.contains("??:0:torch::unwind::unwind()"), "{all}");
    let bad = cli(&["lines", "--frames", "most", s]);
    assert_eq!(bad.code, 2);
}

#[test]
fn import_converts_once_and_ranks_merge() {
    let dir = scratch::dir();
    let one = dir.join("one.pstrace");
    let r = cli(&[
        "import",
        fixture("snapshot_small.pickle").to_str().unwrap(),
        "-o",
        one.to_str().unwrap(),
    ]);
    ok(&r);
    let s = fixture("snapshot_small.pickle");
    for cmd in ["report", "lines"] {
        assert_eq!(
            cli(&[cmd, one.to_str().unwrap()]).stdout,
            cli(&[cmd, s.to_str().unwrap()]).stdout
        );
    }
    // Two snapshots: ranks 0 and 1 of one job, one file each, merged as native traces are.
    let out = dir.join("ranks");
    let r = cli(&[
        "import",
        fixture("snapshot_small.pickle").to_str().unwrap(),
        fixture("snapshot_grown.pickle").to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    ok(&r);
    let a = out.join("snapshot_small.pstrace");
    let b = out.join("snapshot_grown.pstrace");
    let merged = cli(&["info", "--format", "json", a.to_str().unwrap()]).json();
    assert_eq!(merged["rank"], 0);
    let r = cli(&[
        "report",
        "--per-rank",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
    ]);
    ok(&r);
    assert!(!r.stderr.contains("warning"), "{}", r.stderr);
    // Directly, too.
    ok(&cli(&[
        "report",
        fixture("snapshot_small.pickle").to_str().unwrap(),
        fixture("snapshot_grown.pickle").to_str().unwrap(),
    ]));
}

#[test]
fn diff_of_two_snapshots_gates_and_names_the_stacks() {
    let (a, b) = (
        fixture("snapshot_small.pickle"),
        fixture("snapshot_grown.pickle"),
    );
    let r = cli(&[
        "diff",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        "--fail-on",
        "peak_used>+10%",
        "--format",
        "json",
    ]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    let j = r.json();
    let rows = j["rows"].as_array().unwrap();
    // By default: what was live at each peak, by the innermost user line, the stack behind
    // it (its phase inferred: a module's forward) beside the key.
    let row = rows
        .iter()
        .find(|r| r["key"] == "peak.line.train.py:12:forward")
        .expect("the line that grew at the peak");
    assert_eq!(row["delta"].as_i64().unwrap(), 2 * 18 * 1024);
    assert_eq!(
        row["stack"],
        serde_json::json!([
            "phase: forward",
            "train.py:10:main",
            "train.py:11:step",
            "train.py:12:forward"
        ])
    );
    assert!(
        rows.iter().all(|r| r["section"] != "lines"),
        "cumulative lines are asked for by name: {j:#}"
    );
    // The new run goes over the base by the rule's margin in its first step.
    let at = &j["parting"]["at"];
    assert_eq!(at["step"], 0, "{j:#}");
    assert!(
        at["new_bytes"].as_i64() > at["base_bytes"].as_i64(),
        "{j:#}"
    );
    assert_eq!(j["parting"]["margin"], "the rule peak_used>+10%");

    // The whole stacks, asked for by name: the same growth, live at the peak.
    let lines = cli(&[
        "diff",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        "--section",
        "lines",
        "--format",
        "json",
    ])
    .json();
    let row = lines["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| {
            r["key"]
                == "line:inferred:0:forward;train.py:10:main;train.py:11:step;train.py:12:forward.live_at_peak"
        })
        .expect("the stack that grew at the peak");
    assert_eq!(row["delta"].as_i64().unwrap(), 2 * 18 * 1024);
    let same = cli(&[
        "diff",
        a.to_str().unwrap(),
        a.to_str().unwrap(),
        "--fail-on",
        "peak_used>+10%",
    ]);
    assert_eq!(same.code, 0, "{}", same.stderr);
}

#[test]
fn a_profiler_trace_gives_functions_links_and_steps() {
    let p = fixture("profile_small.json");
    let p = p.to_str().unwrap();
    let f = cli(&["functions", "--format", "json", p]).json();
    let rows = f["functions"].as_array().unwrap();
    let addmm = rows.iter().find(|r| r["name"] == "aten::addmm").unwrap();
    assert_eq!(addmm["used_bytes"], 5120);
    let linear = rows.iter().find(|r| r["name"] == "aten::linear").unwrap();
    assert_eq!(
        linear["used_bytes"], 5120,
        "nested calls count in the caller"
    );
    let t = cli(&["timers", "--format", "json", p]).json();
    assert_eq!(t["links"][0]["name"], "Linear");
    let info = cli(&["info", "--format", "json", p]).json();
    assert_eq!(
        info["imported_from"]["overflowed"], true,
        "a free of 256 B never allocated"
    );
    assert_eq!(info["pool"]["peak_used_bytes"], 256 + 4096 + 1024);
    let lines = cli(&["lines", p]).stdout;
    assert!(
        lines.contains("torch/nn/modules/linear.py:125:forward"),
        "{lines}"
    );
    let e = cli(&["epochs", "--format", "json", p]).json();
    assert_eq!(e["epochs"][0]["epoch"], 0);
}

#[test]
fn hostile_pickles_are_refused_without_running() {
    let dir = scratch::dir();
    // pickle.dumps of an object whose __reduce__ is (os.system, ('touch pwned',)), protocol 2
    let hostile = b"\x80\x02cposix\nsystem\nq\x00X\x0b\x00\x00\x00touch pwnedq\x01\x85q\x02Rq\x03.";
    let p = dir.join("evil.pickle");
    std::fs::write(&p, hostile).unwrap();
    let r = cli(&["report", p.to_str().unwrap()]);
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("refused") && r.stderr.contains("posix.system"),
        "{}",
        r.stderr
    );
    assert_eq!(r.stderr.trim().lines().count(), 1);
    assert!(!Path::new(env!("CARGO_MANIFEST_DIR")).join("pwned").exists());
    for (name, bytes) in [
        ("empty.pickle", &b""[..]),
        ("text.pickle", b"hello world"),
        ("list.pickle", b"\x80\x02]q\x00(K\x01K\x02e."),
        ("dict.pickle", b"\x80\x02}q\x00X\x01\x00\x00\x00aK\x01s."),
        ("huge.pickle", b"\x80\x02X\xff\xff\xff\xff"),
        ("json.json", b"{\"traceEvents\": 5}"),
    ] {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        let r = cli(&["info", p.to_str().unwrap()]);
        contract(&r);
        if name != "text.pickle" {
            assert_eq!(r.code, 2, "{name}: {}", r.stdout);
        }
    }
}

/// Cut at every byte, and each bit of each byte flipped: one line and exit 2, or a result.
/// Through the library (the CLI's conversion): a panic fails the test. Both fixtures: one
/// pickled with protocol 2, one with protocol 4 (memo entries by `MEMOIZE`, frames framed),
/// so that the reader's fast path for small dicts meets every damage too.
#[test]
fn truncated_and_flipped_snapshots_never_panic() {
    for name in ["snapshot_small.pickle", "snapshot_grown.pickle"] {
        cut_and_flipped(&std::fs::read(fixture(name)).unwrap());
    }
}

fn cut_and_flipped(bytes: &[u8]) {
    let dir = scratch::dir();
    let input = dir.join("in.pickle");
    let opts = poolsight::import::Options {
        overwrite: true,
        ..Default::default()
    };
    let out = dir.join("out.pstrace");
    let mut refused = 0;
    for cut in 0..bytes.len() {
        std::fs::write(&input, &bytes[..cut]).unwrap();
        let r = poolsight::import::convert_file(&input, &out, &opts, None);
        assert!(r.is_err(), "a snapshot cut at {cut} read as whole");
        refused += 1;
    }
    assert_eq!(refused, bytes.len());
    // Each bit of each byte flipped: the reader and the conversion in memory (where a panic
    // would be), and every 97th through the whole conversion, writing its trace.
    let mut flipped = bytes.to_vec();
    for i in 0..bytes.len() {
        for bit in 0..8 {
            flipped[i] ^= 1 << bit;
            let _ = poolsight::import::snapshot::read(&flipped, Default::default(), None);
            if (i * 8 + bit) % 97 == 0 {
                std::fs::write(&input, &flipped).unwrap();
                if let Err(e) = poolsight::import::convert_file(&input, &out, &opts, None) {
                    assert!(!e.to_string().contains('\n'), "{e}");
                }
            }
            flipped[i] ^= 1 << bit;
        }
    }
    // And one cut through the CLI: one line, exit 2.
    std::fs::write(&input, &bytes[..bytes.len() / 2]).unwrap();
    let r = cli(&["report", input.to_str().unwrap()]);
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("truncated"), "{}", r.stderr);
}

#[test]
fn newer_snapshot_fields_are_read_and_pinned_memory_is_its_own_device() {
    // make.py's `newer_fields_snapshot`: 1 MiB + 512 KiB on cuda:0; 2 MiB + 1 MiB of pinned
    // host memory (`host_traces`), 2 MiB of it still live in `host_segments`.
    let snap = fixture("snapshot_newer_fields.pickle");
    let s = snap.to_str().unwrap();
    for cmd in ["info", "report", "categories"] {
        let r = cli(&[cmd, s]);
        ok(&r);
        assert!(!r.stderr.contains("warning"), "{cmd}: {}", r.stderr);
    }
    let info = cli(&["info", "--format", "json", s]).json();
    let devices = info["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 2, "{devices:?}");
    assert_eq!(devices[0]["name"], "cuda:0");
    assert_eq!(devices[1]["name"], "pinned");
    assert_eq!(devices[1]["kind"], "cpu");
    let unmapped: Vec<&str> = info["imported_from"]["unmapped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u.as_str().unwrap())
        .collect();
    let has = |needle: &str| unmapped.iter().any(|u| u.contains(needle));
    assert!(has("`user_metadata`") && has("\"phase=forward\" 2") && has("\"batch\" 2"));
    assert!(
        has("`compile_context`") && has("\"[0/0]\" 1"),
        "{unmapped:?}"
    );
    assert!(has("\"saved for backward\" 1"), "{unmapped:?}");
    assert!(
        has("snapshot key `a_key_from_a_later_pytorch`: 1"),
        "{unmapped:?}"
    );
    // Neither the host keys nor the entries' keys no reader uses are unmapped.
    assert!(
        !has("host_") && !has("pool_id") && !has("forward_frames"),
        "{unmapped:?}"
    );

    let report = cli(&["report", "--format", "json", s]).json();
    let by_device = report["peak"]["by_device"].as_array().unwrap();
    let peak = |name: &str| {
        by_device
            .iter()
            .find(|d| d["device"] == name)
            .map(|d| d["peak_bytes"].as_u64().unwrap())
    };
    assert_eq!(peak("cuda:0"), Some(3 << 19));
    assert_eq!(peak("pinned"), Some(3 << 20));
    let text = cli(&["report", s]).stdout;
    assert!(text.contains("3.00MB  pinned"), "{text}");
    // The `forward` range of `external_annotations` holds the CUDA blocks, not the host's.
    assert!(text.contains("1.50MB  33%  forward"), "{text}");
    let annotations = cli(&["export", "--format", "json", "-o", "-", s]).stdout;
    assert_eq!(annotations.matches("\"type\":\"annotation\"").count(), 1);
}

#[test]
fn pinned_host_memory_alone_reads_in_any_layout() {
    // `record_cuda=False`: no device entries; `host_traces` a list of lists, and a
    // `host_segments` item that is not a segment, counted, not an error.
    let snap = fixture("snapshot_pinned_only.pickle");
    let s = snap.to_str().unwrap();
    let report = cli(&["report", "--format", "json", s]);
    ok(&report);
    let report = report.json();
    // The only device with memory: the peak is the host's (`by_device` needs two).
    assert_eq!(report["peak"]["peak_used_bytes"], 3 << 20, "{report}");
    let info = cli(&["info", s]);
    ok(&info);
    assert!(
        info.stdout
            .contains("`host_segments` items that are a dict: 1"),
        "{}",
        info.stdout
    );
    assert!(
        info.stdout.contains("pinned (CPU memory"),
        "{}",
        info.stdout
    );
}

/// The widest line of `text`, in characters.
fn widest(text: &str) -> usize {
    text.lines().map(|l| l.chars().count()).max().unwrap_or(0)
}

#[test]
fn a_diff_of_two_steps_fits_a_terminal_and_a_comment_with_the_user_frames_only() {
    // Two full steps recorded with C++ stacks: backward blocks on the autograd engine's
    // thread (libstdc++'s `execute_native_thread_routine` in `thread48.o` and no Python).
    let (a, b) = (
        fixture("snapshot_step_cpp_plain.pickle"),
        fixture("snapshot_hand_written_adamw.pickle"),
    );
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let every = ["--section", "peak", "--section", "lines", "--all"];
    let json = cli(&[&["diff", a, b, "--format", "json"][..], &every].concat());
    ok(&json);
    let j = json.json();
    let keys: Vec<&str> = (j["rows"].as_array().unwrap().iter())
        .map(|r| r["key"].as_str().unwrap())
        .collect();
    assert!(
        keys.iter().any(|k| k.chars().count() > 200),
        "whole stacks are longer than a comment's line"
    );
    for format in ["table", "markdown"] {
        let o = cli(&[&["diff", a, b, "--format", format][..], &every].concat());
        ok(&o);
        let width = if format == "table" { 160 } else { 200 };
        assert!(widest(&o.stdout) <= width, "{format}:\n{}", o.stdout);
        for native in ["execute_native_thread_routine", "thread48.o", "libc.so"] {
            assert!(!o.stdout.contains(native), "{format}: {native}");
        }
        assert!(!json.stdout.contains("thread48.o"));
        // Shortened keys stay unique: as many rows as the JSON's, each named once.
        let shown: Vec<&str> = (o.stdout.lines())
            .filter(|l| l.starts_with("line:") || l.starts_with("| `line:"))
            .collect();
        let unique: std::collections::HashSet<_> = shown.iter().collect();
        assert_eq!(unique.len(), shown.len(), "{format}");
        assert_eq!(
            shown.len(),
            keys.iter().filter(|k| k.starts_with("line:")).count(),
            "{format}"
        );
    }
    // Nor anywhere else the user view is drawn: the HTML page's icicles, a peak flamegraph.
    let dir = scratch::dir();
    let (page, svg) = (dir.join("step.html"), dir.join("peak.svg"));
    let (page, svg) = (page.to_str().unwrap(), svg.to_str().unwrap());
    ok(&cli(&["html", b, "-o", page]));
    ok(&cli(&["flamegraph", b, "--metric", "peak", "-o", svg]));
    for drawn in [page, svg] {
        let text = std::fs::read_to_string(drawn).unwrap();
        assert!(
            text.contains("_init_state"),
            "{drawn} draws the user's lines"
        );
        assert!(!text.contains("execute_native_thread_routine"), "{drawn}");
    }
    // The markdown folds the stack behind each peak line beside its table.
    let md = cli(&["diff", a, b, "--format", "markdown"]);
    assert!(md
        .stdout
        .contains("<details><summary>the stacks behind these rows"));
    assert!(
        md.stdout.contains("optimizers.py:77:_init_state"),
        "{}",
        md.stdout
    );
    assert!(md
        .stdout
        .contains("the peak grew 2.50KB; what was live at each run's peak"));

    // Rules reach the peak's categories and lines.
    let small = fixture("snapshot_small.pickle");
    let grown = fixture("snapshot_grown.pickle");
    let (small, grown) = (small.to_str().unwrap(), grown.to_str().unwrap());
    let gate = cli(&[
        "diff",
        small,
        grown,
        "--fail-on",
        "peak.category.activation>+5%",
        "--fail-on",
        "peak.line.*train.py:12:*>+64KB",
        "--fail-on",
        "peak.category.optimizer_state>+5%",
    ]);
    assert_eq!(gate.code, 1, "{}{}", gate.stdout, gate.stderr);
    assert!(
        gate.stdout.contains("FAIL: 1 violation(s) of 3 rule(s):"),
        "{}",
        gate.stdout
    );
    assert!(gate
        .stdout
        .contains("peak.category.activation>+5%  peak.category.activation  +200.00%"));
    // A section that does not exist, and a rule naming no peak key, are bad input.
    for bad in [
        &["diff", small, grown, "--section", "stacks"][..],
        &["diff", small, grown, "--fail-on", "peak.cat>+5%"][..],
    ] {
        let o = cli(bad);
        assert_eq!(o.code, 2, "{bad:?}: {}", o.stderr);
        assert_eq!(o.stderr.lines().count(), 1, "{}", o.stderr);
    }
}

/// How many times `poolsight ARGS` opened `path` (strace's `open`/`openat` calls naming it);
/// `None` where strace is missing or may not trace (a container without ptrace).
fn opens_of(path: &Path, args: &[&std::ffi::OsStr]) -> Option<usize> {
    let log = scratch::file("strace.log");
    let out = std::process::Command::new("strace")
        .args(["-f", "-qq", "-e", "trace=open,openat,openat2", "-o"])
        .arg(&*log)
        .arg(env!("CARGO_BIN_EXE_poolsight"))
        .args(args)
        .output()
        .ok()?;
    let text = std::fs::read_to_string(&*log).ok()?;
    if !out.status.success() && text.is_empty() {
        return None;
    }
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let name = path.to_str().expect("a UTF-8 path");
    Some(text.lines().filter(|l| l.contains(name)).count())
}

#[test]
fn a_snapshot_is_opened_once_by_report_and_whatif() {
    // Judging its kind and converting it read the one open file.
    let snap = fixture("snapshot_small.pickle");
    for command in [&["report"][..], &["whatif"], &["oom"]] {
        let mut args: Vec<&std::ffi::OsStr> = command.iter().map(|c| c.as_ref()).collect();
        args.push(snap.as_os_str());
        let Some(n) = opens_of(&snap, &args) else {
            eprintln!("skipped: strace is not installed here or may not trace");
            return;
        };
        assert_eq!(n, 1, "poolsight {command:?} opened the snapshot {n} times");
    }
}
