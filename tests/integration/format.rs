//! The trace format end to end: record with the writer, read with the analyzer's reader.

use crate::support::scratch;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use poolsight::analyzer::{tables::info, ChunkInfo, ChunkKind, Trace};
use poolsight::recorder::{
    DeviceInfo, Frame, FrameKind, MarkKind, MemKind, MemRecord, Mode, Phase, Recorder,
    RecorderConfig,
};
use poolsight::schema::fb;

fn tmp(name: &str) -> scratch::Scratch {
    scratch::file(name)
}

fn small_config() -> RecorderConfig {
    RecorderConfig {
        chunk_size: 4096,
        calibration: std::time::Duration::from_millis(1),
        ..RecorderConfig::default()
    }
}

fn mem(kind: MemKind, ptr: u64, bytes: u64) -> MemRecord {
    MemRecord {
        kind,
        device: 3,
        stream: 7,
        ptr,
        bytes,
        stack: 0,
        pmem: 9,
    }
}

fn all_mem(trace: &Trace) -> Vec<(u32, fb::MemEvent)> {
    let mut out = Vec::new();
    for c in trace.chunks.iter().filter(|c| c.kind == ChunkKind::Mem) {
        for (_, e) in trace.mem_timeline(c) {
            out.push((c.thread, e));
        }
    }
    out
}

#[test]
fn every_event_kind_round_trips() {
    let path = tmp("kinds.pstrace");
    let rec = Recorder::create(
        &path,
        RecorderConfig {
            rank: Some(1),
            world_size: Some(4),
            devices: vec![DeviceInfo::pool(0, "host", 1 << 30, 512)],
            ..small_config()
        },
    )
    .unwrap();
    let h = rec.handle();
    let kinds = [
        MemKind::MallocPre,
        MemKind::MallocPost,
        MemKind::AllocPre,
        MemKind::AllocPost,
        MemKind::FreePre,
        MemKind::FreePost,
        MemKind::Release,
        MemKind::OutOfMemory,
        MemKind::LimitSet,
    ];
    let frame = h.intern_frame(&Frame {
        kind: FrameKind::Function,
        phase: Phase::Backward,
        file: "model.py".into(),
        line: 42,
        name: "LinearFunction".into(),
    });
    let stack = h.intern_stack(0, frame);
    for (i, k) in kinds.iter().enumerate() {
        h.record_mem(MemRecord {
            stack,
            ..mem(*k, 0x1000 + i as u64, 512 * (i as u64 + 1))
        });
    }
    let start = poolsight::recorder::writer::now_ticks();
    h.record_scope(stack, start);
    h.record_mark(MarkKind::EpochBegin, 1, 100, 0);
    h.record_mark(MarkKind::EpochEnd, 1, 150, 175);
    h.record_mark(MarkKind::CpuSample, 0, 123, 0);
    h.define_device(DeviceInfo::pool(1, "second", 2 << 30, 512));
    let summary = rec.finish().unwrap();
    assert_eq!(summary.events, 9 + 1 + 3);
    assert_eq!(summary.dropped_events, 0);

    let trace = Trace::open(&path).unwrap();
    assert!(trace.warnings.is_empty(), "{:?}", trace.warnings);
    assert!(trace.footer.is_some());
    assert_eq!(trace.header.rank, Some(1));
    assert_eq!(trace.header.world_size, Some(4));
    let events = all_mem(&trace);
    assert_eq!(events.len(), kinds.len());
    for (i, ((_, e), k)) in events.iter().zip(kinds).enumerate() {
        assert_eq!(e.kind(), k.into());
        assert_eq!(e.ptr(), 0x1000 + i as u64);
        assert_eq!(e.bytes(), 512 * (i as u64 + 1));
        assert_eq!(
            (e.device(), e.stream(), e.stack(), e.pmem()),
            (3, 7, stack, 9)
        );
    }
    let (parent, fid) = trace.defs.stacks[&stack];
    assert_eq!(parent, 0);
    let f = trace.defs.frames[&fid];
    assert_eq!(trace.defs.string(f.file), "model.py");
    assert_eq!(trace.defs.string(f.name), "LinearFunction");
    assert_eq!(
        (f.kind, f.phase, f.line),
        (FrameKind::Function.into(), Phase::Backward.into(), 42)
    );
    let marks: Vec<_> = trace
        .chunks
        .iter()
        .filter(|c| c.kind == ChunkKind::Mark)
        .flat_map(|c| trace.mark_events(c))
        .collect();
    assert_eq!(marks.len(), 3);
    assert_eq!(
        (marks[1].kind(), marks[1].aux(), marks[1].a(), marks[1].b()),
        (MarkKind::EpochEnd.into(), 1, 150, 175)
    );
    let info = info::info(&trace);
    assert_eq!(info.events["function"], 1);
    assert_eq!(info.events["out_of_memory"], 1);
    assert_eq!(info.events["epoch_end"], 1);
    assert_eq!(info.devices.len(), 2);
    assert_eq!(info.threads.len(), 1);
    assert!(info.finished);
}

