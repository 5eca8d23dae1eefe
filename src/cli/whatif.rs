//! `poolsight whatif`: a run's requests replayed through the model of PyTorch's caching
//! allocator (`poolsight-alloc-models`) under its recorded settings and alternatives, and
//! `--check`, the model against the segments a snapshot recorded. Argument parsing and
//! rendering only.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, ValueEnum};
use poolsight::analyzer::read::{ChunkKind, Trace};
use poolsight::analyzer::replay::{memory_requests, request_line, MemRequest, RequestKind};
use poolsight_alloc_models::pytorch::check::{check, Agreement, Held};
use poolsight_alloc_models::pytorch::replay::{min_capacity, replay, Config, Op, Outcome, Request};
use poolsight_alloc_models::pytorch::Settings;
use poolsight_import::settings::HeldSegment;
use poolsight_schema::kinds::MarkKind;
use rayon::prelude::*;
use serde::Serialize;

use super::import::is_pytorch_file;
use super::load::{check_trace_path, Reading};

const HELP: &str = "\
Each setting is a PYTORCH_CUDA_ALLOC_CONF string, one alternative per --setting:
  expandable_segments:True          one growing segment per stream, mapped in 2/20 MiB pages
  max_split_size_mb:N               blocks of N MiB or more are never split (N >= 20)
  max_non_split_rounding_mb:N       ... and serve requests at most N MiB smaller (default 20)
  roundup_power2_divisions:N        round sizes to N steps between powers of two, or per
                                    interval: '[256:1,512:2,>:4]' (intervals in MiB)
  garbage_collection_threshold:F    free old cached segments past F of the allowed memory
                                    (acts only with per_process_memory_fraction)
  per_process_memory_fraction:F     torch.cuda.set_per_process_memory_fraction(F)
  several at once: --setting expandable_segments:True,max_split_size_mb:256

The first row is the run's recorded settings (a snapshot's allocator_settings; PyTorch's
defaults for other traces); each alternative is applied over them. Without --setting, four
alternatives are tried: expandable_segments:True, max_split_size_mb:128,
roundup_power2_divisions:4 and garbage_collection_threshold:0.6 (with a memory fraction of 1.0).

The capacity is what the allocator could take from the device: --capacity, else the trace's
device memory where recorded, else at a recorded out-of-memory the bytes reserved plus those
the device still had free; without one, nothing fails. Units: B, KB/KiB, MB/MiB, GB/GiB,
TB/TiB, all 1024 steps (an \"80GB\" GPU is 80 GiB).

Columns: reserved peak (bytes held from the device at most), allocated peak (bytes of blocks
handed out at most), fragmentation (reserved minus allocated at the reserved peak), inactive
split (free bytes in split segments there), whether the run fits, and the first request that
would not (its time, size and line).

--check replays with the recorded settings and compares the model's device allocations
(count, sizes, order) and each block's offset in its segment with what the snapshot recorded.

Examples:
  poolsight whatif oom_snapshot.pickle
  poolsight whatif run.pickle --setting expandable_segments:True --capacity 24GiB --min-capacity
  poolsight whatif run.pickle --check --format json";

#[derive(Copy, Clone, PartialEq, Eq, ValueEnum)]
pub enum WhatifFormat {
    Table,
    Json,
}

#[derive(Args)]
#[command(after_help = HELP)]
pub struct WhatifArgs {
    /// Trace files or PyTorch snapshots; each is replayed on its own, device by device.
    #[arg(required = true)]
    traces: Vec<PathBuf>,
    /// An alternative to the recorded settings, as PYTORCH_CUDA_ALLOC_CONF spells it
    /// (repeatable; replaces the default alternatives).
    #[arg(long = "setting", value_name = "K:V[,K:V]")]
    settings: Vec<String>,
    /// The bytes the allocator may take from the device (16GiB, 80GB, 24576MiB, ...).
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    capacity: Option<u64>,
    /// Also find, for each setting, the smallest capacity the run fits in.
    #[arg(long)]
    min_capacity: bool,
    /// Compare the model, with the recorded settings, with the recorded segments and blocks.
    #[arg(long)]
    check: bool,
    #[arg(long, value_enum, default_value_t = WhatifFormat::Table)]
    format: WhatifFormat,
}

/// Bytes with an optional unit (1024 steps): `16GiB`, `80GB`, `512M`, `1048576`.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (examples: 16GiB, 80GB, 1048576)"))?;
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {s:?} (B, KB, MB, GB, TB)"
            ))
        }
    };
    let bytes = n * scale as f64;
    if !(bytes.is_finite() && bytes >= 1.0 && bytes < u64::MAX as f64) {
        return Err(format!("{s:?} is not a usable capacity"));
    }
    Ok(bytes as u64)
}

