//! A relabel (format 1.6, `MemKind::Relabel`): the block at an address moves to another stack,
//! its live bytes unchanged. Cumulative figures (`functions`, `lines`, folded `used`) count the
//! block once, where it was made; what is live at an instant (the peak's stacks, categories,
//! `oom`'s end state) shows it under its new stack; the replay in windows of any size gives
//! what the one merge gives, with the block made in one window and relabelled in a later one.

use std::path::Path;

use poolsight::analyzer::replay::{replay_split, CategoryPass, Split};
use poolsight::analyzer::{ReplayOptions, Trace};
use poolsight::recorder::{
    DeviceInfo, DeviceKind, Frame, FrameKind, Handle, MemKind, MemRecord, Phase, Recorder,
    RecorderConfig,
};

use crate::support::{cli, scratch};

const STATE: u64 = 4096;
const OTHER: u64 = 8192;
const FILLERS: u64 = 2000;

fn frame(kind: FrameKind, name: &str) -> Frame {
    Frame {
        kind,
        phase: Phase::None,
        file: String::new(),
        line: 0,
        name: name.into(),
    }
}

fn stack(h: &Handle, parent: u32, kind: FrameKind, name: &str) -> u32 {
    h.intern_stack(parent, h.intern_frame(&frame(kind, name)))
}

fn malloc(h: &Handle, ptr: u64, bytes: u64, stack: u32) {
    for kind in [MemKind::MallocPost, MemKind::AllocPost] {
        h.record_mem(MemRecord {
            ptr,
            bytes,
            stack,
            ..MemRecord::new(kind, 0, 0)
        });
    }
}

fn free(h: &Handle, ptr: u64, bytes: u64) {
    for kind in [MemKind::FreePost, MemKind::Release] {
        h.record_mem(MemRecord {
            ptr,
            bytes,
            ..MemRecord::new(kind, 0, 0)
        });
    }
}

/// An optimizer step clones a buffer (a temporary), later keeps it as its state (a relabel,
/// `FILLERS` pairs of other events later, so many chunks and windows apart); then another
/// block raises the peak while the state is live. With `relabel` false the move is recorded
/// as it was before format 1.6: a free and an allocation at the same instant.
fn record(path: &Path, relabel: bool) {
    let config = RecorderConfig {
        chunk_size: 4096,
        devices: vec![DeviceInfo {
            id: 0,
            name: "cpu".into(),
            capacity: 0,
            allocation_unit: 1,
            kind: DeviceKind::Cpu,
            observed: true,
            prediction: None,
        }],
        ..RecorderConfig::default()
    };
    let rec = Recorder::create(path, config).unwrap();
    let h = rec.handle();
    let step = stack(&h, 0, FrameKind::Function, "SGD.step");
    let clone = stack(&h, step, FrameKind::Function, "aten::clone");
    let temporary = stack(&h, clone, FrameKind::Label, "temporary");
    let state = stack(&h, step, FrameKind::Label, "optimizer_state");
    let mm = stack(&h, 0, FrameKind::Function, "aten::mm");
    let activation = stack(&h, mm, FrameKind::Label, "activation");
    let filler = stack(&h, 0, FrameKind::Function, "filler");

    let step_start = poolsight::recorder::writer::now_ticks();
    let clone_start = poolsight::recorder::writer::now_ticks();
    malloc(&h, 0x1000, STATE, temporary);
    h.record_scope(clone, clone_start);
    for i in 0..FILLERS {
        malloc(&h, 0x10_0000 + i * 128, 100, filler);
        free(&h, 0x10_0000 + i * 128, 100);
    }
    if relabel {
        h.record_relabel(0, 0x1000, STATE, state);
    } else {
        free(&h, 0x1000, STATE);
        malloc(&h, 0x1000, STATE, state);
    }
    h.record_scope(step, step_start);
    let mm_start = poolsight::recorder::writer::now_ticks();
    malloc(&h, 0x2000, OTHER, activation);
    free(&h, 0x2000, OTHER);
    h.record_scope(mm, mm_start);
    rec.finish().unwrap();
}

fn json(args: &[&str]) -> serde_json::Value {
    let out = cli(args);
    assert_eq!(out.code, 0, "{args:?}: {}", out.stderr);
    out.json()
}

