//! `--frames` on poolsight's own traces: the frames a foreign caller handed in (Python
//! tracebacks) read as the user's lines by default, as PyTorch's files do, in every command;
//! the frames poolsight makes (scopes, call sites) are kept; `all` shows what was recorded.

use std::path::Path;

use crate::support::{cli, scratch, Outcome};

use poolsight::analyzer::load::{self, FrameFilter, LoadOptions};
use poolsight::recorder::{
    DeviceInfo, ForeignFrame, MemKind, MemRecord, Phase, Recorder, RecorderConfig, ScopeKind,
};

const RUNPY: [(&str, u32, &str); 2] = [
    ("<frozen runpy>", 198, "_run_module_as_main"),
    ("<frozen runpy>", 88, "_run_code"),
];
const SITE: &str = "/usr/lib/python3.11/site-packages";

fn frames<'a>(fs: &'a [(&'a str, u32, &'a str)]) -> Vec<ForeignFrame<'a>> {
    fs.iter()
        .map(|&(file, line, function)| ForeignFrame {
            file,
            line,
            function,
        })
        .collect()
}

/// A run recorded with Python stacks, as `python -m train` records it: allocations under
/// runpy's frames, the user's script and model, PyTorch's module call plumbing; one from a
/// thread with no frame of the user's; one under a link scope. Its device is PyTorch's
/// allocator observed from outside, as `track()` records it.
fn record(path: &Path) {
    record_on(path, true)
}

/// [`record`]'s run on an observed device, or on a pool's (`observed` false: a pool's hooks
/// recorded it, as CuPy's `TraceHook` does).
fn record_on(path: &Path, observed: bool) {
    let config = RecorderConfig {
        devices: vec![DeviceInfo {
            observed,
            ..DeviceInfo::pool(0, "cuda:0", 1 << 30, 1)
        }],
        ..RecorderConfig::default()
    };
    let rec = Recorder::create(path, config).expect("recorder");
    let h = rec.handle();
    let call_impl = format!("{SITE}/torch/nn/modules/module.py");
    let pin = format!("{SITE}/torch/utils/data/_utils/pin_memory.py");
    let main = |line| {
        let mut s = RUNPY.to_vec();
        s.extend([
            ("/home/me/proj/train.py", 90, "<module>"),
            ("/home/me/proj/train.py", line, "main"),
        ]);
        s
    };
    // Two stacks that differ only in PyTorch's plumbing read as one; two lines of `main` stay
    // two; a thread with none of the user's frames reads as no frame at all.
    let mut a = main(70);
    a.extend([
        (call_impl.as_str(), 1747, "_call_impl"),
        ("/home/me/proj/model/net.py", 31, "forward"),
    ]);
    let mut b = main(70);
    b.extend([
        (call_impl.as_str(), 1736, "_wrapped_call_impl"),
        (call_impl.as_str(), 1747, "_call_impl"),
        ("/home/me/proj/model/net.py", 31, "forward"),
    ]);
    let c = main(74);
    let d = [
        ("/usr/lib/python3.11/threading.py", 1016, "_bootstrap"),
        (pin.as_str(), 52, "do_one_step"),
    ];
    let mut ptr = 0x1000;
    let mut malloc = |stack: u32, bytes: u64| {
        h.record_mem(MemRecord {
            ptr,
            bytes,
            stack,
            pmem: ptr as u32,
            ..MemRecord::new(MemKind::MallocPost, 0, 0)
        });
        ptr += 0x10000;
    };
    malloc(h.foreign_stack(&frames(&a), false), 1000);
    malloc(h.foreign_stack(&frames(&b), false), 1000);
    malloc(h.foreign_stack(&frames(&c), false), 2000);
    malloc(h.foreign_stack(&frames(&d), false), 4000);
    let net = h.enter(
        ScopeKind::Link,
        "Net",
        Phase::None,
        "/home/me/proj/model/net.py",
        12,
    );
    let e = [
        (call_impl.as_str(), 1747, "_call_impl"),
        ("/home/me/proj/model/net.py", 40, "forward"),
    ];
    malloc(h.foreign_stack(&frames(&e), true), 8000);
    h.exit(net).expect("exit");
    rec.finish().expect("finish");
}