#[test]
fn timestamps_survive_long_gaps_via_rebase() {
    let path = tmp("rebase.pstrace");
    let rec = Recorder::create(&path, small_config()).unwrap();
    let h = rec.handle();
    h.record_mem(mem(MemKind::MallocPost, 1, 512));
    // 2^32 ticks is about 1.4 s at 3 GHz: sleep past it so the delta cannot fit.
    let gap = (u32::MAX as f64 / h.ticks_per_ns()) as u64 + 50_000_000;
    std::thread::sleep(std::time::Duration::from_nanos(gap));
    h.record_mem(mem(MemKind::FreePost, 1, 512));
    rec.finish().unwrap();
    let trace = Trace::open(&path).unwrap();
    let c = trace
        .chunks
        .iter()
        .find(|c| c.kind == ChunkKind::Mem)
        .unwrap();
    let ticks: Vec<u64> = trace.mem_timeline(c).map(|(t, _)| t).collect();
    assert_eq!(ticks.len(), 2);
    let ns = trace.ticks_to_ns(ticks[1] - ticks[0]);
    assert!(
        ns >= gap && ns < gap + 2_000_000_000,
        "gap {gap} ns read back as {ns}"
    );
}

#[test]
fn eight_threads_lose_and_duplicate_nothing() {
    const THREADS: u64 = 8;
    const PER_THREAD: u64 = 1_000_000;
    let path = tmp("threads.pstrace");
    let rec = Recorder::create(&path, RecorderConfig::default()).unwrap();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let h = rec.handle();
            s.spawn(move || {
                for i in 0..PER_THREAD {
                    h.record_mem(mem(MemKind::MallocPost, (t << 32) | i, 512));
                }
            });
        }
    });
    let summary = rec.finish().unwrap();
    assert_eq!(summary.events, THREADS * PER_THREAD);
    let trace = Trace::open(&path).unwrap();
    assert!(trace.warnings.is_empty(), "{:?}", trace.warnings);
    let mut seen = vec![vec![false; PER_THREAD as usize]; THREADS as usize];
    let mut by_writer_thread: HashMap<u32, u64> = HashMap::new();
    for c in trace.chunks.iter().filter(|c| c.kind == ChunkKind::Mem) {
        assert!(c.sealed);
        for e in trace.mem_events(c) {
            let (t, i) = ((e.ptr() >> 32) as usize, (e.ptr() & 0xffff_ffff) as usize);
            assert!(!seen[t][i], "event {i} of thread {t} read twice");
            seen[t][i] = true;
            *by_writer_thread.entry(c.thread).or_default() += 1;
        }
    }
    for (t, s) in seen.iter().enumerate() {
        let missing = s.iter().filter(|x| !**x).count();
        assert_eq!(missing, 0, "thread {t} lost {missing} events");
    }
    assert_eq!(by_writer_thread.len(), THREADS as usize);
    assert!(by_writer_thread.values().all(|&n| n == PER_THREAD));
}

