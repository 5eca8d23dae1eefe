//! Loading: opening the traces of one job (its ranks), putting them in a fixed order, replaying
//! them, and the views the reports are computed from (merged, or one per rank). Every front end
//! (the CLI, bindings) loads through here, so that the same files give the same report.
//!
//! Nothing here prints: what was wrong with part of a file comes back as [`LoadWarning`]s, and
//! replay progress as a byte counter ([`ReplayOptions::progress`]) plus the total it counts up
//! to, handed to a callback before the replay starts.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::read::{Header, ReadError, Trace, Warning};
use crate::replay::{progress_total, replay, Profile, ReplayOptions};

/// Why traces could not be loaded together.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Read(#[from] ReadError),
    /// One file named twice (or two copies of it): merging would double every figure.
    #[error("{} and {} are the same trace: each file of a job can be given once", first.display(), second.display())]
    SameTrace { first: PathBuf, second: PathBuf },
    /// Two traces claim the same rank of one run.
    #[error("{} and {} are both rank {rank} of the same run: give each rank once", first.display(), second.display())]
    SameRank {
        first: PathBuf,
        second: PathBuf,
        rank: u32,
    },
}

/// A damaged part of one trace that did not stop the rest from being read, or something
/// about the set of traces merged (ranks of different runs, a missing rank).
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

/// Missing ranks a warning names; it counts the rest.
const MISSING_RANKS_NAMED: usize = 32;

/// Opened traces in report order, and what was wrong with parts of them.
pub struct Opened {
    pub traces: Vec<Trace>,
    pub warnings: Vec<LoadWarning>,
}

/// Opens the traces, ordered by rank then path, so that the same files give the same output
/// whatever order they were named in. Warnings are in the order the paths were named.
///
/// The same file twice (by its header: process, host and start time), or the same rank of
/// one run twice, is an error; ranks of different runs (another command line or world size)
/// and ranks missing from a world size are warnings.
pub fn open_all<P: AsRef<Path>>(paths: &[P]) -> Result<Opened, LoadError> {
    open_with(paths, |p| Trace::open(p))
}

/// [`open_all`], each trace opened by `open`.
fn open_with<P: AsRef<Path>>(
    paths: &[P],
    open: fn(&Path) -> Result<Trace, ReadError>,
) -> Result<Opened, LoadError> {
    let mut traces = Vec::with_capacity(paths.len());
    for p in paths {
        traces.push(open(p.as_ref())?);
    }
    check_duplicates(&traces)?;
    let mut warnings: Vec<LoadWarning> = traces
        .iter()
        .flat_map(|t| {
            t.warnings.iter().map(|w| LoadWarning {
                path: t.path.clone(),
                warning: w.clone(),
            })
        })
        .collect();
    warnings.extend(set_warnings(&traces));
    traces.sort_by(|a, b| (a.header.rank, &a.path).cmp(&(b.header.rank, &b.path)));
    Ok(Opened { traces, warnings })
}

/// What tells one run from another: its command line and world size.
fn run_of(t: &Trace) -> (&[String], Option<u32>) {
    (&t.header.command_line, t.header.world_size)
}

/// Whether two headers are of one recording (the same file, or a copy of it): same process,
/// host, start and rank. The rank counts because one process writes several ranks when it
/// converts PyTorch files (`poolsight import a.pickle b.pickle`), and two snapshots written in
/// the same instant, of the same length, convert to the same start.
pub fn same_recording(a: &Header, b: &Header) -> bool {
    // An imported trace is also its source file: one process may convert several at once.
    let source = |h: &Header| {
        h.import
            .as_ref()
            .map(|i| (i.path.clone(), i.bytes, i.entries))
    };
    (a.pid, &a.host, a.unix_ns, a.ticks0, a.rank, source(a))
        == (b.pid, &b.host, b.unix_ns, b.ticks0, b.rank, source(b))
}

