//! `whatif`: a run's requests replayed through a model of an allocator
//! (`poolsight-alloc-models`): PyTorch's caching allocator under the run's recorded settings
//! and alternatives, or CuPy's pool; per setting the reserved peak, fragmentation, whether
//! the run fits a capacity, the first request that would not, and the smallest capacity it
//! fits in. And [`check`]: the model, with the recorded settings, against the segments and
//! blocks a snapshot recorded. Pure functions of a trace and what the caller knows of the
//! allocator that recorded it ([`Recorded`]: a snapshot's `allocator_settings` and
//! `segments`, which the importer hands back); rendered apart ([`render`]).
//!
//! - [`devices`]: a trace's devices as requests, with their capacity;
//! - the figures `diff` compares (its `whatif` section) are a table's:
//!   [`crate::tables::whatif_figures`];
//! - [`advice`]: what the model says at an out-of-memory (`oom`'s advice).

pub mod advice;
mod check;
pub mod devices;
mod find;
pub mod render;

use rayon::prelude::*;
use serde::Serialize;

use poolsight_alloc_models::cupy;
use poolsight_alloc_models::pytorch::check::Held;
use poolsight_alloc_models::pytorch::replay::{min_capacity, replay, Config};
pub use poolsight_alloc_models::pytorch::{Settings, SettingsError};
use poolsight_alloc_models::replay::{self as model_replay, Outcome};

pub use check::{check, Check, HeldSegment};
use devices::{devices, Device};
pub use find::{find, open, FindError, Found};

use crate::read::Trace;
use crate::replay::request_line;
pub use poolsight_schema::header::AllocatorState;
use poolsight_schema::kinds::DeviceKind;

/// The allocator a run is replayed through.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Allocator {
    /// PyTorch's CUDA caching allocator, under settings.
    #[default]
    Pytorch,
    /// CuPy's memory pool (poolsight's own pool), which has no settings.
    Cupy,
}

impl Allocator {
    pub fn name(self) -> &'static str {
        match self {
            Allocator::Pytorch => "pytorch",
            Allocator::Cupy => "cupy",
        }
    }
}

impl std::str::FromStr for Allocator {
    type Err = String;

    fn from_str(s: &str) -> Result<Allocator, String> {
        match s {
            "pytorch" => Ok(Allocator::Pytorch),
            "cupy" => Ok(Allocator::Cupy),
            other => Err(format!("unknown allocator {other:?} (pytorch or cupy)")),
        }
    }
}

/// What is known of the allocator that recorded a trace: a snapshot's `allocator_settings`
/// and `segments` (the importer hands them back, and a trace it writes keeps them:
/// [`Recorded::of_trace`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Recorded {
    /// A snapshot's `allocator_settings`; PyTorch's defaults for other traces.
    pub settings: Settings,
    /// A snapshot's `segments` at its end (the state a recording that did not begin empty
    /// started from, for [`check`]).
    pub held: Vec<HeldSegment>,
}

impl Recorded {
    /// What a snapshot recorded of its allocator, as the model reads it: its
    /// `allocator_settings` (PyTorch's defaults where it has none) and the segments it held.
    pub fn from_state(state: &AllocatorState) -> Result<Recorded, SettingsError> {
        let settings = match &state.settings {
            Some(pairs) => Settings::from_recorded(pairs)?,
            None => Settings::default(),
        };
        let held = (state.segments.iter())
            .map(|s| HeldSegment {
                device: s.device,
                expandable: s.expandable,
                segment: Held {
                    addr: s.address,
                    size: s.total_size,
                    small: s.small,
                    allocated: s.allocated.clone(),
                },
            })
            .collect();
        Ok(Recorded { settings, held })
    }

    /// What `trace` keeps of the allocator that made it: a trace `poolsight import` converted
    /// from a snapshot keeps its settings and segments (format 1.7); PyTorch's defaults for any
    /// other trace (and for one whose settings no longer parse).
    pub fn of_trace(trace: &Trace) -> Recorded {
        (trace.header.import.as_ref())
            .and_then(|i| i.allocator.as_ref())
            .and_then(|state| Recorded::from_state(state).ok())
            .unwrap_or_default()
    }
}

/// Whether PyTorch's caching allocator made the decisions `trace` records: a PyTorch
/// snapshot converted by `poolsight import` (or by any command handed one).
pub fn recorded_by_pytorch(trace: &Trace) -> bool {
    trace
        .header
        .import
        .as_ref()
        .is_some_and(|i| i.kind == "pytorch-snapshot")
}

