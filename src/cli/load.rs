//! The front door of every analysis command: opening the traces, replaying them (with a
//! progress bar on a terminal), and saying on stderr what was wrong with them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use poolsight::analyzer::read::load::{self, LoadWarning, Loaded};
use poolsight::analyzer::replay::CategoryPass;
use poolsight::analyzer::{Profile, ReplayOptions};

use super::args::Input;
use super::output::ProgressBar;

/// One warning line on stderr, whatever a verifier's message holds.
pub fn warn(w: &LoadWarning) {
    let text: String = w
        .to_string()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    eprintln!("poolsight: warning: {text}");
}

/// Opens and replays the traces ([`load::load`]: each chunk's checksum is checked as the
/// replay reads it), with a progress bar while replaying, then prints the warnings.
pub fn load_traces(paths: &[PathBuf], opts: ReplayOptions) -> anyhow::Result<Loaded> {
    for p in paths {
        check_trace_path(p)?;
    }
    let mut bar = ProgressBar::new();
    let opts = ReplayOptions {
        progress: Some(Arc::clone(&bar.done)),
        ..opts
    };
    let loaded = load::load(paths, &opts, |total| bar.begin("replaying", total));
    bar.finish();
    let loaded = loaded?;
    loaded.warnings.iter().for_each(warn);
    Ok(loaded)
}

/// The traces loaded for what shows the blocks live at the peak (`html`, the demo, a
/// flamegraph of the peak).
pub fn load_with_peak(traces: &[PathBuf]) -> anyhow::Result<Loaded> {
    load_traces(
        traces,
        ReplayOptions {
            live_at_peak: true,
            ..ReplayOptions::default()
        },
    )
}

/// A directory named where a trace file is expected gets its own message (opening it would
/// report the operating system's "No such device" or "Is a directory").
pub fn check_trace_path(path: &Path) -> anyhow::Result<()> {
    anyhow::ensure!(
        !path.is_dir(),
        "{} is a directory, not a trace file (name the *.pstrace files in it)",
        path.display()
    );
    Ok(())
}

/// The traces' profiles (see [`load_traces`]), for a picture or an export of them (no
/// categories).
pub fn load_profiles(paths: &[PathBuf], live_at_peak: bool) -> anyhow::Result<Vec<Profile>> {
    let opts = ReplayOptions {
        live_at_peak,
        categories: CategoryPass::Never,
        ..ReplayOptions::default()
    };
    Ok(load_traces(paths, opts)?.profiles)
}

/// The input's merged profile, or one per trace with `--per-rank`, each with its heading;
/// `categories` says when the replay computes bytes by category and module.
pub fn profiles_of(
    input: &Input,
    categories: CategoryPass,
) -> anyhow::Result<Vec<(String, Profile)>> {
    let opts = ReplayOptions {
        categories,
        ..ReplayOptions::default()
    };
    let profiles = load_traces(&input.traces, opts)?.profiles;
    Ok(load::views(profiles, input.per_rank)
        .into_iter()
        .map(|v| (v.heading, v.profile))
        .collect())
}

/// The input loaded, and `f` computed for each of its profiles (see [`profiles_of`]).
pub fn computed<T>(
    input: &Input,
    categories: CategoryPass,
    f: impl Fn(&Profile) -> T,
) -> anyhow::Result<Vec<(String, T)>> {
    Ok(profiles_of(input, categories)?
        .into_iter()
        .map(|(name, p)| (name, f(&p)))
        .collect())
}
