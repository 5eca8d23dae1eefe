//! Crash drills: what a recorder must never do to the training run it observes, nor a reader to
//! itself — no signal, no lost acknowledged event, no clobbered file. Each drill failed (most by
//! killing the test process with SIGBUS) before poolsight locked its trace files.

use crate::support::scratch;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use poolsight::analyzer::{tables::info, Trace};
use poolsight::recorder::{MemKind, MemRecord, Recorder, RecorderConfig, RecorderError};

fn config() -> RecorderConfig {
    RecorderConfig {
        chunk_size: 4096,
        calibration: std::time::Duration::from_millis(1),
        ..RecorderConfig::default()
    }
}

fn malloc(i: u64) -> MemRecord {
    MemRecord {
        ptr: i + 1,
        bytes: 512,
        ..MemRecord::new(MemKind::MallocPost, 0, 0)
    }
}

/// Every malloc of a trace, by pointer, in order.
fn mallocs(path: &Path) -> Vec<u64> {
    let t = Trace::open(path).expect("the trace opens");
    let mut out = Vec::new();
    for c in &t.chunks {
        if c.kind == poolsight::analyzer::ChunkKind::Mem {
            out.extend(t.mem_timeline(c).map(|(_, e)| e.ptr()));
        }
    }
    out
}

fn record(path: &Path, n: u64, overwrite: bool) -> Result<(), RecorderError> {
    let rec = Recorder::create(
        path,
        RecorderConfig {
            overwrite,
            ..config()
        },
    )?;
    for i in 0..n {
        rec.record_mem(malloc(i));
    }
    rec.finish().map(|_| ())
}

/// `record()` twice on one path in one process: the second is refused at once, naming this
/// process, and the first records on, to a whole trace. (Before: the second truncated the file
/// and the first died of SIGBUS at its next event.)
#[test]
fn a_second_recording_in_the_same_process_is_refused_and_the_first_goes_on() {
    let path = scratch::file("twice.pstrace");
    let first = Recorder::create(&*path, config()).unwrap();
    for i in 0..5_000 {
        first.record_mem(malloc(i));
    }
    for overwrite in [false, true] {
        let cfg = RecorderConfig {
            overwrite,
            ..config()
        };
        let err = Recorder::create(&*path, cfg).err().expect("refused");
        assert!(
            matches!(err, RecorderError::Busy { pid: Some(p), .. } if p == std::process::id()),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains("is being recorded by this process") && msg.contains("another path"),
            "{msg}"
        );
    }
    for i in 5_000..10_000 {
        first.record_mem(malloc(i));
    }
    let summary = first.finish().unwrap();
    assert_eq!(summary.dropped_events, 0);
    assert_eq!(mallocs(&path), (1..=10_000).collect::<Vec<_>>());
    let t = Trace::open(&*path).unwrap();
    assert!(t.footer.is_some() && t.warnings.is_empty());
}

/// The child of [`a_second_recording_in_another_process_is_refused`]: records until told to
/// stop on stdin, then finishes.
#[test]
#[ignore = "run by a_second_recording_in_another_process_is_refused"]
fn recording_child_entry() {
    use std::io::{BufRead, Write};
    let Some(path) = std::env::var_os("POOLSIGHT_DRILL_CHILD") else {
        return;
    };
    let rec = Recorder::create(PathBuf::from(path), config()).unwrap();
    for i in 0..1_000 {
        rec.record_mem(malloc(i));
    }
    println!("\nCHILD-RECORDING");
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).unwrap();
    for i in 1_000..2_000 {
        rec.record_mem(malloc(i));
    }
    rec.finish().unwrap();
}

/// A rerun while the old job still writes: refused with the old job's pid; the old job
/// finishes normally with all its events.
#[test]
fn a_second_recording_in_another_process_is_refused() {
    use std::io::{BufRead, BufReader, Write};
    let path = scratch::file("rerun.pstrace");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "drills::recording_child_entry",
            "--ignored",
            "--nocapture",
        ])
        .env("POOLSIGHT_DRILL_CHILD", &*path)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert!(lines.any(|l| l.unwrap().trim() == "CHILD-RECORDING"));
    for overwrite in [false, true] {
        let err = record(&path, 10, overwrite).expect_err("refused");
        assert!(
            matches!(err, RecorderError::Busy { pid: Some(p), .. } if p == child.id()),
            "{err:?}"
        );
        assert!(
            err.to_string()
                .contains(&format!("is being recorded by process {}", child.id())),
            "{err}"
        );
    }
    // A reader may look meanwhile: it sees a live trace, and says so.
    let live = Trace::open(&*path).unwrap();
    assert!(live.recording && live.footer.is_none());
    drop(live);
    writeln!(child.stdin.take().unwrap()).unwrap();
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "the recording process ended with {status}"
    );
    assert_eq!(mallocs(&path), (1..=2_000).collect::<Vec<_>>());
    assert!(!Trace::open(&*path).unwrap().recording);
}