#[test]
fn ring_mode_keeps_exactly_the_newest_chunks() {
    let path = tmp("ring.pstrace");
    let slots = 4;
    let rec = Recorder::create(
        &path,
        RecorderConfig {
            mode: Mode::Ring { slots },
            ..small_config()
        },
    )
    .unwrap();
    let h = rec.handle();
    let total = 2_000u64; // about 16 chunks of 4 KiB
    for i in 0..total {
        h.record_mem(mem(MemKind::MallocPost, i, 512));
    }
    rec.finish().unwrap();
    let trace = Trace::open(&path).unwrap();
    assert!(trace.warnings.is_empty(), "{:?}", trace.warnings);
    let mem_chunks: Vec<_> = trace
        .chunks
        .iter()
        .filter(|c| c.kind == ChunkKind::Mem)
        .collect();
    assert_eq!(mem_chunks.len(), slots as usize);
    // Reserved in order, so the newest chunks have consecutive sequence numbers.
    for w in mem_chunks.windows(2) {
        assert_eq!(w[1].seq, w[0].seq + 1);
    }
    let ids: Vec<u64> = all_mem(&trace).iter().map(|(_, e)| e.ptr()).collect();
    assert!(ids.len() < total as usize);
    let first = total - ids.len() as u64;
    assert_eq!(
        ids,
        (first..total).collect::<Vec<_>>(),
        "not the newest events, in order"
    );
    let per_chunk = mem_chunks[0].events as u64;
    assert_eq!(
        ids.len() as u64,
        per_chunk * (slots as u64 - 1) + mem_chunks[3].events as u64
    );
}

/// Not a test: the child process of `sigkill_loses_nothing_recorded_before_the_kill`, which
/// runs it with `--ignored` and the trace path in the environment.
#[test]
#[ignore = "child process of the SIGKILL test"]
fn sigkill_child_entry() {
    let path = std::env::var_os("POOLSIGHT_KILL_CHILD").expect("run by the SIGKILL test");
    use std::io::Write;
    let rec = Recorder::create(PathBuf::from(path), small_config()).unwrap();
    let h = rec.handle();
    let mut stdout = std::io::stdout();
    for i in 0u64.. {
        h.record_mem(mem(MemKind::MallocPost, i, 512));
        if i % 1000 == 999 {
            // Everything up to i is recorded before the parent can read this line.
            let _ = writeln!(stdout, "{}", i + 1);
            let _ = stdout.flush();
        }
    }
}

#[test]
fn sigkill_loses_nothing_recorded_before_the_kill() {
    use std::io::{BufRead, BufReader};
    let path = tmp("killed.pstrace");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "format::sigkill_child_entry",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("POOLSIGHT_KILL_CHILD", &path)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut acknowledged = 0u64;
    while acknowledged < 200_000 {
        match lines.next() {
            Some(Ok(l)) => {
                if let Ok(n) = l.trim().parse::<u64>() {
                    acknowledged = n;
                }
            }
            _ => panic!("child stopped early"),
        }
    }
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let status = child.wait().unwrap();
    assert!(!status.success());

    let trace = Trace::open(&path).unwrap();
    assert!(
        trace.footer.is_none(),
        "a killed writer cannot have sealed the file"
    );
    let ids: Vec<u64> = all_mem(&trace).iter().map(|(_, e)| e.ptr()).collect();
    assert!(
        ids.len() as u64 >= acknowledged,
        "read {} events, child had recorded at least {acknowledged}",
        ids.len()
    );
    assert_eq!(
        ids,
        (0..ids.len() as u64).collect::<Vec<_>>(),
        "events missing or out of order"
    );
    let info = info::info(&trace);
    assert!(!info.finished);
    assert_eq!(info.events["malloc_post"], ids.len() as u64);
}

fn small_trace(path: &Path) -> Vec<u8> {
    let rec = Recorder::create(path, small_config()).unwrap();
    let h = rec.handle();
    let frame = h.intern_frame(&Frame {
        kind: FrameKind::Link,
        phase: Phase::None,
        file: "train.rs".into(),
        line: 7,
        name: "MLP".into(),
    });
    let stack = h.intern_stack(0, frame);
    for i in 0..300u64 {
        h.record_mem(MemRecord {
            stack,
            ..mem(MemKind::MallocPost, i, 512)
        });
        h.record_scope(stack, poolsight::recorder::writer::now_ticks());
    }
    h.record_mark(MarkKind::EpochBegin, 1, 0, 0);
    rec.finish().unwrap();
    std::fs::read(path).unwrap()
}