fn ok(o: Outcome) -> Outcome {
    assert_eq!(o.code, 0, "stdout: {}\nstderr: {}", o.stdout, o.stderr);
    o
}

fn run(args: &[&str], path: &Path) -> String {
    let mut all: Vec<&str> = args.to_vec();
    let p = path.display().to_string();
    all.push(&p);
    ok(cli(&all)).stdout
}

/// Frames of no user's: launchers, PyTorch's plumbing, threads, the user's absolute paths.
const GONE: [&str; 6] = [
    "runpy",
    "_call_impl",
    "_bootstrap",
    "pin_memory",
    "site-packages",
    "/home/me/proj/",
];

#[test]
fn python_frames_read_as_the_users_lines_and_every_frame_with_all() {
    let path = scratch::file("user-frames.pstrace");
    record(&path);
    let user = run(&["lines"], &path);
    // 2 x 1000 B under one line (the plumbing between differs), 2000 B under another line of
    // `main`, 4000 B with no frame of the user's (in `_root` itself), 8000 B under the link.
    assert_eq!(
        user,
        "_root (15.62KB, 0.00B)\n\
         \x20 train.py:90:<module> (3.91KB, 0.00B)\n\
         \x20   train.py:70:main (1.95KB, 0.00B)\n\
         \x20     model/net.py:31:forward (1.95KB, 0.00B)\n\
         \x20   train.py:74:main (1.95KB, 0.00B)\n\
         \x20 /home/me/proj/model/net.py:12:Net (7.81KB, 0.00B)\n\
         \x20   model/net.py:40:forward (7.81KB, 0.00B)\n",
        "{user}"
    );
    for gone in GONE {
        // The link scope keeps the file poolsight recorded for it.
        let shown = user.replace("/home/me/proj/model/net.py:12:Net", "");
        assert!(!shown.contains(gone), "{gone} in\n{user}");
    }
    let all = run(&["lines", "--frames", "all"], &path);
    for kept in [
        "<frozen runpy>:198:_run_module_as_main",
        "_call_impl",
        "pin_memory.py:52",
    ] {
        assert!(all.contains(kept), "{kept} not in\n{all}");
    }
    // The same bytes, however many frames are shown.
    assert_eq!(user.lines().next(), all.lines().next());
    // Python frames are all the viewer's and Python's frames.
    assert_eq!(run(&["lines", "--frames", "viewer"], &path), all);
    assert_eq!(run(&["lines", "--frames", "python"], &path), all);
}

/// A trace of a pool's hooks (poolsight's pool, CuPy's `TraceHook`) reads by default with every
/// frame it recorded, launchers included, as CuPy's `LineProfileHook` prints its tree; the
/// user's frames are asked for with `--frames user`.
#[test]
fn a_pools_trace_reads_as_recorded_unless_asked() {
    let observed = scratch::file("user-frames-observed.pstrace");
    let pool = scratch::file("user-frames-pool.pstrace");
    record_on(&observed, true);
    record_on(&pool, false);
    let recorded = run(&["lines"], &pool);
    assert_eq!(recorded, run(&["lines", "--frames", "all"], &pool));
    assert!(
        recorded.contains("<frozen runpy>:198:_run_module_as_main"),
        "{recorded}"
    );
    assert_eq!(
        run(&["lines", "--frames", "user"], &pool),
        run(&["lines"], &observed)
    );
    assert_ne!(recorded, run(&["lines"], &observed));
}