/// How to replay.
#[derive(Debug, Clone, Default)]
pub struct Options {
    pub allocator: Allocator,
    /// Alternatives to the recorded settings, each applied over them; empty: a few sensible
    /// ones ([`default_alternatives`]). PyTorch's allocator only.
    pub alternatives: Vec<Settings>,
    /// The bytes the allocator may take from the device; `None`: what the trace says.
    pub capacity: Option<u64>,
    /// Also search the smallest capacity each setting fits in.
    pub min_capacity: bool,
}

/// Why a replay was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WhatifError {
    #[error("CuPy's pool has no settings: --setting is for --allocator pytorch")]
    CupySettings,
    #[error("--check compares PyTorch's caching allocator with a snapshot's segments: it takes no --allocator cupy")]
    CupyCheck,
}

/// The alternatives tried when none are given: expandable segments, a split limit, rounding
/// to powers of two, and garbage collection (which acts only under a memory fraction).
pub const DEFAULT_ALTERNATIVES: [&str; 4] = [
    "expandable_segments:True",
    "max_split_size_mb:128",
    "roundup_power2_divisions:4",
    "garbage_collection_threshold:0.6,per_process_memory_fraction:1.0",
];

/// [`DEFAULT_ALTERNATIVES`] over `recorded`.
pub fn default_alternatives(recorded: &Settings) -> Vec<Settings> {
    DEFAULT_ALTERNATIVES
        .iter()
        .filter_map(|c| Settings::parse(c).ok())
        .map(|a| a.over(recorded))
        .collect()
}

/// The request that would not fit, as a person reads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Failure {
    pub ns: u64,
    pub requested_bytes: u64,
    /// The line that asked (the innermost frame of its stack).
    pub line: Option<String>,
    pub stream: u32,
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    pub live_blocks: u64,
    /// What was live: the lines whose blocks held the most bytes.
    pub live_top_lines: Vec<LiveLine>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LiveLine {
    pub line: Option<String>,
    pub bytes: u64,
}

/// One setting's replay.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Run {
    /// The options that differ from PyTorch's defaults (`{}` for the defaults).
    pub settings: serde_json::Map<String, serde_json::Value>,
    pub label: String,
    /// The run's recorded settings (the first row).
    pub recorded: bool,
    pub reserved_peak_bytes: u64,
    pub allocated_peak_bytes: u64,
    pub fragmentation_bytes: u64,
    pub inactive_split_bytes: u64,
    pub segments_at_peak: u64,
    pub fits: bool,
    pub failures: u64,
    pub first_failure: Option<Failure>,
    pub min_capacity_bytes: Option<u64>,
}

/// One device of one trace, replayed under each setting.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// The trace (with the device when it has several); in the JSON only when a document
    /// holds several reports.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace: Option<String>,
    /// The report's heading in the table.
    #[serde(skip)]
    pub heading: String,
    pub allocator: Allocator,
    pub capacity_bytes: Option<u64>,
    pub capacity_source: &'static str,
    pub device: u32,
    pub requests: u64,
    pub recorded_reserved_peak_bytes: u64,
    pub runs: Vec<Run>,
    /// Notes under the heading.
    #[serde(skip)]
    pub notes: Vec<String>,
}

/// `trace` (named `name`) replayed device by device under the recorded settings and the
/// alternatives of `opts` (CuPy's pool: one run), the settings in parallel.
pub fn whatif(
    trace: &Trace,
    name: &str,
    recorded: &Recorded,
    opts: &Options,
) -> Result<Vec<Report>, WhatifError> {
    if opts.allocator == Allocator::Cupy && !opts.alternatives.is_empty() {
        return Err(WhatifError::CupySettings);
    }
    let mut devices = devices(trace, opts.capacity);
    // The host memory of a PyTorch file (a snapshot's pinned memory, a profiler trace's CPU
    // memory) was not the CUDA caching allocator's: replayed through it, it would read as a
    // GPU's. Left out beside a GPU device (a trace of host memory alone is replayed, as asked).
    if opts.allocator == Allocator::Pytorch && trace.header.import.is_some() {
        let host =
            |id: u32| (trace.defs.devices.iter()).any(|d| d.id == id && d.kind == DeviceKind::Cpu);
        if devices.iter().any(|d| !host(d.device)) {
            devices.retain(|d| !host(d.device));
        }
    }
    let several = devices.len() > 1;
    Ok(devices
        .into_iter()
        .map(|d| {
            let heading = if several {
                format!("{name} (device {})", d.device)
            } else {
                name.to_string()
            };
            report(trace, heading, &d, recorded, opts)
        })
        .collect())
}