fn event_bytes(trace: &Trace) -> Vec<(u64, Vec<u8>)> {
    trace
        .chunks
        .iter()
        .flat_map(|c| {
            let bytes: Vec<u8> = match c.kind {
                ChunkKind::Mem => trace.mem_events(c).iter().flat_map(|e| e.0).collect(),
                ChunkKind::Scope => trace.scope_events(c).iter().flat_map(|e| e.0).collect(),
                ChunkKind::Mark => trace.mark_events(c).iter().flat_map(|e| e.0).collect(),
                _ => Vec::new(),
            };
            (!bytes.is_empty()).then_some((c.offset, bytes))
        })
        .collect()
}

#[test]
fn truncation_at_every_offset_gives_partial_results_or_a_clear_error() {
    let path = tmp("full.pstrace");
    let full = small_trace(&path);
    let whole = Trace::open(&path).unwrap();
    assert!(whole.warnings.is_empty());
    let whole_events = event_bytes(&whole);
    let cut_path = tmp("cut.pstrace");
    let mut errors = 0;
    for len in 0..full.len() {
        std::fs::write(&cut_path, &full[..len]).unwrap();
        match Trace::open(&cut_path) {
            Err(e) => {
                errors += 1;
                let msg = e.to_string();
                assert!(
                    !msg.contains('\n') && msg.contains("cut.pstrace"),
                    "unclear error: {msg}"
                );
            }
            Ok(t) => {
                assert!(
                    !t.warnings.is_empty(),
                    "a {len}-byte cut of a {}-byte trace read without a warning",
                    full.len()
                );
                // Whatever is read is exactly what was written.
                for (off, bytes) in event_bytes(&t) {
                    let orig = whole_events
                        .iter()
                        .find(|(o, _)| *o == off)
                        .expect("chunk exists in the whole trace");
                    assert!(orig.1.starts_with(&bytes));
                }
                let _ = info::info(&t);
            }
        }
    }
    assert!(errors > 0 && errors < full.len());
}

/// Writes [`small_trace`] to `path` with one bit pattern flipped inside the `bytes` field of
/// the `event`th event of its first sealed memory chunk; returns that chunk as it was.
fn corrupt_one_mem_event(path: &Path, event: usize, flip: u8) -> ChunkInfo {
    let mut bytes = small_trace(path);
    let whole = Trace::open(path).unwrap();
    let c = *whole
        .chunks
        .iter()
        .find(|c| c.kind == ChunkKind::Mem && c.sealed)
        .unwrap();
    let e = &whole.mem_events(&c)[event];
    let at = e.0.as_ptr() as usize - whole.bytes().as_ptr() as usize + 16; // inside `bytes`
    drop(whole);
    bytes[at] ^= flip;
    std::fs::write(path, &bytes).unwrap();
    c
}

#[test]
fn a_corrupted_event_fails_its_chunk_checksum() {
    let path = tmp("corrupt.pstrace");
    let c = corrupt_one_mem_event(&path, 5, 0x40);
    let t = Trace::open(&path).unwrap();
    assert!(
        t.warnings
            .iter()
            .any(|w| w.offset == c.offset && w.what.contains("checksum")),
        "{:?}",
        t.warnings
    );
    assert!(
        t.chunks.iter().all(|x| x.offset != c.offset),
        "the corrupt chunk must not be read"
    );
}

#[test]
fn foreign_and_future_files_are_refused_clearly() {
    let path = tmp("foreign.pstrace");
    std::fs::write(&path, b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR and so on").unwrap();
    let msg = Trace::open(&path).err().unwrap().to_string();
    assert!(msg.contains("not a poolsight trace"), "{msg}");

    let mut bytes = small_trace(&tmp("future.pstrace"));
    bytes[8] = 9; // major version 9
    std::fs::write(&path, &bytes).unwrap();
    let msg = Trace::open(&path).err().unwrap().to_string();
    assert!(
        msg.contains(&format!(
            "format 9.{} is not supported",
            poolsight::schema::FORMAT_MINOR
        )),
        "{msg}"
    );

    let missing = Trace::open(tmp("does-not-exist.pstrace"))
        .err()
        .unwrap()
        .to_string();
    assert!(missing.contains("No such file"), "{missing}");
}

#[test]
fn unwritable_path_is_a_clear_create_error() {
    let err = Recorder::create("/proc/definitely/not/here.pstrace", small_config())
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.starts_with("cannot create trace file /proc/definitely/not/here.pstrace"),
        "{err}"
    );
}

