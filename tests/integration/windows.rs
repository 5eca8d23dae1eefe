//! The replay in windows of time gives the figures the one merge gives, however the work is
//! split: on every fixture, on traces of several threads cut into many small windows, on
//! traces whose threads' timestamps tie everywhere (cuts must move past ties), and on traces
//! where a thread goes back in time (the windows must notice and the replay fall back).

use crate::support::scratch;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use poolsight::analyzer::replay::{progress_total, replay_split, CategoryPass, Split};
use poolsight::analyzer::{ChunkKind, ReplayOptions, Trace};
use poolsight::recorder::{
    Frame, FrameKind, Handle, MarkKind, MemKind, MemRecord, Phase, Recorder, RecorderConfig,
};
use poolsight::schema::{chunk_crc, fb, meta_field, meta_offset};

fn tmp(name: &str) -> scratch::Scratch {
    scratch::file(name)
}

/// The profile as text: every figure, the call tree, the series and the epochs.
fn figures(trace: &Trace, opts: &ReplayOptions, split: Split) -> Option<String> {
    replay_split(trace, 0, opts, split).map(|p| format!("{p:#?}"))
}

fn option_sets() -> Vec<ReplayOptions> {
    [
        (2000, false, CategoryPass::Never),
        (7, true, CategoryPass::Always),
        (1, false, CategoryPass::Always),
        (0, true, CategoryPass::Never),
    ]
    .into_iter()
    .map(|(series_points, live_at_peak, categories)| ReplayOptions {
        series_points,
        live_at_peak,
        progress: None,
        categories,
        ..ReplayOptions::default()
    })
    .collect()
}

/// Asserts the windows (of each size) give what the one merge gives; `windows_stand` says
/// whether they must manage without falling back.
fn assert_same(path: &Path, sizes: &[u64], windows_stand: bool) {
    let trace = Trace::open(path).unwrap();
    for opts in option_sets() {
        let one = figures(&trace, &opts, Split::OneMerge).unwrap();
        for &n in sizes {
            let split = figures(&trace, &opts, Split::Windows(n)).unwrap();
            assert!(
                one == split,
                "{}: windows of {n} events differ from the one merge (points {})",
                path.display(),
                opts.series_points
            );
            let only = figures(&trace, &opts, Split::WindowsOnly(n));
            if windows_stand {
                assert!(
                    only.is_some(),
                    "{}: windows of {n} fell back",
                    path.display()
                );
            } else {
                assert!(only.is_none(), "{}: windows of {n} stood", path.display());
            }
        }
    }
}

#[test]
fn fixtures_replay_the_same_in_windows() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/traces");
    let mut paths = Vec::new();
    for dir in [root.clone(), root.join("v1.0"), root.join("packed")] {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "pstrace") {
                paths.push(p);
            }
        }
    }
    assert!(paths.len() >= 10, "{paths:?}");
    for p in paths {
        assert_same(&p, &[1, 5, 40, 1 << 18], true);
        // Every format version's checksums are checked right when deferred to the replay.
        let t = Trace::open_deferred(&p).unwrap();
        replay_split(&t, 0, &ReplayOptions::default(), Split::Windows(5)).unwrap();
        assert!(t.checksums_hold(), "{}: deferred checksums", p.display());
    }
}

const THREADS: u64 = 3;

/// A training-like loop on `THREADS` threads, small chunks so the trace has many: mallocs and
/// frees on a few stacks, device allocs and releases, scopes, and epoch marks on thread 0.
fn record(path: &Path, steps: u64) {
    let rec = Recorder::create(
        path,
        RecorderConfig {
            chunk_size: 4096,
            calibration: std::time::Duration::from_millis(1),
            ..RecorderConfig::default()
        },
    )
    .unwrap();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let h = rec.handle();
            s.spawn(move || work(&h, t, steps));
        }
    });
    rec.finish().unwrap();
}

fn work(h: &Handle, t: u64, steps: u64) {
    let stacks: Vec<u32> = (0..4)
        .map(|i| {
            h.intern_frames(&[Frame {
                kind: FrameKind::Function,
                phase: if i % 2 == 0 {
                    Phase::Forward
                } else {
                    Phase::Backward
                },
                file: format!("model{t}.py"),
                line: 10 + i,
                name: format!("f{i}"),
            }])
        })
        .collect();
    let mem = |kind, ptr, bytes, stack| {
        h.record_mem(MemRecord {
            ptr,
            bytes,
            stack,
            ..MemRecord::new(kind, 0, t as u32)
        })
    };
    let mut live = Vec::new();
    for step in 0..steps {
        if t == 0 && step % 200 == 0 {
            if step > 0 {
                h.record_mark(MarkKind::EpochEnd, (step / 200 - 1) as u32, step, step * 2);
            }
            h.record_mark(MarkKind::EpochBegin, (step / 200) as u32, step, 0);
        }
        let start = poolsight::recorder::writer::now_ticks();
        for k in 0..4u64 {
            let ptr = (t << 40) | (step << 8) | k;
            let bytes = 100 + ((step * 7 + k * 13 + t) % 5000);
            let stack = stacks[(k as usize + step as usize) % stacks.len()];
            if (step + k) % 9 == 0 {
                mem(MemKind::AllocPost, ptr, 1 << 20, stack);
            }
            mem(MemKind::MallocPost, ptr, bytes, stack);
            live.push((ptr, bytes.div_ceil(512) * 512));
        }
        h.record_scope(stacks[step as usize % stacks.len()], start);
        // Frees lag, so the bytes in use wander up and down across the run.
        while live.len() > 6 + (step as usize % 17) {
            let (ptr, bytes) = live.remove(0);
            mem(MemKind::FreePost, ptr, bytes, 0);
        }
        if step % 97 == 96 {
            mem(MemKind::Release, 0, 1 << 20, 0);
        }
    }
    if t == 0 {
        h.record_mark(MarkKind::EpochEnd, (steps / 200) as u32, steps, steps);
    }
}

