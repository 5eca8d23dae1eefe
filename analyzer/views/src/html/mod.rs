//! `poolsight html`: one self-contained interactive page (no network: script, style and data
//! inline). [`data`] computes what the page shows from replayed profiles, [`bound`] keeps it to
//! what a screen can show; [`page`] writes the HTML around it; [`names`] names the timeline's bands; `assets/` holds the hand-written
//! script and style it inlines.
//!
//! [`report_page`] and [`diff_page`] do both for opened traces: they take the live-bytes
//! snapshots the timeline needs (one more walk over each trace's memory events, only here)
//! and render.

pub mod bound;
pub mod data;
pub mod names;
pub mod page;

pub use data::{diff, report, Part, ReportData};
pub use page::render;

use poolsight_analyzer::read::Trace;
use poolsight_analyzer::replay::{live_over_time, LiveOverTime, Profile};

/// Stacks kept per timeline point for the live-at-an-instant view (the rest are summed).
pub const LIVE_STACKS: usize = 128;

/// Categories and modules kept per timeline point (the rest are summed): a model's modules can
/// be many, and the timeline draws 10 bands.
pub const LIVE_GROUPS: usize = 32;

/// How a trace is named in the page: its rank and path, or its path.
pub fn trace_name(profile: &Profile) -> String {
    match profile.sources.first() {
        Some(s) => match s.rank {
            Some(r) => format!("rank {r} ({})", s.path),
            None => s.path.clone(),
        },
        None => String::new(),
    }
}

fn live(trace: &Trace, profile: &Profile) -> LiveOverTime {
    profile
        .sources
        .first()
        .map(|s| live_over_time(trace, &s.series, LIVE_STACKS, LIVE_GROUPS, &[]))
        .unwrap_or_default()
}

/// The page of the traces of one job: `profiles[i]` is `traces[i]` replayed (with
/// `live_at_peak`, for the peak flamegraph).
pub fn report_page(title: &str, traces: &[Trace], profiles: &[Profile]) -> String {
    let lives: Vec<LiveOverTime> = traces
        .iter()
        .zip(profiles)
        .map(|(t, p)| live(t, p))
        .collect();
    let parts: Vec<Part> = profiles
        .iter()
        .zip(&lives)
        .map(|(profile, live)| Part {
            name: trace_name(profile),
            profile,
            live,
        })
        .collect();
    let merged = Profile::merge(profiles.to_vec());
    let mut data = report(title, &parts, &merged);
    data.oom = oom_text(traces, profiles);
    render(&data)
}

/// `poolsight oom`'s text ([`poolsight_analyzer::tables::oom::section`]) for the traces that hold an
/// out-of-memory, if any does.
fn oom_text(traces: &[Trace], profiles: &[Profile]) -> Option<String> {
    let held: Vec<&Trace> = traces
        .iter()
        .zip(profiles)
        .filter(|(_, p)| p.sources.iter().any(|s| s.pool.out_of_memory > 0))
        .map(|(t, _)| t)
        .collect();
    if held.is_empty() {
        return None;
    }
    // The section `oom` and `report` show, the model's advice included.
    let (ooms, _) = poolsight_analyzer::tables::oom::section(held);
    Some(poolsight_analyzer::tables::oom::render_table(&ooms, |id| {
        poolsight_analyzer::tables::oom::device_name(traces, id)
    }))
}

/// The page comparing a base run with a new one, each an opened trace and its replay.
pub fn diff_page(title: &str, base: (&Trace, &Profile), new: (&Trace, &Profile)) -> String {
    let (base_live, new_live) = (live(base.0, base.1), live(new.0, new.1));
    let base = Part {
        name: format!("base: {}", trace_name(base.1)),
        profile: base.1,
        live: &base_live,
    };
    let new = Part {
        name: format!("new: {}", trace_name(new.1)),
        profile: new.1,
        live: &new_live,
    };
    render(&diff(title, &base, &new))
}