fn check_duplicates(traces: &[Trace]) -> Result<(), LoadError> {
    for (i, a) in traces.iter().enumerate() {
        for b in &traces[..i] {
            let (ha, hb) = (&a.header, &b.header);
            if same_recording(ha, hb) {
                return Err(LoadError::SameTrace {
                    first: b.path.clone(),
                    second: a.path.clone(),
                });
            }
            if let (Some(ra), Some(rb)) = (ha.rank, hb.rank) {
                if ra == rb && run_of(a) == run_of(b) {
                    return Err(LoadError::SameRank {
                        first: b.path.clone(),
                        second: a.path.clone(),
                        rank: ra,
                    });
                }
            }
        }
    }
    Ok(())
}

fn set_warnings(traces: &[Trace]) -> Vec<LoadWarning> {
    let mut out = Vec::new();
    let Some(first) = traces.first() else {
        return out;
    };
    let warn = |t: &Trace, what: String| LoadWarning {
        path: t.path.clone(),
        warning: Warning {
            offset: 0,
            what,
            torn: false,
        },
    };
    for t in &traces[1..] {
        if run_of(t) != run_of(first) {
            out.push(warn(
                t,
                format!(
                    "merged with {}, but from another run (command line or world size differ)",
                    first.path.display()
                ),
            ));
        }
    }
    {
        if let Some(world) = first.header.world_size {
            // A damaged header can claim billions of ranks: count the missing ones, name a few.
            let mut given: Vec<u32> = traces
                .iter()
                .filter_map(|t| t.header.rank)
                .filter(|&r| r < world)
                .collect();
            given.sort_unstable();
            given.dedup();
            let missing = world as u64 - given.len() as u64;
            let named: Vec<String> = (0..world)
                .filter(|r| given.binary_search(r).is_err())
                .take(MISSING_RANKS_NAMED)
                .map(|r| r.to_string())
                .collect();
            if missing > 0 {
                let more = missing - named.len() as u64;
                let tail = if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                };
                out.push(warn(
                    first,
                    format!(
                        "world size {world}, but rank(s) {}{tail} not given: figures cover only the ranks given",
                        named.join(", ")
                    ),
                ));
            }
        }
    }
    out
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
) -> Result<Loaded, LoadError> {
    // Checksums are checked as the replay reads each chunk (one pass over the file, not two).
    let Opened { traces, warnings } = open_with(paths, |p| Trace::open_deferred(p))?;
    let profiles = replay_all(&traces, opts, on_start);
    if traces.iter().all(Trace::checksums_hold) {
        return Ok(Loaded {
            traces,
            profiles,
            warnings,
        });
    }
    // A chunk was corrupted: open the files again, every checksum checked first, so that the
    // corrupted chunks are named and left out, and replay what remains.
    let Opened { traces, warnings } = open_all(paths)?;
    let opts = ReplayOptions {
        progress: None,
        ..opts.clone()
    };
    let profiles = replay_all(&traces, &opts, |_| {});
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

#[cfg(test)]
mod tests {
    use super::*;

    fn header(rank: Option<u32>) -> Header {
        Header {
            format_major: 1,
            format_minor: 5,
            writer: String::new(),
            ticks0: 7,
            mono_ns: 0,
            unix_ns: 1_700_000_000_000_000_000,
            ticks_per_ns: 1.0,
            pid: 42,
            host: "vm".into(),
            command_line: Vec::new(),
            rank,
            world_size: Some(2),
            ring: None,
            chunk_size: 65536,
            cpu_source: poolsight_schema::fb::CpuSource::None,
            devices: Vec::new(),
            packed: false,
            import: None,
        }
    }

    #[test]
    fn one_process_two_ranks_are_two_recordings() {
        assert!(same_recording(&header(Some(0)), &header(Some(0))));
        assert!(!same_recording(&header(Some(0)), &header(Some(1))));
        assert!(same_recording(&header(None), &header(None)));
    }
}