/// An existing file is kept unless replacing it was asked for; then the new recording is a new
/// file, and a reader of the old one reads it whole.
#[test]
fn an_existing_file_is_replaced_only_when_asked_and_as_a_new_file() {
    let dir = scratch::dir();
    let notes = dir.join("notes.txt");
    std::fs::write(&notes, "not a trace").unwrap();
    let err = record(&notes, 1, false).err().unwrap();
    assert!(matches!(err, RecorderError::Exists { .. }), "{err:?}");
    assert!(err.to_string().contains("--force"), "{err}");
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "not a trace");

    let path = dir.join("run.pstrace");
    record(&path, 3_000, false).unwrap();
    let old_inode = std::fs::metadata(&path).unwrap().ino();
    let err = record(&path, 10, false).err().unwrap();
    assert!(matches!(err, RecorderError::Exists { .. }), "{err:?}");
    assert_eq!(
        mallocs(&path).len(),
        3_000,
        "the refused recording left the file"
    );

    let old = Trace::open(&path).unwrap();
    record(&path, 10, true).unwrap();
    assert_ne!(std::fs::metadata(&path).unwrap().ino(), old_inode);
    assert_eq!(mallocs(&path), (1..=10).collect::<Vec<_>>());
    // The reader that opened the old file still has all of it.
    let profile = poolsight::analyzer::replay(&old, 0, &Default::default());
    assert_eq!(profile.sources[0].events, 3_000);
    // Nothing is left beside it: no temporary of the replacement.
    let names: Vec<_> = std::fs::read_dir(&*dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
}

/// Not a test: the child of `a_recording_that_cannot_start_leaves_nothing`, run with
/// `--ignored`: with its address space limited to what it uses plus 32 MiB, not even the
/// smallest mapping of a trace can be had, so every recording fails after its file was made.
#[cfg(target_os = "linux")]
#[test]
#[ignore = "child process of a_recording_that_cannot_start_leaves_nothing"]
fn cannot_start_child_entry() {
    let dir = PathBuf::from(std::env::var_os("POOLSIGHT_NO_START_DIR").expect("run by the test"));
    let path = dir.join("small.pstrace");
    crate::support::limit_address_space(32 << 20);
    assert!(Recorder::create(&path, config()).is_err());
    assert!(!path.exists());
    std::fs::write(&path, "keep me").unwrap();
    let replace = RecorderConfig {
        overwrite: true,
        ..config()
    };
    assert!(Recorder::create(&path, replace).is_err());
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "keep me");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
    println!("child done");
}

/// A recording that cannot start leaves nothing at the path, so that the next try is not
/// refused for a file it never wrote; and a file it was to replace stays as it was. (Its
/// mapping is what fails, after the file was made: in a child whose address space is limited.)
#[cfg(target_os = "linux")]
#[test]
fn a_recording_that_cannot_start_leaves_nothing() {
    let dir = scratch::dir();
    let out = crate::support::run_child_test(
        "drills::cannot_start_child_entry",
        &[("POOLSIGHT_NO_START_DIR", dir.as_os_str())],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("child done"),
        "{:?}: {stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("small.pstrace")).unwrap(),
        "keep me"
    );
}