/// Rewrites the ticks of every memory and mark event with `f` (and each memory chunk's base),
/// optionally swaps one memory chunk's events in time, and seals every changed chunk again.
fn rewrite(from: &Path, to: &Path, f: impl Fn(u64) -> u64, back_in_time: bool) {
    let trace = Trace::open(from).unwrap();
    let mut bytes = std::fs::read(from).unwrap();
    let map = trace.bytes().as_ptr() as usize;
    let mut swapped = !back_in_time;
    for c in trace.chunks.iter() {
        let (off, len) = (c.offset as usize, c.len as usize);
        match c.kind {
            ChunkKind::Mem => {
                let events = trace.mem_events(c);
                let at = events.as_ptr() as usize - map;
                let size = std::mem::size_of::<fb::MemEvent>();
                let (mut old_base, mut new_base) = (c.base_ticks, f(c.base_ticks));
                let meta_base = off + meta_at(&bytes[off..off + len]) + meta_field::BASE_TICKS;
                bytes[meta_base..meta_base + 8].copy_from_slice(&new_base.to_le_bytes());
                for (i, e) in events.iter().enumerate() {
                    let mut e = *e;
                    if e.kind() == fb::MemKind::Rebase {
                        old_base = e.ptr();
                        new_base = f(old_base);
                        e.set_ptr(new_base);
                    } else {
                        let ticks = f(old_base + e.ts() as u64);
                        e.set_ts(u32::try_from(ticks - new_base).unwrap());
                    }
                    bytes[at + i * size..at + (i + 1) * size].copy_from_slice(&e.0);
                }
                if !swapped && events.len() > 8 {
                    // Event 3 now lies after event 4, in one thread's order.
                    let e3 = at + 3 * size;
                    let mut e = fb::MemEvent(bytes[e3..e3 + size].try_into().unwrap());
                    let next = fb::MemEvent(bytes[e3 + size..e3 + 2 * size].try_into().unwrap());
                    e.set_ts(next.ts() + 1000);
                    bytes[e3..e3 + size].copy_from_slice(&e.0);
                    swapped = true;
                }
            }
            ChunkKind::Mark => {
                let events = trace.mark_events(c);
                let at = events.as_ptr() as usize - map;
                let size = std::mem::size_of::<fb::MarkEvent>();
                for (i, e) in events.iter().enumerate() {
                    let mut e = *e;
                    e.set_ticks(f(e.ticks()));
                    bytes[at + i * size..at + (i + 1) * size].copy_from_slice(&e.0);
                }
            }
            _ => continue,
        }
        reseal(&mut bytes[off..off + len]);
    }
    assert!(swapped, "no memory chunk long enough to swap in");
    std::fs::write(to, bytes).unwrap();
    let rewritten = Trace::open(to).unwrap();
    assert!(rewritten.warnings.is_empty(), "{:?}", rewritten.warnings);
}

fn meta_at(chunk: &[u8]) -> usize {
    let root = fb::size_prefixed_root_as_chunk(chunk).unwrap();
    meta_offset(chunk, root.meta())
}

fn reseal(chunk: &mut [u8]) {
    let meta = meta_at(chunk);
    let used = u32::from_le_bytes(chunk[meta + meta_field::USED..][..4].try_into().unwrap());
    let crc = chunk_crc(chunk, meta, 4 + used as usize).unwrap();
    chunk[meta + meta_field::CRC32..][..4].copy_from_slice(&crc.to_le_bytes());
}

#[test]
fn threads_cut_into_many_windows_replay_the_same() {
    let path = tmp("threads.pstrace");
    record(&path, 3000);
    let trace = Trace::open(&path).unwrap();
    let mem_chunks = trace
        .chunks
        .iter()
        .filter(|c| c.kind == ChunkKind::Mem)
        .count();
    assert!(mem_chunks > 100, "only {mem_chunks} memory chunks");
    assert_same(&path, &[1, 50, 333, 5000, 1 << 18], true);
    assert_progress_ends_at_total(&path);
}