/// One device of one trace: its requests and what is known of its memory.
struct Device {
    /// The file as named, and the heading of its report (with the device when several).
    name: String,
    heading: String,
    device: u32,
    requests: Vec<Request>,
    capacity: Option<u64>,
    capacity_source: &'static str,
    recorded_reserved_peak: u64,
    /// Bytes held from before the trace began (a snapshot that does not start empty).
    held_at_start: u64,
}

#[derive(Serialize)]
struct FailureJson {
    ns: u64,
    requested_bytes: u64,
    line: Option<String>,
    stream: u32,
    reserved_bytes: u64,
    allocated_bytes: u64,
    live_blocks: u64,
    /// What was live: the lines whose blocks held the most bytes.
    live_top_lines: Vec<LiveLine>,
}

#[derive(Serialize)]
struct LiveLine {
    line: Option<String>,
    bytes: u64,
}

#[derive(Serialize)]
struct RunJson {
    settings: serde_json::Map<String, serde_json::Value>,
    label: String,
    recorded: bool,
    reserved_peak_bytes: u64,
    allocated_peak_bytes: u64,
    fragmentation_bytes: u64,
    inactive_split_bytes: u64,
    segments_at_peak: u64,
    fits: bool,
    failures: u64,
    first_failure: Option<FailureJson>,
    min_capacity_bytes: Option<u64>,
}

#[derive(Serialize)]
struct ReportJson {
    allocator: &'static str,
    capacity_bytes: Option<u64>,
    capacity_source: &'static str,
    device: u32,
    requests: u64,
    recorded_reserved_peak_bytes: u64,
    runs: Vec<RunJson>,
}

#[derive(Serialize)]
struct CheckJson {
    trace: String,
    /// What recorded the segments: `pytorch` (a snapshot: the caching allocator's own) or
    /// `other` (a poolsight trace, a profiler trace), where agreement is not expected.
    recorded_by: &'static str,
    device: u32,
    settings: String,
    segments_recorded: u64,
    segments_simulated: u64,
    segments_matching: u64,
    blocks_checked: u64,
    block_offsets_matching: u64,
    starts_empty: bool,
    initial_segments: u64,
    exact: bool,
    first_mismatch: Option<String>,
}