/// Readers open a live trace over and over while the recorder finishes and trims its
/// preallocated tail: a reader whose mapping reaches into the tail would die of SIGBUS if the
/// trim cut it; the trim waits for readers instead, and what they read is consistent.
#[test]
fn readers_of_a_live_trace_survive_its_finish() {
    for round in 0..20 {
        let path = scratch::file("live.pstrace");
        let rec = Recorder::create(&*path, config()).unwrap();
        for i in 0..20_000 {
            rec.record_mem(malloc(i));
        }
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            let readers: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(|| {
                        let mut opened = 0;
                        while !stop.load(std::sync::atomic::Ordering::Relaxed) || opened == 0 {
                            let t = Trace::open(&*path).expect("a live trace opens");
                            // Walk every page of every chunk, as reports do.
                            let r = info::info(&t);
                            assert!(r.events.get("malloc_post").copied().unwrap_or(0) <= 20_000);
                            opened += 1;
                        }
                        opened
                    })
                })
                .collect();
            std::thread::sleep(std::time::Duration::from_millis(5 + round));
            rec.finish().unwrap();
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            for r in readers {
                assert!(r.join().unwrap() > 0);
            }
        });
        let t = Trace::open(&*path).unwrap();
        assert!(t.footer.is_some());
        assert_eq!(mallocs(&path).len(), 20_000);
    }
}

/// A reader that holds the file while the recorder finishes keeps its whole mapping: the
/// recorder leaves the tail rather than cut it, and the file still reads as finished and
/// complete; once no reader holds it, the next recording's finish trims as before.
#[test]
fn a_held_reader_keeps_its_pages_and_the_trace_stays_whole() {
    let path = scratch::file("held.pstrace");
    let rec = Recorder::create(&*path, config()).unwrap();
    for i in 0..1_000 {
        rec.record_mem(malloc(i));
    }
    let held = Trace::open(&*path).unwrap();
    let before = std::fs::metadata(&*path).unwrap().len();
    let summary = rec.finish().unwrap();
    assert!(summary.file_bytes < before);
    assert_eq!(
        std::fs::metadata(&*path).unwrap().len(),
        before,
        "not trimmed"
    );
    let whole = Trace::open(&*path).unwrap();
    assert!(
        whole.footer.is_some() && whole.warnings.is_empty(),
        "{:?}",
        whole.warnings
    );
    assert_eq!(mallocs(&path).len(), 1_000);
    // The held reader's view replays (its mapping is intact).
    let p = poolsight::analyzer::replay(&held, 0, &Default::default());
    assert_eq!(p.sources[0].events, 1_000);
    drop((held, whole));

    let path2 = scratch::file("unheld.pstrace");
    record(&path2, 1_000, false).unwrap();
    let t = Trace::open(&*path2).unwrap();
    assert_eq!(
        std::fs::metadata(&*path2).unwrap().len(),
        t.footer.unwrap().data_end
    );
}

/// The bytes of this process's address space that map `path` (Linux's /proc).
fn mapped_bytes(path: &Path) -> u64 {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let name = path.to_str().unwrap();
    maps.lines()
        .filter(|l| l.ends_with(name))
        .map(|l| {
            let (range, _) = l.split_once(' ').unwrap();
            let (a, b) = range.split_once('-').unwrap();
            u64::from_str_radix(b, 16).unwrap() - u64::from_str_radix(a, 16).unwrap()
        })
        .sum()
}

/// A finished recording that is still referenced (a handle kept, as a notebook keeps a
/// `Recording`) maps only its file's pages, not its size limit: before, each kept a terabyte of
/// address space, and under `ulimit -v` each one kept halved the next one's share. Threads
/// still recording while it finishes and after go on, their events dropped.
#[test]
fn a_finished_recording_kept_maps_only_its_file() {
    let path = scratch::file("kept.pstrace");
    let rec = Recorder::create(&*path, config()).unwrap();
    let handle = rec.handle();
    assert!(
        mapped_bytes(&path) >= 1 << 40,
        "mapped at its size limit while it records"
    );
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let writers: Vec<_> = (0..3)
            .map(|t| {
                let h = handle.clone();
                let stop = &stop;
                s.spawn(move || {
                    let mut i = 0;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        h.record_mem(malloc(t * 1_000_000_000 + i));
                        i += 1;
                    }
                })
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(30));
        rec.finish().unwrap();
        // Writers go on past the finish for a while: nothing of theirs lands anywhere.
        std::thread::sleep(std::time::Duration::from_millis(30));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for w in writers {
            w.join().unwrap();
        }
    });
    let len = std::fs::metadata(&*path).unwrap().len();
    let mapped = mapped_bytes(&path);
    assert!(
        mapped >= len && mapped < len + 4096 * 16,
        "a finished recording maps {mapped} bytes for a file of {len}"
    );
    assert!(
        handle.dropped_events() > 0,
        "events recorded after finish are counted"
    );
    let t = Trace::open(&*path).unwrap();
    assert!(
        t.footer.is_some() && t.warnings.is_empty(),
        "{:?}",
        t.warnings
    );
    drop((t, handle));
    // The preparer thread lets go of its own reference when it sees the stop.
    let start = std::time::Instant::now();
    while mapped_bytes(&path) > 0 && start.elapsed() < std::time::Duration::from_secs(5) {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(mapped_bytes(&path), 0, "let go, it is unmapped");
}

