//! Loading: opening the traces of one job (its ranks), putting them in a fixed order, replaying
//! them, and the views the reports are computed from (merged, or one per rank). Every front end
//! (the CLI, bindings) loads through here, so that the same files give the same report.
//!
//! Nothing here prints: what was wrong with part of a file comes back as [`LoadWarning`]s, and
//! replay progress as a byte counter ([`ReplayOptions::progress`]) plus the total it counts up
//! to, handed to a callback before the replay starts.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::reader::{ReadError, Trace, Warning};
use crate::replay::{progress_total, replay, Profile, ReplayOptions};

/// A damaged part of one trace that did not stop the rest from being read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadWarning {
    pub path: PathBuf,
    pub warning: Warning,
}

impl fmt::Display for LoadWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.warning)
    }
}

/// Opened traces in report order, and what was wrong with parts of them.
pub struct Opened {
    pub traces: Vec<Trace>,
    pub warnings: Vec<LoadWarning>,
}

/// Opens the traces, ordered by rank then path, so that the same files give the same output
/// whatever order they were named in. Warnings are in the order the paths were named.
pub fn open_all<P: AsRef<Path>>(paths: &[P]) -> Result<Opened, ReadError> {
    let mut traces = Vec::with_capacity(paths.len());
    for p in paths {
        traces.push(Trace::open(p)?);
    }
    let warnings = traces
        .iter()
        .flat_map(|t| {
            t.warnings.iter().map(|w| LoadWarning {
                path: t.path.clone(),
                warning: w.clone(),
            })
        })
        .collect();
    traces.sort_by(|a, b| (a.header.rank, &a.path).cmp(&(b.header.rank, &b.path)));
    Ok(Opened { traces, warnings })
}

/// Replays opened traces in their order; each trace's index is its position, which orders
/// first-seen rows across merged traces. `on_start` gets the total that
/// [`ReplayOptions::progress`] will count up to, before any work.
pub fn replay_all(
    traces: &[Trace],
    opts: &ReplayOptions,
    on_start: impl FnOnce(u64),
) -> Vec<Profile> {
    on_start(traces.iter().map(|t| progress_total(t, opts)).sum());
    traces
        .iter()
        .enumerate()
        .map(|(i, t)| replay(t, i as u32, opts))
        .collect()
}

/// Opened and replayed traces: the profiles in the traces' order.
pub struct Loaded {
    pub traces: Vec<Trace>,
    pub profiles: Vec<Profile>,
    pub warnings: Vec<LoadWarning>,
}

/// Opens and replays the traces (see [`open_all`] and [`replay_all`]).
pub fn load<P: AsRef<Path>>(
    paths: &[P],
    opts: &ReplayOptions,
    on_start: impl FnOnce(u64),
) -> Result<Loaded, ReadError> {
    let Opened { traces, warnings } = open_all(paths)?;
    let profiles = replay_all(&traces, opts, on_start);
    Ok(Loaded {
        traces,
        profiles,
        warnings,
    })
}

/// A profile to report on, with the heading it is printed under (empty for the merged one).
pub struct View {
    pub heading: String,
    pub profile: Profile,
}

/// The merged profile, or with `per_rank` and several profiles one per trace, headed by its
/// rank and path.
pub fn views(profiles: Vec<Profile>, per_rank: bool) -> Vec<View> {
    if per_rank && profiles.len() > 1 {
        profiles
            .into_iter()
            .map(|profile| {
                let s = &profile.sources[0];
                let heading = match s.rank {
                    Some(r) => format!("rank {r} ({})", s.path),
                    None => s.path.clone(),
                };
                View { heading, profile }
            })
            .collect()
    } else {
        vec![View {
            heading: String::new(),
            profile: Profile::merge(profiles),
        }]
    }
}