#[test]
fn a_full_file_stops_recording_and_counts_what_it_drops() {
    let path = tmp("full-disk.pstrace");
    let rec = Recorder::create(
        &path,
        RecorderConfig {
            max_bytes: 64 << 10,
            ..small_config()
        },
    )
    .unwrap();
    let h = rec.handle();
    let n = 10_000u64;
    for i in 0..n {
        h.record_mem(mem(MemKind::MallocPost, i, 512));
    }
    let summary = rec.finish().unwrap();
    assert!(summary.dropped_events > 0);
    let trace = Trace::open(&path).unwrap();
    let read = all_mem(&trace).len() as u64;
    assert_eq!(
        read + summary.dropped_events,
        n,
        "every event is either in the file or counted as dropped"
    );
    assert_eq!(trace.footer.unwrap().dropped_events, summary.dropped_events);
}

/// The layout docs/format.md describes: header checksum before `data_offset`, the footer slot at
/// `data_offset`, the ring slots right after it, `align8(chunk_size)` bytes apart.
#[test]
fn footer_slot_and_ring_slots_sit_where_the_format_says() {
    use poolsight::schema::{align8, header_crc, Prelude, HEADER_CRC_LEN};
    let path = tmp("layout.pstrace");
    let slots = 4u32;
    let rec = Recorder::create(
        &path,
        RecorderConfig {
            mode: Mode::Ring { slots },
            ..small_config()
        },
    )
    .unwrap();
    let h = rec.handle();
    for i in 0..2_000u64 {
        h.record_mem(mem(MemKind::MallocPost, i, 512));
    }
    rec.finish().unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let data_offset = Prelude::decode(&bytes).unwrap().data_offset as usize;
    assert_eq!(data_offset % 8, 0);
    let crc_at = data_offset - HEADER_CRC_LEN;
    assert_eq!(
        u32::from_le_bytes(bytes[crc_at..data_offset].try_into().unwrap()),
        header_crc(&bytes[..crc_at])
    );
    let trace = Trace::open(&path).unwrap();
    assert!(trace.warnings.is_empty(), "{:?}", trace.warnings);
    let footer = trace
        .chunks
        .iter()
        .find(|c| c.kind == ChunkKind::Footer)
        .unwrap();
    assert_eq!(footer.offset, data_offset as u64);
    assert_eq!((footer.seq, footer.sealed), (0, true));
    let ring_start = align8(footer.offset + footer.len as u64);
    let slot_len = align8(4096);
    let mut ring: Vec<u64> = trace
        .chunks
        .iter()
        .filter(|c| c.kind == ChunkKind::Mem)
        .map(|c| c.offset)
        .collect();
    ring.sort();
    let want: Vec<u64> = (0..slots as u64)
        .map(|i| ring_start + i * slot_len)
        .collect();
    assert_eq!(ring, want);
    // The footer counts every chunk reserved, itself excluded; seqs are 1..=chunks.
    let f = trace.footer.unwrap();
    let max_seq = trace.chunks.iter().map(|c| c.seq).max().unwrap();
    assert_eq!(f.chunks, max_seq);
}