// -- calls that raise ----------------------------------------------------------------------------

use poolsight::analyzer::tables::{functions, lines, timers};
use poolsight::recorder::{Handle, Phase, ScopeKind};

/// A malloc of `bytes` attributed to the scopes open on this thread.
fn alloc(h: &Handle, bytes: u64) {
    h.record_mem(MemRecord {
        ptr: 1,
        bytes,
        stack: h.current_stack(),
        ..MemRecord::new(MemKind::MallocPost, 0, 0)
    });
}

fn analyze(path: &Path) -> poolsight::analyzer::Profile {
    let t = Trace::open(path).unwrap();
    poolsight::analyzer::replay(&t, 0, &Default::default())
}

fn row<'a>(f: &'a functions::Functions, name: &str) -> Option<&'a functions::FunctionRow> {
    f.functions.iter().find(|r| r.name == name)
}

/// The names of the line tree, each with its depth, in order.
fn tree(l: &lines::Lines) -> Vec<(usize, String)> {
    fn walk(n: &[lines::LineNode], depth: usize, out: &mut Vec<(usize, String)>) {
        for c in n {
            out.push((depth, c.function.clone()));
            walk(&c.children, depth + 1, out);
        }
    }
    let mut out = Vec::new();
    walk(&l.root.children, 1, &mut out);
    out
}

/// The three ways a Rust caller's scope ends without completing — a panic unwinding through
/// its guard, a guard marked failed, a token aborted — each leave no call of their function,
/// keep their bytes in the enclosing call, and leave nothing nested under them.
#[test]
fn a_scope_that_raised_is_not_a_call() {
    for how in ["panic", "fail", "abort"] {
        let path = scratch::file("raised.pstrace");
        let rec = Recorder::create(&*path, config()).unwrap();
        let h = rec.handle();
        {
            let _outer = h.function("Outer", Phase::Forward);
            // Completes: 1024 bytes.
            {
                let _f = h.function("Linear", Phase::Forward);
                alloc(&h, 1024);
            }
            // Raises after 4096 bytes, 512 of them in a nested call that completed.
            match how {
                "panic" => {
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        let _f = h.function("Linear", Phase::Forward);
                        alloc(&h, 3584);
                        {
                            let _g = h.function("ReLU", Phase::Forward);
                            alloc(&h, 512);
                        }
                        panic!("shape mismatch");
                    }));
                    assert!(r.is_err());
                }
                "fail" => {
                    let f = h.function("Linear", Phase::Forward);
                    alloc(&h, 3584);
                    {
                        let _g = h.function("ReLU", Phase::Forward);
                        alloc(&h, 512);
                    }
                    f.fail();
                }
                _ => {
                    let t = h.enter(ScopeKind::Function, "Linear", Phase::Forward, "m.py", 3);
                    alloc(&h, 3584);
                    let g = h.enter(ScopeKind::Function, "ReLU", Phase::Forward, "m.py", 4);
                    alloc(&h, 512);
                    h.exit(g).unwrap();
                    h.abort(t).unwrap();
                }
            }
            // After the exception: a sibling, not a child of the dead call.
            {
                let _f = h.function("Softmax", Phase::Forward);
                alloc(&h, 2048);
            }
        }
        // A function whose only call raised has no row at all.
        let t = h.enter(ScopeKind::Function, "Embed", Phase::Forward, "m.py", 9);
        alloc(&h, 8192);
        h.abort(t).unwrap();
        drop(h);
        rec.finish().unwrap();

        let p = analyze(&path);
        let f = functions::functions(&p);
        let linear = row(&f, "Linear").unwrap();
        assert_eq!(
            (linear.used_bytes, linear.occurrence, linear.self_used_bytes),
            (1024, 1, 1024),
            "{how}"
        );
        let relu = row(&f, "ReLU").unwrap();
        assert_eq!((relu.used_bytes, relu.occurrence), (512, 1), "{how}");
        let outer = row(&f, "Outer").unwrap();
        // The outer call keeps everything, and the raising call's own 3584 bytes count as its
        // exclusive bytes now.
        assert_eq!(
            (outer.used_bytes, outer.occurrence, outer.self_used_bytes),
            (1024 + 3584 + 512 + 2048, 1, 3584),
            "{how}"
        );
        assert!(row(&f, "Embed").is_none(), "{how}: {f:?}");
        let t = timers::timers(&p);
        let linear_t = t.functions.iter().find(|r| r.name == "Linear").unwrap();
        assert_eq!(linear_t.occurrence, 1, "{how}");
        assert!(t.functions.iter().all(|r| r.name != "Embed"), "{how}");
        // Softmax sits beside Linear under Outer, not inside the call that raised.
        let l = tree(&lines::lines(&p, 0));
        let depth = |name: &str| l.iter().find(|(_, n)| n == name).map(|(d, _)| *d);
        assert_eq!(depth("Softmax"), depth("Linear"), "{how}: {l:?}");
        assert_eq!(depth("Outer"), Some(1), "{how}: {l:?}");
        assert_eq!(depth("Embed"), Some(1), "{how}: {l:?}");
    }
}

