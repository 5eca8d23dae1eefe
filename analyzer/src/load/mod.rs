//! Loading: the files of one job (its ranks) made into the profiles every report is computed
//! from. In order:
//!
//! 1. [`inputs`]: each file the user named becomes an [`Input`] — a trace as it is, another
//!    tool's file (a PyTorch snapshot or profiler trace) converted by the [`Resolver`] the
//!    caller provides — that keeps the name the user gave it;
//! 2. `job`: the traces are opened (their stacks shown through the frames the options ask
//!    for, `frames`), put in a fixed order (rank, then path), and checked as a set;
//! 3. the traces are replayed (`replay`), each chunk's checksum checked as the replay reads
//!    it, the files opened again, every checksum checked first, if one fails;
//! 4. [`Loaded::views`]: the merged profile, or one per rank.
//!
//! Every front end (the CLI, the Python module) loads through here, so that the same files give
//! the same report. Nothing here prints: what was wrong with part of a file comes back as
//! [`LoadWarning`]s, whether a run is whole enough to compare as [`incomplete`]'s phrases, and
//! replay progress as a byte counter ([`ReplayOptions::progress`]) plus the total it counts up
//! to, handed to a callback before the replay starts.

mod frames;
pub use frames::default_frames;
pub mod incomplete;
mod inputs;
mod job;

use std::fmt;
use std::path::{Path, PathBuf};

pub use inputs::{ConvertError, Converted, Input, Inputs, Resolver};
pub use job::{same_recording, Opened};
pub use poolsight_frames::FrameFilter;

use crate::read::{ReadError, Trace, Warning};
use crate::replay::{progress_total, replay, Profile, ReplayOptions};

/// How to load the files of a job.
#[derive(Clone, Copy, Default)]
pub struct LoadOptions<'r> {
    /// Which frames of each stack to show (`--frames`): handed to the resolver for the files it
    /// converts (`User` when `None`), and applied to poolsight traces with foreign (Python)
    /// frames as they are opened. `None`: each trace's own default ([`default_frames`]).
    pub frames: Option<FrameFilter>,
    /// Converts the files that are not traces; `None`: every file must be a trace.
    pub resolver: Option<&'r dyn Resolver>,
}

/// Why traces could not be loaded together.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Read(#[from] ReadError),
    /// A directory named where a trace file is expected (opening it would report the operating
    /// system's "No such device" or "Is a directory").
    #[error("{} is a directory, not a trace file (name the *.pstrace files in it)", path.display())]
    Directory { path: PathBuf },
    /// A file the resolver took could not be converted.
    #[error(transparent)]
    Convert(ConvertError),
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

impl LoadWarning {
    /// The warning on one line, however many a verifier's message holds (what a front end
    /// prints after `poolsight: warning: `).
    pub fn one_line(&self) -> String {
        self.to_string()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    }
}

impl fmt::Display for LoadWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.warning)
    }
}

impl Inputs {
    /// Opens the traces with every checksum checked (see [`Inputs`] and [`Opened`]), for what
    /// reads them without replaying them (an export of their events).
    pub fn open(&self) -> Result<Opened, LoadError> {
        job::open(self, false)
    }

    /// Opens and replays the traces: each trace's index is its position in the fixed order,
    /// which orders first-seen rows across merged traces. `on_start` gets the total that
    /// [`ReplayOptions::progress`] will count up to, before any work.
    pub fn load(
        &self,
        opts: &ReplayOptions,
        on_start: impl FnOnce(u64),
    ) -> Result<Loaded, LoadError> {
        // Checksums are checked as the replay reads each chunk (one pass over the file, not two).
        let Opened { traces, warnings } = job::open(self, true)?;
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
        let Opened { traces, warnings } = self.open()?;
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
}

fn replay_all(traces: &[Trace], opts: &ReplayOptions, on_start: impl FnOnce(u64)) -> Vec<Profile> {
    on_start(traces.iter().map(|t| progress_total(t, opts)).sum());
    traces
        .iter()
        .enumerate()
        .map(|(i, t)| replay(t, i as u32, opts))
        .collect()
}

/// Opens and replays the files at `paths` (see [`Inputs::resolve`] and [`Inputs::load`]).
pub fn load<P: AsRef<Path>>(
    paths: &[P],
    opts: &LoadOptions,
    replay: &ReplayOptions,
    on_start: impl FnOnce(u64),
) -> Result<Loaded, LoadError> {
    Inputs::resolve(paths, opts)?.load(replay, on_start)
}

/// Opens the traces at `paths` with every checksum checked, their frames as recorded, without
/// replaying them.
pub fn open_all<P: AsRef<Path>>(paths: &[P]) -> Result<Opened, LoadError> {
    let opts = LoadOptions {
        frames: Some(FrameFilter::All),
        resolver: None,
    };
    Inputs::resolve(paths, &opts)?.open()
}

/// Opened and replayed traces: the profiles in the traces' order.
pub struct Loaded {
    pub traces: Vec<Trace>,
    pub profiles: Vec<Profile>,
    pub warnings: Vec<LoadWarning>,
}

/// A profile to report on, with the heading it is printed under (empty for the merged one).
pub struct View {
    pub heading: String,
    pub profile: Profile,
}

impl Loaded {
    /// The merged profile, or with `per_rank` and several profiles one per trace, headed by
    /// its rank and path.
    pub fn into_views(self, per_rank: bool) -> Vec<View> {
        views(self.profiles, per_rank)
    }
}

/// `profiles` merged, or with `per_rank` and several of them one per trace, headed by its
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
