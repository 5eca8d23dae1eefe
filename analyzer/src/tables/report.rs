//! `report`: every report at once, plus the headline figures a reader looks at first and a
//! CI diff gates on (peak used and acquired bytes, allocations, wall time).

use serde::Serialize;

use crate::replay::Profile;
use crate::tables::epochs::{self, Epochs};
use crate::tables::functions::{self, Functions, Unit};
use crate::tables::lines::{self, Lines};
use crate::tables::render::{humanized, seconds};
use crate::tables::timers::{self, TimeUnit, Timers, Which};

/// Headline figures. With several traces (ranks), peaks are the largest rank's and counts
/// are summed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Summary {
    pub traces: Vec<String>,
    pub events: u64,
    pub duration_ns: u64,
    pub peak_used_bytes: u64,
    pub peak_acquired_bytes: u64,
    /// Pool mallocs that succeeded.
    pub total_allocations: u64,
    /// Pool misses that went to the device.
    pub device_allocations: u64,
    pub out_of_memory: u64,
    pub warnings: Vec<String>,
}

pub fn summary(p: &Profile) -> Summary {
    let s = &p.sources;
    Summary {
        traces: s.iter().map(|s| s.path.clone()).collect(),
        events: s.iter().map(|s| s.events).sum(),
        duration_ns: p.duration_ns(),
        peak_used_bytes: s.iter().map(|s| s.pool.peak_used_bytes).max().unwrap_or(0),
        peak_acquired_bytes: s
            .iter()
            .map(|s| s.pool.peak_acquired_bytes)
            .max()
            .unwrap_or(0),
        total_allocations: s.iter().map(|s| s.pool.mallocs).sum(),
        device_allocations: s.iter().map(|s| s.pool.device_allocs).sum(),
        out_of_memory: s.iter().map(|s| s.pool.out_of_memory).sum(),
        warnings: s
            .iter()
            .flat_map(|s| s.warnings.iter().map(move |w| format!("{}: {w}", s.path)))
            .collect(),
    }
}

pub fn render_summary(s: &Summary) -> String {
    let ooms = if s.out_of_memory > 0 {
        format!("; {} out-of-memory errors", s.out_of_memory)
    } else {
        String::new()
    };
    // Live bytes at the peak first: that is what fills a device. The tables below count
    // cumulative bytes, which a reader could mistake for it, so the headline says so.
    format!(
        "peak live {} (the pool held at most {} from the device); {} allocations ({} from the device){ooms}; {} events over {}\n\
         functions and lines below count cumulative bytes: every allocation request, frees not subtracted\n",
        humanized(s.peak_used_bytes),
        humanized(s.peak_acquired_bytes),
        s.total_allocations,
        s.device_allocations,
        s.events,
        seconds(s.duration_ns),
    )
}

/// How each section is computed and printed.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReportOptions {
    pub unit: Unit,
    pub with_self: bool,
    pub max_depth: usize,
    pub timers: Which,
    pub time_unit: TimeUnit,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    pub summary: Summary,
    pub functions: Functions,
    pub lines: Lines,
    pub timers: Timers,
    pub epochs: Epochs,
}

/// All reports. Each is independent; rayon runs them side by side.
pub fn compute(p: &Profile, opts: &ReportOptions) -> Report {
    let ((functions, lines), (timers, epochs)) = rayon::join(
        || {
            rayon::join(
                || functions::functions(p),
                || lines::lines(p, opts.max_depth),
            )
        },
        || rayon::join(|| timers::timers(p), || epochs::epochs(p)),
    );
    Report {
        summary: summary(p),
        functions,
        lines,
        timers,
        epochs,
    }
}

pub fn render_table(r: &Report, opts: &ReportOptions) -> String {
    [
        render_summary(&r.summary),
        functions::render_table(&r.functions, opts.unit, opts.with_self),
        lines::render_table(&r.lines),
        timers::render_table(&r.timers, opts.timers, opts.time_unit),
        epochs::render_table(&r.epochs),
    ]
    .join("\n")
}

/// CSV of every section, one after another, each headed by a `# section` line.
/// The sections of a report, each one CSV table (a CSV file holds one table, so that pandas,
/// DuckDB or a spreadsheet load it as it is).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    Summary,
    Functions,
    Lines,
    Timers,
    Epochs,
}

impl Section {
    pub const ALL: [Section; 5] = [
        Section::Summary,
        Section::Functions,
        Section::Lines,
        Section::Timers,
        Section::Epochs,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Section::Summary => "summary",
            Section::Functions => "functions",
            Section::Lines => "lines",
            Section::Timers => "timers",
            Section::Epochs => "epochs",
        }
    }
}

/// The headline figures as one CSV row (the trace paths joined by `;`).
#[derive(Debug, Default, Serialize)]
struct SummaryRow {
    traces: String,
    events: u64,
    duration_ns: u64,
    peak_used_bytes: u64,
    peak_acquired_bytes: u64,
    total_allocations: u64,
    device_allocations: u64,
    out_of_memory: u64,
    warnings: u64,
}

/// One section of the report as a CSV table.
pub fn render_csv(r: &Report, section: Section) -> String {
    match section {
        Section::Summary => {
            let s = &r.summary;
            crate::tables::csv::to_csv(&[SummaryRow {
                traces: s.traces.join(";"),
                events: s.events,
                duration_ns: s.duration_ns,
                peak_used_bytes: s.peak_used_bytes,
                peak_acquired_bytes: s.peak_acquired_bytes,
                total_allocations: s.total_allocations,
                device_allocations: s.device_allocations,
                out_of_memory: s.out_of_memory,
                warnings: s.warnings.len() as u64,
            }])
        }
        Section::Functions => functions::render_csv(&r.functions),
        Section::Lines => lines::render_csv(&r.lines),
        Section::Timers => timers::render_csv(&r.timers),
        Section::Epochs => epochs::render_csv(&r.epochs),
    }
}