#[test]
fn the_user_frames_hold_in_every_command() {
    let path = scratch::file("user-frames-commands.pstrace");
    record(&path);
    let dir = scratch::dir();
    let out = |name: &str| dir.join(name).display().to_string();
    let p = path.display().to_string();
    let svg = out("f.svg");
    let html = out("page.html");
    let folded = out("folded.txt");
    let jsonl = out("events.jsonl");
    ok(cli(&["flamegraph", "-o", &svg, &p]));
    ok(cli(&["html", "-o", &html, &p]));
    ok(cli(&["export", "--format", "folded", "-o", &folded, &p]));
    ok(cli(&["export", "--format", "json", "-o", &jsonl, &p]));
    let diff = run(&["diff", "--all", "--format", "json", &p], &path);
    let report = run(&["report"], &path);
    for (what, text) in [
        ("flamegraph", std::fs::read_to_string(&svg).unwrap()),
        ("html", std::fs::read_to_string(&html).unwrap()),
        ("folded", std::fs::read_to_string(&folded).unwrap()),
        ("json", std::fs::read_to_string(&jsonl).unwrap()),
        ("diff", diff),
        ("report", report),
    ] {
        assert!(text.contains("model/net.py"), "{what}: no user line");
        for gone in ["_run_module_as_main", "_call_impl", "pin_memory"] {
            assert!(!text.contains(gone), "{what}: {gone} is shown");
        }
    }
    let folded = std::fs::read_to_string(&folded).unwrap();
    assert!(
        folded.lines().any(
            |l| l == "<module> (train.py:90);main (train.py:70);forward (model/net.py:31) 2000"
        ),
        "{folded}"
    );
    // Dropping frames loses no bytes and counts every event once.
    let info = |frames: &str| {
        let o = ok(cli(&["info", "--format", "json", "--frames", frames, &p])).json();
        (
            o["total_events"].clone(),
            o["pool"]["peak_used_bytes"].clone(),
        )
    };
    assert_eq!(info("user"), info("all"));
}

#[test]
fn the_loading_step_shows_the_frames_it_is_asked_for() {
    let path = scratch::file("user-frames-api.pstrace");
    record(&path);
    let paths_at = |frames| {
        let opts = LoadOptions {
            frames,
            resolver: None,
        };
        let loaded = load::load(&[&path], &opts, &Default::default(), |_| {}).expect("load");
        let tree = &loaded.profiles[0].tree;
        let mut paths: Vec<String> = tree
            .walk()
            .into_iter()
            .map(|(i, _)| {
                tree.path(i)
                    .iter()
                    .map(|f| format!("{}:{}", f.file, f.line))
                    .collect::<Vec<_>>()
                    .join(" > ")
            })
            .collect();
        paths.sort();
        paths
    };
    let user = paths_at(Some(FrameFilter::User));
    assert_eq!(
        paths_at(None),
        user,
        "an observed allocator's trace: the user's frames"
    );
    assert!(user.contains(&"train.py:90 > train.py:70 > model/net.py:31".to_string()));
    // Every user line of the recorded stacks is one of the view's, and no other is.
    let all = paths_at(Some(FrameFilter::All));
    let user_lines = |paths: &[String]| {
        let mut lines: Vec<String> = paths
            .iter()
            .filter_map(|p| p.rsplit(" > ").next())
            .filter(|f| f.contains("proj/") || f.starts_with("train.py") || f.starts_with("model/"))
            .map(|f| f.trim_start_matches("/home/me/proj/").to_owned())
            .collect();
        lines.sort();
        lines.dedup();
        lines
    };
    assert_eq!(user_lines(&user), user_lines(&all));
    assert!(all.len() > user.len());
}

#[test]
fn a_packed_copy_keeps_every_frame_and_reads_the_same() {
    let path = scratch::file("user-frames-live.pstrace");
    record(&path);
    let packed = scratch::file("user-frames-packed.pstrace");
    ok(cli(&[
        "pack",
        &path.display().to_string(),
        "-o",
        &packed.display().to_string(),
    ]));
    for frames in ["user", "all"] {
        assert_eq!(
            run(&["lines", "--frames", frames], &path),
            run(&["lines", "--frames", frames], &packed),
            "--frames {frames}"
        );
    }
}