/// The settings a device is replayed under: the recorded ones first, then each alternative
/// over them, each once.
pub fn settings_to_try(recorded: &Settings, alternatives: &[Settings]) -> Vec<(Settings, bool)> {
    let mut runs = vec![(recorded.clone(), true)];
    let alts = if alternatives.is_empty() {
        default_alternatives(recorded)
    } else {
        alternatives.iter().map(|a| a.over(recorded)).collect()
    };
    for a in alts {
        if !runs.iter().any(|(s, _)| *s == a) {
            runs.push((a, false));
        }
    }
    runs
}

/// One setting replayed on a device: what it reserves, and with `min`, the smallest capacity
/// it fits in.
pub(crate) fn replay_device(
    d: &Device,
    allocator: Allocator,
    settings: &Settings,
    min: bool,
) -> (Outcome, Option<u64>) {
    match allocator {
        Allocator::Pytorch => {
            let cfg = Config {
                settings: settings.clone(),
                capacity: d.capacity,
                stop_at_failure: false,
            };
            let o = replay(&d.requests, &cfg);
            (
                o,
                min.then(|| min_capacity(&d.requests, settings)).flatten(),
            )
        }
        Allocator::Cupy => {
            let o = model_replay::replay(cupy::Pool::new(d.capacity), &d.requests, false);
            let m = min.then(|| {
                let start =
                    model_replay::replay(cupy::Pool::new(None), &d.requests, false).reserved_peak;
                model_replay::min_capacity(
                    &d.requests,
                    cupy::ALLOCATION_UNIT_SIZE,
                    model_replay::requested_peak(&d.requests),
                    start,
                    cupy::Pool::new,
                )
            });
            (o, m.flatten())
        }
    }
}

fn report(
    trace: &Trace,
    heading: String,
    d: &Device,
    recorded: &Recorded,
    opts: &Options,
) -> Report {
    let runs = match opts.allocator {
        Allocator::Pytorch => settings_to_try(&recorded.settings, &opts.alternatives),
        Allocator::Cupy => vec![(Settings::default(), false)],
    };
    let results: Vec<(Outcome, Option<u64>)> = runs
        .par_iter()
        .map(|(s, _)| replay_device(d, opts.allocator, s, opts.min_capacity))
        .collect();
    let runs = runs
        .iter()
        .zip(results)
        .map(|((s, rec), (o, m))| {
            let label = match opts.allocator {
                Allocator::Pytorch => s.label(),
                Allocator::Cupy => "cupy".to_string(),
            };
            run(trace, s, label, *rec, o, m)
        })
        .collect();
    let mut notes = Vec::new();
    if d.held_at_start > 0 {
        notes.push(format!(
            "the trace began with {} already reserved; the model starts empty",
            render::human(d.held_at_start)
        ));
    }
    Report {
        trace: None,
        heading,
        allocator: opts.allocator,
        capacity_bytes: d.capacity,
        capacity_source: d.capacity_source.text(),
        device: d.device,
        requests: d.requests.iter().filter(|r| is_request(r.op)).count() as u64,
        recorded_reserved_peak_bytes: d.recorded_reserved_peak,
        runs,
        notes,
    }
}

fn is_request(op: poolsight_alloc_models::replay::Op) -> bool {
    use poolsight_alloc_models::replay::Op;
    matches!(op, Op::Malloc | Op::OutOfMemory)
}

fn run(
    trace: &Trace,
    s: &Settings,
    label: String,
    recorded: bool,
    o: Outcome,
    m: Option<u64>,
) -> Run {
    Run {
        settings: s
            .pairs()
            .into_iter()
            .map(|(k, v)| (k, serde_json::Value::String(v)))
            .collect(),
        label,
        recorded,
        reserved_peak_bytes: o.reserved_peak,
        allocated_peak_bytes: o.allocated_peak,
        fragmentation_bytes: o.fragmentation,
        inactive_split_bytes: o.inactive_split_at_peak,
        segments_at_peak: o.segments_at_peak,
        fits: o.first_failure.is_none(),
        failures: o.failures,
        first_failure: o.first_failure.map(|f| Failure {
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

/// The JSON document of `reports`: the one report's object, or an array of them, each with
/// its `trace`.
pub fn json(reports: &[Report]) -> serde_json::Value {
    let with_trace = reports.len() != 1;
    let values = reports.iter().map(|r| {
        let mut r = r.clone();
        if with_trace {
            r.trace = Some(r.heading.clone());
        }
        serde_json::to_value(&r).unwrap_or(serde_json::Value::Null)
    });
    if with_trace {
        serde_json::Value::Array(values.collect())
    } else {
        values.into_iter().next().unwrap_or(serde_json::Value::Null)
    }
}

/// The JSON document of checks: `{"checks": [...]}`.
pub fn checks_json(checks: &[Check]) -> serde_json::Value {
    serde_json::json!({ "checks": checks })
}