pub fn run(args: WhatifArgs, r: &Reading, out: &mut impl Write) -> anyhow::Result<()> {
    let alternatives: Vec<Settings> = args
        .settings
        .iter()
        .map(|s| Settings::parse(s).with_context(|| format!("--setting {s:?}")))
        .collect::<anyhow::Result<_>>()?;
    // A snapshot is read twice: converted into a trace, and for its allocator's settings and
    // segments; the two passes run side by side.
    let (converted, states) = std::thread::scope(|scope| {
        let states = scope.spawn(|| {
            args.traces
                .iter()
                .map(|t| recorded_state(t))
                .collect::<Vec<_>>()
        });
        let converted = r.inputs(&args.traces);
        (converted, states.join())
    });
    let converted = converted?;
    let states = states.map_err(|_| anyhow::anyhow!("reading the allocator settings failed"))?;
    let mut reports: Vec<(String, ReportJson, Vec<String>)> = Vec::new();
    let mut checks = Vec::new();
    for ((named, path), state) in args.traces.iter().zip(converted.traces()).zip(states) {
        check_trace_path(path)?;
        let (recorded, held, snapshot) = state?;
        // A converted snapshot's errors name the file as the user did.
        let trace = Trace::open(path).map_err(|e| {
            let text = e.to_string();
            anyhow::anyhow!(text.replace(&path.display().to_string(), &named.display().to_string()))
        })?;
        for w in &trace.warnings {
            eprintln!("poolsight: warning: {}: {w}", named.display());
        }
        for d in devices(&trace, named, args.capacity) {
            if args.check {
                let a = check(
                    &d.requests,
                    &recorded,
                    d.capacity,
                    &held_of(&held, d.device),
                );
                checks.push(check_json(&d, &recorded, a, snapshot));
                continue;
            }
            let mut runs = vec![(recorded.clone(), true)];
            let alts = if alternatives.is_empty() {
                default_alternatives(&recorded)
            } else {
                alternatives.iter().map(|a| over(&recorded, a)).collect()
            };
            for a in alts {
                if !runs.iter().any(|(s, _)| *s == a) {
                    runs.push((a, false));
                }
            }
            let results: Vec<(Outcome, Option<u64>)> = runs
                .par_iter()
                .map(|(s, _)| {
                    let cfg = Config {
                        settings: s.clone(),
                        capacity: d.capacity,
                        stop_at_failure: false,
                    };
                    let o = replay(&d.requests, &cfg);
                    let m = args
                        .min_capacity
                        .then(|| min_capacity(&d.requests, s))
                        .flatten();
                    (o, m)
                })
                .collect();
            let runs_json = runs
                .iter()
                .zip(results)
                .map(|((s, rec), (o, m))| run_json(&trace, s, *rec, o, m))
                .collect();
            let mut notes = Vec::new();
            if d.held_at_start > 0 {
                notes.push(format!(
                    "the trace began with {} already reserved; the model starts empty",
                    human(d.held_at_start)
                ));
            }
            reports.push((
                d.heading.clone(),
                ReportJson {
                    allocator: "pytorch",
                    capacity_bytes: d.capacity,
                    capacity_source: d.capacity_source,
                    device: d.device,
                    requests: d.requests.iter().filter(|r| is_request(r.op)).count() as u64,
                    recorded_reserved_peak_bytes: d.recorded_reserved_peak,
                    runs: runs_json,
                },
                notes,
            ));
        }
    }
    if args.check {
        match args.format {
            WhatifFormat::Json => {
                let j = serde_json::json!({ "checks": checks });
                writeln!(out, "{}", serde_json::to_string_pretty(&j)?)?;
            }
            WhatifFormat::Table => write!(out, "{}", check_table(&checks))?,
        }
        return Ok(());
    }
    match args.format {
        WhatifFormat::Json => {
            let json = if reports.len() == 1 {
                serde_json::to_value(&reports[0].1)?
            } else {
                let list = reports
                    .iter()
                    .map(|(h, r, _)| {
                        let mut j = serde_json::to_value(r)?;
                        if let Some(o) = j.as_object_mut() {
                            o.insert("trace".into(), h.clone().into());
                        }
                        Ok(j)
                    })
                    .collect::<serde_json::Result<Vec<_>>>()?;
                serde_json::Value::Array(list)
            };
            writeln!(out, "{}", serde_json::to_string_pretty(&json)?)?;
        }
        WhatifFormat::Table => {
            for (i, (h, r, notes)) in reports.iter().enumerate() {
                if i > 0 {
                    writeln!(out)?;
                }
                write!(out, "{}", table(h, r, notes, args.min_capacity))?;
            }
        }
    }
    Ok(())
}

fn is_request(op: Op) -> bool {
    matches!(op, Op::Malloc | Op::OutOfMemory)
}

/// The settings a file recorded (a snapshot's `allocator_settings`, else PyTorch's defaults),
/// the segments a snapshot held at its end, and whether the file is a snapshot (recorded by
/// PyTorch's caching allocator).
fn recorded_state(named: &Path) -> anyhow::Result<(Settings, Vec<HeldSegment>, bool)> {
    if !is_pytorch_file(named) {
        return Ok((Settings::default(), Vec::new(), false));
    }
    let data = std::fs::read(named).with_context(|| format!("cannot read {}", named.display()))?;
    if poolsight_import::detect(&data) != poolsight_import::Kind::Snapshot {
        return Ok((Settings::default(), Vec::new(), false));
    }
    let state = poolsight_import::settings::allocator_state(&data)?;
    let settings = match state.settings {
        Some(pairs) => Settings::from_recorded(&pairs).with_context(|| {
            format!("the allocator_settings of {} do not parse", named.display())
        })?,
        None => Settings::default(),
    };
    Ok((settings, state.segments, true))
}

/// A device's held segments, as the check takes them (expandable ones are left out).
fn held_of(segments: &[HeldSegment], device: u32) -> Vec<Held> {
    segments
        .iter()
        .filter(|s| s.device == device && !s.expandable)
        .map(|s| Held {
            addr: s.address,
            size: s.total_size,
            small: s.small,
            allocated: s.allocated.clone(),
        })
        .collect()
}