// -- partial traces --------------------------------------------------------------------------

/// The child of [`a_killed_trace_says_so_everywhere_and_counts_agree`]: records a little of
/// everything (zero-byte mallocs and their frees among it), then waits to be killed.
#[test]
#[ignore = "run by a_killed_trace_says_so_everywhere_and_counts_agree"]
fn killed_child_entry() {
    use std::io::Write;
    let Some(path) = std::env::var_os("POOLSIGHT_DRILL_KILLED") else {
        return;
    };
    let rec = Recorder::create(PathBuf::from(path), config()).unwrap();
    let h = rec.handle();
    h.epoch_begin(1);
    for i in 0..3_000u64 {
        let _f = h.function("Linear", poolsight::recorder::Phase::Forward);
        let bytes = if i % 3 == 0 { 0 } else { 512 };
        let ptr = if bytes == 0 { 0 } else { i + 1 };
        let stack = h.current_stack();
        for kind in [MemKind::MallocPost, MemKind::AllocPost] {
            h.record_mem(MemRecord {
                ptr,
                bytes,
                stack,
                ..MemRecord::new(kind, 0, 0)
            });
        }
        for kind in [MemKind::FreePost, MemKind::Release] {
            h.record_mem(MemRecord {
                ptr,
                bytes,
                ..MemRecord::new(kind, 0, 0)
            });
        }
    }
    h.epoch_end(1);
    // The last event of the run is a mark: the duration must reach it.
    std::thread::sleep(std::time::Duration::from_millis(50));
    h.record_mark(poolsight::recorder::MarkKind::CpuSample, 0, 1, 0);
    println!("recorded");
    std::io::stdout().flush().unwrap();
    std::thread::sleep(std::time::Duration::from_secs(60));
}

fn cli(args: &[&str]) -> (i32, String, String) {
    let o = crate::support::cli(args);
    (o.code, o.stdout, o.stderr)
}