#[test]
fn ticks_that_tie_across_threads_replay_the_same() {
    let path = tmp("ties-source.pstrace");
    record(&path, 3000);
    // Coarse clocks: thousands of events of different threads share each tick value, so
    // nearly every cut lands on a tie and must move past it, or be dropped.
    for (mask, name) in [
        (0xfff, "ties-fine.pstrace"),
        (0xf_ffff, "ties-coarse.pstrace"),
    ] {
        let tied = tmp(name);
        rewrite(&path, &tied, |t| t & !mask, false);
        assert_same(&tied, &[1, 50, 333, 5000], true);
    }
}

#[test]
fn a_thread_going_back_in_time_falls_back_to_the_one_merge() {
    let path = tmp("back-source.pstrace");
    record(&path, 2000);
    let back = tmp("back.pstrace");
    rewrite(&path, &back, |t| t, true);
    assert_same(&back, &[1, 50, 5000, 1 << 18], false);
    // Though the windows were tried first.
    assert_progress_ends_at_total(&back);
}

/// The progress a bar shows ends at its total, with and without the walk to the peak, in
/// windows and in the one merge.
fn assert_progress_ends_at_total(path: &Path) {
    let trace = Trace::open(path).unwrap();
    for split in [Split::Windows(50), Split::OneMerge] {
        for live_at_peak in [false, true] {
            let progress = Arc::new(AtomicU64::new(0));
            let opts = ReplayOptions {
                live_at_peak,
                progress: Some(Arc::clone(&progress)),
                ..ReplayOptions::default()
            };
            replay_split(&trace, 0, &opts, split).unwrap();
            assert_eq!(
                progress.load(Ordering::Relaxed),
                progress_total(&trace, &opts),
                "{split:?}, live_at_peak {live_at_peak}"
            );
        }
    }
}

#[test]
fn deferred_checksums_are_checked_by_the_replay() {
    let path = tmp("deferred.pstrace");
    record(&path, 500);
    let intact = Trace::open_deferred(&path).unwrap();
    assert!(!intact.checksums_hold(), "nothing was read yet");
    let opts = ReplayOptions::default();
    for split in [Split::Windows(50), Split::OneMerge] {
        let t = Trace::open_deferred(&path).unwrap();
        replay_split(&t, 0, &opts, split).unwrap();
        assert!(t.checksums_hold(), "{split:?}: an intact trace");
    }
    // One bit of one event of one sealed memory chunk.
    let mut bytes = std::fs::read(&path).unwrap();
    let c = *intact
        .chunks
        .iter()
        .find(|c| c.kind == ChunkKind::Mem && c.events > 4)
        .unwrap();
    let at = intact.mem_events(&c).as_ptr() as usize - intact.bytes().as_ptr() as usize;
    bytes[at + 2 * std::mem::size_of::<fb::MemEvent>() + 9] ^= 4;
    let bad = tmp("deferred-bad.pstrace");
    std::fs::write(&bad, &bytes).unwrap();
    for split in [Split::Windows(50), Split::OneMerge] {
        let t = Trace::open_deferred(&bad).unwrap();
        assert!(t.warnings.is_empty(), "{:?}", t.warnings);
        replay_split(&t, 0, &opts, split).unwrap();
        assert!(
            !t.checksums_hold(),
            "{split:?}: a corrupted chunk went unnoticed"
        );
    }
    let loaded =
        poolsight::analyzer::load::load(&[&bad], &Default::default(), &opts, |_| {}).unwrap();
    assert!(
        loaded
            .warnings
            .iter()
            .any(|w| w.warning.what.contains("checksum mismatch")),
        "{:?}",
        loaded
            .warnings
            .iter()
            .map(|w| w.to_string())
            .collect::<Vec<_>>()
    );
}

/// A recording attached mid-run sees frees and releases of blocks it never saw allocated, so
/// its bytes go below zero; windows holding only those (no malloc, no device alloc) have no
/// peak of their own and must not be read as if they had one.
#[test]
fn bytes_below_zero_replay_the_same_in_windows() {
    let path = tmp("below-zero.pstrace");
    let rec = Recorder::create(
        &path,
        RecorderConfig {
            chunk_size: 4096, // about 120 events a chunk: windows can be cut every chunk
            ..RecorderConfig::default()
        },
    )
    .unwrap();
    let h = rec.handle();
    let mem = |kind, ptr, bytes| {
        h.record_mem(MemRecord {
            ptr,
            bytes,
            ..MemRecord::new(kind, 0, 0)
        })
    };
    for i in 0..400u64 {
        mem(MemKind::FreePost, 0x1000 + i * 512, 512);
        mem(MemKind::Release, 0, 1 << 20);
    }
    for i in 0..50u64 {
        mem(MemKind::MallocPost, 0x9000 + i * 512, 100);
        mem(MemKind::FreePost, 0x9000 + i * 512, 512);
        if i % 10 == 0 {
            mem(MemKind::AllocPost, 0x100000 * (i + 1), 1 << 20);
        }
    }
    drop(h);
    rec.finish().unwrap();
    assert_same(&path, &[1, 2, 3, 7, 64], true);
}