/// `alt` applied over `base`: the options `alt` sets replace `base`'s.
fn over(base: &Settings, alt: &Settings) -> Settings {
    let d = Settings::default();
    let mut s = base.clone();
    if alt.expandable_segments != d.expandable_segments {
        s.expandable_segments = alt.expandable_segments;
    }
    if alt.max_split_size != d.max_split_size {
        s.max_split_size = alt.max_split_size;
    }
    if alt.max_non_split_rounding != d.max_non_split_rounding {
        s.max_non_split_rounding = alt.max_non_split_rounding;
    }
    if alt.roundup_power2_divisions != d.roundup_power2_divisions {
        s.roundup_power2_divisions = alt.roundup_power2_divisions;
    }
    if alt.garbage_collection_threshold != d.garbage_collection_threshold {
        s.garbage_collection_threshold = alt.garbage_collection_threshold;
    }
    if alt.memory_fraction.is_some() {
        s.memory_fraction = alt.memory_fraction;
    }
    s
}

fn default_alternatives(recorded: &Settings) -> Vec<Settings> {
    [
        "expandable_segments:True",
        "max_split_size_mb:128",
        "roundup_power2_divisions:4",
        "garbage_collection_threshold:0.6,per_process_memory_fraction:1.0",
    ]
    .iter()
    .filter_map(|c| Settings::parse(c).ok())
    .map(|a| over(recorded, &a))
    .collect()
}

/// The devices of a trace with their requests, capacity and recorded reserved peak.
fn devices(trace: &Trace, named: &Path, capacity: Option<u64>) -> Vec<Device> {
    let all = memory_requests(trace);
    let mut ids: Vec<u32> = all.iter().map(|r| r.device).collect();
    ids.sort_unstable();
    ids.dedup();
    if ids.is_empty() {
        // A trace without memory events still gets its (empty) report.
        ids.push(0);
    }
    let device_free = device_free_marks(trace);
    let name = named.display().to_string();
    let several = ids.len() > 1;
    ids.into_iter()
        .map(|dev| {
            let mine: Vec<&MemRequest> = all.iter().filter(|r| r.device == dev).collect();
            let (mut held, mut peak, mut start) = (0u64, 0u64, 0u64);
            let mut inferred = None;
            let mut frees = device_free.iter().filter(|(d, _)| *d == dev);
            for r in &mine {
                match r.kind {
                    RequestKind::Acquire => {
                        held = held.saturating_add(r.bytes);
                        if r.addr <= 1 || held_before(trace, r) {
                            start += r.bytes;
                        }
                    }
                    RequestKind::Release => held = held.saturating_sub(r.bytes),
                    RequestKind::OutOfMemory => {
                        if let Some((_, free)) = frees.next() {
                            inferred.get_or_insert(held.saturating_add(*free));
                        }
                    }
                    _ => {}
                }
                peak = peak.max(held);
            }
            let recorded_capacity = trace
                .defs
                .devices
                .iter()
                .find(|d| d.id == dev)
                .map(|d| d.capacity)
                .filter(|&c| c > 0);
            let (capacity, capacity_source) = match (capacity, recorded_capacity, inferred) {
                (Some(c), _, _) => (Some(c), "--capacity"),
                (None, Some(c), _) => (Some(c), "the trace's device"),
                (None, None, Some(c)) if c > 0 => (
                    Some(c),
                    "reserved plus device free at the recorded out-of-memory",
                ),
                _ => (None, "none"),
            };
            // Segments held from before the trace are the state the replay starts from (taken
            // from the snapshot's `segments`), not segments the trace recorded: the model reads
            // them as memory held from the start (address 1, as an importer writes a lump).
            let requests = mine
                .iter()
                .map(|r| Request {
                    op: match r.kind {
                        RequestKind::Malloc => Op::Malloc,
                        RequestKind::FreeRequested => Op::FreeRequested,
                        RequestKind::Free => Op::Free,
                        RequestKind::OutOfMemory => Op::OutOfMemory,
                        RequestKind::Acquire => Op::Acquire,
                        RequestKind::Release => Op::Release,
                    },
                    stream: r.stream,
                    addr: if r.kind == RequestKind::Acquire && held_before(trace, r) {
                        1
                    } else {
                        r.addr
                    },
                    size: r.bytes,
                    ns: r.ns,
                    stack: r.stack,
                })
                .collect();
            Device {
                name: name.clone(),
                heading: if several {
                    format!("{name} (device {dev})")
                } else {
                    name.clone()
                },
                device: dev,
                requests,
                capacity,
                capacity_source,
                recorded_reserved_peak: peak,
                held_at_start: start,
            }
        })
        .collect()
}