/// A run killed mid-way: every command that reads it says so in one stderr line, and `info`,
/// `report` and `pack` agree on its events, its duration and its counts (a zero-byte malloc is
/// a malloc, as its free is a free).
#[test]
fn a_killed_trace_says_so_everywhere_and_counts_agree() {
    use std::io::{BufRead, BufReader};
    let dir = scratch::dir();
    let path = dir.join("killed.pstrace");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "drills::killed_child_entry",
            "--ignored",
            "--nocapture",
        ])
        .env("POOLSIGHT_DRILL_KILLED", &path)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert!(lines.any(|l| l.unwrap().contains("recorded")));
    child.kill().unwrap();
    child.wait().unwrap();

    let p = path.to_str().unwrap();
    let (code, info, err) = cli(&["info", "--format", "json", p]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("unfinished"), "{err}");
    let info: serde_json::Value = serde_json::from_str(&info).unwrap();
    assert_eq!(info["finished"], false);
    assert_eq!(info["recording"], false);
    let (code, report, err) = cli(&["report", "--format", "json", p]);
    assert_eq!(code, 0, "{err}");
    let warnings: Vec<&str> = err.lines().collect();
    assert_eq!(warnings.len(), 1, "{err}");
    assert!(
        warnings[0].starts_with("poolsight: warning: ") && warnings[0].contains("unfinished"),
        "{err}"
    );
    let report: serde_json::Value = serde_json::from_str(&report).unwrap();
    let s = &report["summary"];
    assert_eq!(s["events"], info["total_events"]);
    assert_eq!(s["duration_ns"], info["duration_ns"]);
    assert!(s["duration_ns"].as_u64().unwrap() >= 50_000_000, "{s}");
    let pool = &info["pool"];
    assert_eq!(pool["mallocs"], 3_000);
    assert_eq!(pool["frees"], 3_000);
    assert_eq!(pool["device_allocs"], 3_000);
    assert_eq!(pool["releases"], 3_000);
    assert_eq!(s["total_allocations"], 3_000);

    let packed = dir.join("killed.packed.pstrace");
    let (code, out, err) = cli(&["pack", p, "-o", packed.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        out.contains(&format!("{} events", info["total_events"])),
        "{out}"
    );
    // The Parquet dataset refuses a partial run unless told, and then counts as info does.
    let ds = dir.join("dataset");
    let ds_arg = ds.to_str().unwrap();
    let (code, _, err) = cli(&["export", "--format", "parquet", "-o", ds_arg, p]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("incomplete") && err.contains("--allow-incomplete"),
        "{err}"
    );
    let args = ["export", "--format", "parquet", "--tables", "summary"];
    let (code, _, err) = cli(&[&args[..], &["--allow-incomplete", "-o", ds_arg, p]].concat());
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        err.lines().filter(|l| l.contains("unfinished")).count(),
        1,
        "{err}"
    );
    assert!(
        err.contains(&format!("{} events", info["total_events"])),
        "{err}"
    );
    for args in [
        vec!["functions"],
        vec!["lines"],
        vec!["timers"],
        vec!["epochs"],
        vec!["flamegraph", "-o"],
        vec!["html", "-o"],
        vec!["export", "--format", "chrome", "-o"],
    ] {
        let mut args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        if args.last().is_some_and(|a| a == "-o") {
            args.push(dir.join("out").to_string_lossy().into_owned());
        }
        args.push(p.to_owned());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, _, err) = cli(&args);
        assert_eq!(code, 0, "{args:?}: {err}");
        let unfinished = err.lines().filter(|l| l.contains("unfinished")).count();
        assert_eq!(unfinished, 1, "{args:?}: {err}");
    }
}

// -- deep trees ------------------------------------------------------------------------------