/// Not a test: the child of `the_file_size_limit_is_a_size_cap`, run with `--ignored`, the
/// limit set by itself, the trace path and the case in the environment.
#[test]
#[ignore = "child process of the RLIMIT_FSIZE test"]
fn fsize_child_entry() {
    let path = std::env::var_os("POOLSIGHT_FSIZE_CHILD").expect("run by the RLIMIT_FSIZE test");
    let limit: u64 = std::env::var("POOLSIGHT_FSIZE_LIMIT")
        .unwrap()
        .parse()
        .unwrap();
    let lim = libc::rlimit {
        rlim_cur: limit as libc::rlim_t,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit on this (child) process with a struct we own.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_FSIZE, &lim) }, 0);
    match Recorder::create(PathBuf::from(path), small_config()) {
        Err(e) => println!("create error: {e}"),
        Ok(rec) => {
            let h = rec.handle();
            for i in 0..100_000u64 {
                h.record_mem(mem(MemKind::MallocPost, i, 512));
            }
            let s = rec.finish().unwrap();
            println!("dropped {}", s.dropped_events);
        }
    }
}

#[test]
fn the_file_size_limit_is_a_size_cap() {
    let run = |name: &str, limit: u64| {
        let path = tmp(name);
        let limit = limit.to_string();
        let out = crate::support::run_child_test(
            "format::fsize_child_entry",
            &[
                ("POOLSIGHT_FSIZE_CHILD", path.as_os_str()),
                ("POOLSIGHT_FSIZE_LIMIT", limit.as_ref()),
            ],
        );
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "the child died ({:?}): {stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        (path, stdout)
    };
    // 256 KiB: room for the start, not for 100 000 events (3.2 MB).
    let (path, stdout) = run("fsize.pstrace", 256 << 10);
    // The test harness prints "test fsize_child_entry ... " on the same line.
    let dropped: u64 = stdout
        .split("dropped ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("{stdout}"))
        .parse()
        .unwrap();
    assert!(dropped > 0);
    assert!(std::fs::metadata(&path).unwrap().len() <= 256 << 10);
    let trace = Trace::open(&path).unwrap();
    // The one warning: the events the writer dropped, which every command then names.
    assert_eq!(trace.warnings.len(), 1, "{:?}", trace.warnings);
    assert!(
        trace.warnings[0]
            .what
            .contains(&format!("dropped {dropped} event(s)")),
        "{:?}",
        trace.warnings
    );
    assert_eq!(trace.footer.unwrap().dropped_events, dropped);
    assert_eq!(all_mem(&trace).len() as u64 + dropped, 100_000);
    // 1 KiB: not even the header fits; create says so.
    let (_, stdout) = run("fsize-tiny.pstrace", 1024);
    assert!(
        stdout.contains("create error") && stdout.contains("RLIMIT_FSIZE"),
        "{stdout}"
    );
}

/// Not a test: the child of `little_address_space_left_is_a_size_cap`, run with `--ignored`:
/// limits its own address space to what it uses plus `POOLSIGHT_AS_SPARE` bytes, then records
/// `POOLSIGHT_AS_EVENTS` events with the default `max_bytes` (1 TiB).
#[cfg(target_os = "linux")]
#[test]
#[ignore = "child process of the RLIMIT_AS test"]
fn address_space_child_entry() {
    let path = std::env::var_os("POOLSIGHT_AS_CHILD").expect("run by the RLIMIT_AS test");
    let number = |name: &str| -> u64 { std::env::var(name).unwrap().parse().unwrap() };
    crate::support::limit_address_space(number("POOLSIGHT_AS_SPARE"));
    match Recorder::create(PathBuf::from(path), small_config()) {
        Err(e) => println!("create error: {e}"),
        Ok(rec) => {
            let h = rec.handle();
            for i in 0..number("POOLSIGHT_AS_EVENTS") {
                h.record_mem(mem(MemKind::MallocPost, i, 512));
            }
            let s = rec.finish().unwrap();
            println!("dropped {} of {}", s.dropped_events, s.events);
        }
    }
}

/// Where the process cannot reserve `max_bytes` of address space (`ulimit -v`), the
/// recording maps an eighth of what it could have and stops there, saying so, instead of
/// failing to start; with less than 64 MiB to be had, it fails to start.
#[cfg(target_os = "linux")]
#[test]
fn little_address_space_left_is_a_size_cap() {
    let run = |name: &str, spare: u64, events: u64| {
        let path = tmp(name);
        let (spare, events) = (spare.to_string(), events.to_string());
        let out = crate::support::run_child_test(
            "format::address_space_child_entry",
            &[
                ("POOLSIGHT_AS_CHILD", path.as_os_str()),
                ("POOLSIGHT_AS_SPARE", spare.as_ref()),
                ("POOLSIGHT_AS_EVENTS", events.as_ref()),
            ],
        );
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            out.status.success(),
            "the child died ({:?}): {stdout}{stderr}",
            out.status
        );
        (path, stdout, stderr)
    };
    let dropped = |stdout: &str| -> u64 {
        stdout
            .split("dropped ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("{stdout}"))
            .parse()
            .unwrap()
    };
    // 1.5 GiB spare: 1 GiB fits, so the trace is mapped at 128 MiB, and 100,000 events fit.
    let (path, stdout, stderr) = run("as-fits.pstrace", 3 << 29, 100_000);
    assert!(
        stderr.contains("mapped at 128 MiB, not at its size limit of 1 TiB"),
        "{stderr}"
    );
    assert_eq!(dropped(&stdout), 0, "{stdout}");
    let trace = Trace::open(&path).unwrap();
    assert!(trace.warnings.is_empty(), "{:?}", trace.warnings);
    assert_eq!(all_mem(&trace).len(), 100_000);
    // 600 MiB spare: 512 MiB fits, an eighth of it is 64 MiB, and 3,000,000 events of 32
    // bytes do not fit in it: recording stops there, every event kept or counted.
    let (path, stdout, stderr) = run("as-full.pstrace", 600 << 20, 3_000_000);
    assert!(stderr.contains("mapped at 64 MiB"), "{stderr}");
    assert!(
        stderr.contains("size limit of 67108864 bytes (the address space"),
        "{stderr}"
    );
    let lost = dropped(&stdout);
    assert!(lost > 0, "{stdout}");
    assert!(std::fs::metadata(&path).unwrap().len() <= 64 << 20);
    let trace = Trace::open(&path).unwrap();
    assert_eq!(all_mem(&trace).len() as u64 + lost, 3_000_000);
    // 32 MiB spare: not even 64 MiB; create says why.
    let (_, stdout, _) = run("as-none.pstrace", 32 << 20, 1);
    assert!(
        stdout.contains("create error") && stdout.contains("Cannot allocate memory"),
        "{stdout}"
    );
}

mod fuzz {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]
        /// Random byte edits anywhere in a valid trace: the reader must never panic.
        #[test]
        fn random_corruption_never_panics(edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..16)) {
            // Recorded once for all the cases.
            static BASE: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
            let mut bytes = BASE.get_or_init(|| small_trace(&tmp("fuzz-base.pstrace"))).clone();
            for (idx, v) in edits {
                let i = idx.index(bytes.len());
                bytes[i] = v;
            }
            let path = tmp("fuzz.pstrace");
            std::fs::write(&path, &bytes).unwrap();
            if let Ok(t) = Trace::open(&path) {
                let _ = info::info(&t);
            }
        }

        /// Random byte edits in the committed fixtures (scopes, epochs, both allocation
        /// kinds): the whole analysis — replay, every report, flamegraphs, timeline, exports —
        /// must never panic.
        #[test]
        fn random_corruption_never_panics_the_analysis(
            which in 0usize..2,
            edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..12),
        ) {
            let name = ["chainer_nested", "fastai_epochs"][which];
            let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("fixtures/traces/{name}.pstrace"));
            let mut bytes = std::fs::read(fixture).unwrap();
            for (idx, v) in edits {
                let i = idx.index(bytes.len());
                bytes[i] = v;
            }
            let path = tmp("fuzz-analysis.pstrace");
            std::fs::write(&path, &bytes).unwrap();
            if let Ok(t) = Trace::open(&path) {
                analyze_everything(&t);
            }
        }
    }

    fn analyze_everything(t: &Trace) {
        use poolsight::analyzer::tables::{self, Report, ReportOptions};
        use poolsight::analyzer::{diff, export, views::flamegraph, views::timeline};
        // Every pass runs, the categories' walk included, on whatever the damage left.
        let opts = poolsight::analyzer::ReplayOptions {
            live_at_peak: true,
            categories: poolsight::analyzer::replay::CategoryPass::Always,
            ..Default::default()
        };
        let p = poolsight::analyzer::replay(t, 0, &opts);
        let r = Report::compute(&p, &ReportOptions::default());
        let _ = r.render_table(&ReportOptions::default());
        for name in tables::names() {
            let _ = r.render_csv(name);
        }
        for m in flamegraph::Metric::ALL {
            let _ = flamegraph::flamegraph_svg(&p, m, "fuzz");
        }
        let _ = timeline::timeline_svg(&p);
        let _ = export::chrome(&[(t, &p)], &mut std::io::sink());
        let _ = export::jsonl(t, &mut std::io::sink());
        let intact = Trace::open(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/traces/chainer_nested.pstrace"),
        )
        .unwrap();
        let base = Report::compute(
            &poolsight::analyzer::replay(&intact, 0, &Default::default()),
            &ReportOptions::default(),
        );
        let rules: Vec<diff::Rule> = ["peak_used>+5%", "function:*.used>1MB", "time>+20%"]
            .iter()
            .map(|r| r.parse().unwrap())
            .collect();
        let d = diff::compare(
            &[diff::Figures::of(&base)],
            &[diff::Figures::of(&r)],
            &rules,
        );
        let show = diff::ShowOptions::default();
        let _ = diff::render_table(&d, &show);
        let _ = diff::render_markdown(&d, &show);
        let _ = serde_json::to_string(&d.json(&show));
    }
}