/// The `device_free` marks of out-of-memory events, in time order: (device, free bytes).
/// Whether an acquisition is a segment a snapshot held from before its trace began.
fn held_before(trace: &Trace, r: &MemRequest) -> bool {
    r.stack != 0
        && request_line(trace, r.stack)
            .is_some_and(|l| l.ends_with(poolsight_import::events::HELD_BEFORE))
}

fn device_free_marks(trace: &Trace) -> Vec<(u32, u64)> {
    let mut marks: Vec<(u64, u32, u64)> = trace
        .chunks
        .iter()
        .filter(|c| c.kind == ChunkKind::Mark)
        .flat_map(|c| trace.mark_events(c))
        .filter(|m| MarkKind::try_from(m.kind()) == Ok(MarkKind::DeviceFree))
        .map(|m| (m.ticks(), m.aux(), m.a()))
        .collect();
    marks.sort_by_key(|m| m.0);
    marks.into_iter().map(|(_, d, f)| (d, f)).collect()
}

fn run_json(trace: &Trace, s: &Settings, recorded: bool, o: Outcome, m: Option<u64>) -> RunJson {
    let settings = s
        .pairs()
        .into_iter()
        .map(|(k, v)| (k, serde_json::Value::String(v)))
        .collect();
    RunJson {
        settings,
        label: s.label(),
        recorded,
        reserved_peak_bytes: o.reserved_peak,
        allocated_peak_bytes: o.allocated_peak,
        fragmentation_bytes: o.fragmentation,
        inactive_split_bytes: o.inactive_split_at_peak,
        segments_at_peak: o.segments_at_peak,
        fits: o.first_failure.is_none(),
        failures: o.failures,
        first_failure: o.first_failure.map(|f| FailureJson {
            ns: f.ns,
            requested_bytes: f.requested,
            line: request_line(trace, f.stack),
            stream: f.stream,
            reserved_bytes: f.reserved,
            allocated_bytes: f.allocated,
            live_blocks: f.live_blocks,
            live_top_lines: f
                .live_by_stack
                .iter()
                .map(|&(stack, bytes)| LiveLine {
                    line: request_line(trace, stack),
                    bytes,
                })
                .collect(),
        }),
        min_capacity_bytes: m,
    }
}

fn check_json(d: &Device, s: &Settings, a: Agreement, pytorch: bool) -> CheckJson {
    CheckJson {
        trace: d.name.clone(),
        recorded_by: if pytorch { "pytorch" } else { "other" },
        device: d.device,
        settings: s.label(),
        exact: a.exact(),
        segments_recorded: a.segments_recorded,
        segments_simulated: a.segments_simulated,
        segments_matching: a.segments_matching,
        blocks_checked: a.blocks_checked,
        block_offsets_matching: a.block_offsets_matching,
        starts_empty: a.starts_empty,
        initial_segments: a.initial_segments,
        first_mismatch: a.first_mismatch,
    }
}