fn function_used(path: &str, name: &str) -> u64 {
    json(&["functions", path, "--format", "json"])["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("no row {name}"))["used_bytes"]
        .as_u64()
        .unwrap()
}

fn category(path: &str, name: &str, key: &str) -> u64 {
    json(&["categories", path, "--format", "json"])["categories"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["category"] == name)
        .map_or(0, |c| c[key].as_u64().unwrap())
}

/// Folded stacks of `metric` as (stack, value).
fn folded(path: &str, metric: &str) -> Vec<(String, u64)> {
    let out = cli(&[
        "export", path, "--format", "folded", "--metric", metric, "-o", "-",
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    out.stdout
        .lines()
        .filter_map(|l| {
            let (stack, v) = l.rsplit_once(' ')?;
            Some((stack.to_string(), v.parse().ok()?))
        })
        .collect()
}

#[test]
fn a_relabelled_block_counts_once_where_it_was_made_and_lives_under_its_new_stack() {
    let dir = scratch::dir();
    let (one, two) = (dir.join("relabel.pstrace"), dir.join("free-malloc.pstrace"));
    record(&one, true);
    record(&two, false);
    let (one, two) = (one.to_str().unwrap(), two.to_str().unwrap());

    let info = json(&["info", one, "--format", "json"]);
    assert_eq!(info["events"]["relabel"], 1);
    assert_eq!(
        info["format_version"],
        format!("1.{}", poolsight::schema::FORMAT_MINOR)
    );

    // Cumulative: the step allocated its state once, in the clone.
    assert_eq!(function_used(one, "SGD.step"), STATE);
    assert_eq!(function_used(one, "aten::clone"), STATE);
    // Recorded as a free and an allocation, the same block counted twice.
    assert_eq!(function_used(two, "SGD.step"), 2 * STATE);
    let used = folded(one, "used");
    assert!(
        !used.iter().any(|(s, _)| s.contains("optimizer_state")),
        "{used:?}"
    );

    // Live at an instant: at the peak and at the end the block is the optimizer's state, in
    // both recordings alike.
    for path in [one, two] {
        assert_eq!(category(path, "optimizer_state", "at_peak_bytes"), STATE);
        assert_eq!(category(path, "optimizer_state", "at_end_bytes"), STATE);
        assert_eq!(category(path, "temporary", "at_peak_bytes"), 0);
        assert_eq!(category(path, "temporary", "max_bytes"), STATE);
        assert_eq!(category(path, "activation", "at_peak_bytes"), OTHER);
        let peak = folded(path, "peak");
        let state: Vec<_> = peak
            .iter()
            .filter(|(s, _)| s.contains("optimizer_state"))
            .collect();
        assert_eq!(state.len(), 1, "{peak:?}");
        assert_eq!(state[0].1, STATE);
        let oom = json(&["oom", path, "--format", "json"]);
        assert_eq!(
            oom["ooms"][0]["live_by_category"]["optimizer_state"], STATE,
            "{oom}"
        );
    }
    let peak = |p: &str| json(&["categories", p, "--format", "json"])["peak_used_bytes"].clone();
    assert_eq!(peak(one), STATE + OTHER);
    assert_eq!(peak(two), STATE + OTHER);
}

#[test]
fn windows_replay_a_relabel_made_windows_after_its_block() {
    let dir = scratch::dir();
    let path = dir.join("relabel.pstrace");
    record(&path, true);
    let trace = Trace::open(&path).unwrap();
    let opts = ReplayOptions {
        series_points: 7,
        live_at_peak: true,
        categories: CategoryPass::Always,
        ..ReplayOptions::default()
    };
    let one = format!(
        "{:#?}",
        replay_split(&trace, 0, &opts, Split::OneMerge).unwrap()
    );
    for n in [16, 100, 1000, 1 << 20] {
        let windows = replay_split(&trace, 0, &opts, Split::WindowsOnly(n))
            .unwrap_or_else(|| panic!("windows of {n} fell back"));
        assert!(one == format!("{windows:#?}"), "windows of {n} differ");
    }
    let profile = replay_split(&trace, 0, &opts, Split::WindowsOnly(16)).unwrap();
    let live: u64 = profile
        .tree
        .nodes
        .iter()
        .enumerate()
        .filter(|(i, _)| {
            profile
                .tree
                .path(*i)
                .last()
                .is_some_and(|f| &*f.name == "optimizer_state")
        })
        .map(|(_, n)| n.agg.live_at_peak_bytes)
        .sum();
    assert_eq!(live, STATE);
}