/// `info` checks checksums as its replay reads the chunks; one that fails makes it read the
/// file again with every checksum checked first, so it lists the corrupted chunk and counts
/// exactly the events an open that checks everything keeps.
#[test]
fn info_names_a_corrupted_chunk_and_counts_what_remains() {
    let path = tmp("info-corrupt.pstrace");
    let c = corrupt_one_mem_event(&path, 3, 0x11);
    let want = info::info(&Trace::open(&path).unwrap());
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_poolsight"))
        .args(["info", "--format", "json"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let warnings = got["warnings"].as_array().unwrap();
    assert!(
        warnings
            .iter()
            .any(|w| w.as_str().unwrap().contains("checksum mismatch")),
        "{warnings:?}"
    );
    assert_eq!(got["total_events"], want.total_events);
    assert_eq!(got["events"]["malloc_post"], 300 - c.events as u64);
    assert_eq!(
        got["events"],
        serde_json::to_value(&want.events).unwrap(),
        "the counts an open that checks every checksum gives"
    );
}

#[test]
fn cli_gives_one_error_line_and_exit_2_on_bad_input() {
    let bin = env!("CARGO_BIN_EXE_poolsight");
    let foreign = tmp("cli-foreign.pstrace");
    std::fs::write(&foreign, b"GIF89a not a trace at all").unwrap();
    let future = tmp("cli-future.pstrace");
    let mut bytes = small_trace(&future);
    bytes[8] = 2;
    std::fs::write(&future, &bytes).unwrap();
    let future_needle = format!(
        "format 2.{} is not supported",
        poolsight::schema::FORMAT_MINOR
    );
    for (path, needle) in [
        (&foreign, "not a poolsight trace"),
        (&future, future_needle.as_str()),
    ] {
        let out = std::process::Command::new(bin)
            .arg("info")
            .arg(path)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.starts_with("poolsight: ") && err.contains(needle),
            "{err}"
        );
        assert!(out.stdout.is_empty());
    }
    let usage = std::process::Command::new(bin)
        .args(["info", "--bogus-flag"])
        .output()
        .unwrap();
    assert_eq!(usage.status.code(), Some(2));
    let good = tmp("cli-good.pstrace");
    small_trace(&good);
    let out = std::process::Command::new(bin)
        .args(["info", "--format", "json"])
        .arg(&good)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for key in [
        "format_version",
        "events",
        "threads",
        "devices",
        "duration_ns",
        "torn_chunks",
        "dropped_events",
    ] {
        assert!(json.get(key).is_some(), "missing key {key}");
    }
    assert_eq!(json["events"]["malloc_post"], 300);
    assert_eq!(
        json["format_version"],
        format!("1.{}", poolsight::schema::FORMAT_MINOR)
    );
}