/// Bytes as people read them: `20.0 MiB`.
fn human(b: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// A time since the run began: `147.0 us`, `3.2 ms`, `12.345 s`.
fn duration(ns: u64) -> String {
    let t = ns as f64;
    if ns < 1_000 {
        format!("{ns} ns")
    } else if ns < 1_000_000 {
        format!("{:.1} us", t / 1e3)
    } else if ns < 1_000_000_000 {
        format!("{:.1} ms", t / 1e6)
    } else {
        format!("{:.3} s", t / 1e9)
    }
}

fn table(heading: &str, r: &ReportJson, notes: &[String], min: bool) -> String {
    let mut s = String::new();
    let cap = match r.capacity_bytes {
        Some(c) => format!("{} ({})", human(c), r.capacity_source),
        None => "none known (pass --capacity; nothing fails)".into(),
    };
    s.push_str(&format!(
        "{heading}: {} requests; recorded reserved peak {}; capacity {cap}\n",
        r.requests,
        human(r.recorded_reserved_peak_bytes)
    ));
    for n in notes {
        s.push_str(&format!("note: {n}\n"));
    }
    let mut header = vec![
        "settings".to_string(),
        "reserved peak".into(),
        "allocated peak".into(),
        "fragmentation".into(),
        "inactive split".into(),
        "fits".into(),
    ];
    if min {
        header.push("min capacity".into());
    }
    header.push("first failure".into());
    let rows: Vec<Vec<String>> = r
        .runs
        .iter()
        .map(|run| {
            let mut row = vec![
                if run.recorded {
                    format!("recorded ({})", run.label)
                } else {
                    run.label.clone()
                },
                human(run.reserved_peak_bytes),
                human(run.allocated_peak_bytes),
                human(run.fragmentation_bytes),
                human(run.inactive_split_bytes),
                if r.capacity_bytes.is_none() {
                    "-".into()
                } else if run.fits {
                    "yes".into()
                } else {
                    "no".into()
                },
            ];
            if min {
                row.push(run.min_capacity_bytes.map_or("-".into(), human));
            }
            row.push(match &run.first_failure {
                None => "-".into(),
                Some(f) => format!(
                    "{} at {} ({} allocated of {} reserved){}",
                    human(f.requested_bytes),
                    duration(f.ns),
                    human(f.allocated_bytes),
                    human(f.reserved_bytes),
                    f.line
                        .as_deref()
                        .map_or(String::new(), |l| format!(", {l}"))
                ),
            });
            row
        })
        .collect();
    let cols = header.len();
    let width: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .map(|r| r[c].chars().count())
                .chain([header[c].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: &[String]| {
        let mut l = String::new();
        for (c, cell) in cells.iter().enumerate() {
            if c > 0 {
                l.push_str("  ");
            }
            let pad = width[c] - cell.chars().count();
            // Figures right-aligned; names and the failure left.
            if c == 0 || c == cols - 1 {
                l.push_str(cell);
                if c != cols - 1 {
                    l.push_str(&" ".repeat(pad));
                }
            } else {
                l.push_str(&" ".repeat(pad));
                l.push_str(cell);
            }
        }
        l.trim_end().to_string() + "\n"
    };
    s.push_str(&line(&header));
    for row in &rows {
        s.push_str(&line(row));
    }
    for run in &r.runs {
        let Some(f) = &run.first_failure else {
            continue;
        };
        let live: Vec<String> = f
            .live_top_lines
            .iter()
            .map(|l| {
                format!(
                    "{} {}",
                    human(l.bytes),
                    l.line.as_deref().unwrap_or("(no stack)")
                )
            })
            .collect();
        if !live.is_empty() {
            s.push_str(&format!(
                "live at the first failure of {}: {}\n",
                if run.recorded {
                    "the recorded settings"
                } else {
                    &run.label
                },
                live.join(", ")
            ));
        }
    }
    s
}

fn check_table(checks: &[CheckJson]) -> String {
    let mut s = String::new();
    for c in checks {
        s.push_str(&format!(
            "{} (device {}, settings {}): {}\n",
            c.trace,
            c.device,
            c.settings,
            if c.exact {
                "the model agrees with every recorded segment and block"
            } else {
                "the model disagrees"
            }
        ));
        s.push_str(&format!(
            "  segments: {} recorded, {} simulated, {} matching in size and order\n",
            c.segments_recorded, c.segments_simulated, c.segments_matching
        ));
        s.push_str(&format!(
            "  blocks: {} of {} at the recorded offset in the recorded segment\n",
            c.block_offsets_matching, c.blocks_checked
        ));
        if !c.starts_empty && c.initial_segments > 0 {
            s.push_str(&format!(
                "  the recording began with {} segments held: the model starts from them, as the snapshot's segments imply\n",
                c.initial_segments
            ));
        } else if !c.starts_empty {
            s.push_str(
                "  note: the recording did not start with the allocator empty and its segments do not say how it was: the model started empty\n",
            );
        }
        if c.recorded_by != "pytorch" {
            s.push_str(
                "  note: only a PyTorch snapshot records the caching allocator's own segments: agreement is not expected here\n",
            );
        }
        if let Some(m) = &c.first_mismatch {
            s.push_str(&format!("  first difference: {m}\n"));
        }
    }
    if checks.is_empty() {
        s.push_str("no memory events to check\n");
    }
    s
}