/// A recursion 100,000 scopes deep (a recursive model, or a runaway one): every report comes
/// out of the Rust library on a thread with the default 2 MiB stack, as a library or binding
/// caller's threads have — not only on the CLI's 64 MiB workers.
#[test]
fn reports_of_a_100000_deep_stack_run_on_a_default_thread() {
    let path = scratch::file("deep.pstrace");
    {
        let rec = Recorder::create(&*path, config()).unwrap();
        let h = rec.handle();
        let mut tokens = Vec::new();
        for i in 0..100_000u32 {
            let kind = if i % 2 == 0 {
                ScopeKind::Function
            } else {
                ScopeKind::Link
            };
            tokens.push(h.enter(kind, "Recurse", Phase::Forward, "deep.py", i % 7));
        }
        alloc(&h, 4096);
        for t in tokens.into_iter().rev() {
            h.exit(t).unwrap();
        }
        drop(h);
        rec.finish().unwrap();
    }
    let deep_path = path.to_path_buf();
    let path = deep_path.clone();
    let worker = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || {
            use poolsight::analyzer::diff;
            use poolsight::analyzer::tables::{epochs, Report};
            use poolsight::analyzer::views::{flamegraph, html};
            let t = Trace::open(&path).unwrap();
            let p = poolsight::analyzer::replay(&t, 0, &Default::default());
            let f = functions::functions(&p);
            assert_eq!(row(&f, "Recurse").unwrap().occurrence, 50_000);
            let l = lines::lines(&p, 0);
            let table = lines::render_table(&l);
            assert!(table.contains("4.00KB"));
            // 256 levels nested, the rest folded into one line holding their bytes.
            assert_eq!(table.lines().count(), 1 + lines::MAX_NESTING + 1);
            assert!(
                table.contains(&format!("{} (4.00KB, 0.00B)", lines::FOLDED)),
                "{table}"
            );
            assert!(!lines::render_csv(&l).is_empty());
            assert!(serde_json::to_string(&l).unwrap().contains("Recurse"));
            let tm = timers::timers(&p);
            assert_eq!(tm.links[0].occurrence, 50_000);
            let r = Report::compute(&p, &Default::default());
            assert!(!r.render_table(&Default::default()).is_empty());
            assert!(serde_json::to_string(&r).unwrap().len() > 1000);
            assert!(!epochs::render_table(&r.epochs).is_empty());
            let folded = flamegraph::folded(&p, flamegraph::Metric::Used);
            assert_eq!(folded.len(), 1);
            assert!(
                !flamegraph::flamegraph_svg(&p, flamegraph::Metric::Used, "deep")
                    .unwrap()
                    .is_empty()
            );
            let figs = diff::Figures::of(&r);
            let d = diff::compare(
                std::slice::from_ref(&figs),
                std::slice::from_ref(&figs),
                &[],
            );
            assert!(d.violations.is_empty());
            let page =
                html::report_page("deep", std::slice::from_ref(&t), std::slice::from_ref(&p));
            assert!(page.len() > 1000);
            let out = scratch::dir();
            let opts = poolsight::analyzer::export::dataset::ExportOptions {
                tables: poolsight::analyzer::export::dataset::Tables::Summary,
                run_id: None,
                progress: None,
            };
            poolsight::analyzer::export::dataset::export(std::slice::from_ref(&t), &out, &opts)
                .unwrap();
            let mut chrome = Vec::new();
            poolsight::analyzer::export::chrome(&[(&t, &p)], &mut chrome).unwrap();
        })
        .unwrap();
    worker
        .join()
        .expect("the reports ran within a default thread stack");
    // And the CLI, whose workers have rayon's default stacks too.
    for cmd in ["report", "lines", "functions", "timers"] {
        let (code, out, err) = cli(&[cmd, "--format", "json", deep_path.to_str().unwrap()]);
        assert_eq!(code, 0, "{cmd}: {err}");
        assert!(out.contains("Recurse"), "{cmd}");
    }
}

/// A process forked while recording (a `DataLoader`'s workers) records nothing into its parent's
/// trace, even when it records, interns and finishes: before, its events landed on the parent's
/// chunks (half of them lost), and its `finish` cut the file short under the parent, which then
/// died of SIGBUS at its next chunk.
#[test]
fn a_forked_child_leaves_its_parents_trace_alone() {
    use poolsight::recorder::{Frame, FrameKind};
    let dir = scratch::dir();
    let path = dir.join("t.pstrace");
    let rec = Recorder::create(&path, config()).unwrap();
    for i in 0..100 {
        rec.record_mem(malloc(i));
    }
    // SAFETY: the child records, interns, finishes its copy of the recorder and leaves with
    // _exit: no test harness code runs there.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        for i in 0..20_000 {
            rec.record_mem(malloc(1_000_000 + i));
        }
        rec.intern_frames(&[Frame {
            kind: FrameKind::Function,
            phase: Phase::None,
            file: "child.py".into(),
            line: 1,
            name: "child_only".into(),
        }]);
        let dropped = rec.dropped_events();
        let finished = rec.finish();
        let ok = dropped == 20_000 && matches!(finished, Ok(s) if s.forked && s.file_bytes == 0);
        // SAFETY: leaves the child without running anything of the parent's.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: waits for the child made above.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child did not drop its events, or finished the file: {status}"
    );
    for i in 100..30_000 {
        rec.record_mem(malloc(i));
    }
    let summary = rec.finish().unwrap();
    assert_eq!((summary.dropped_events, summary.forked), (0, false));
    let t = Trace::open(&path).unwrap();
    assert!(t.warnings.is_empty(), "{:?}", t.warnings);
    assert_eq!(mallocs(&path), (1..=30_000).collect::<Vec<u64>>());
    assert!(!t
        .defs
        .strings
        .values()
        .any(|s| s == "child_only" || s == "child.py"));
}
