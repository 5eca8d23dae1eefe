//! The front door of every analysis command: opening the traces, replaying them (with a
//! progress bar on a terminal), and saying on stderr what was wrong with them.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use poolsight::analyzer::read::load::{self, LoadWarning, Loaded};
use poolsight::analyzer::replay::CategoryPass;
use poolsight::analyzer::{Profile, ReplayOptions};

use super::args::Input;
use super::import::{convert, is_pytorch_file, ranks_of, Settings};
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

/// PyTorch files converted for this command: (temporary directory, trace in it, the file
/// as named). The directories go when the command ends ([`forget_conversions`]).
static CONVERTED: Mutex<Vec<(tempfile::TempDir, PathBuf, PathBuf)>> = Mutex::new(Vec::new());

/// The conversion settings of this command (`--frames`).
static SETTINGS: Mutex<Settings> = Mutex::new(Settings {
    frames: poolsight_import::FrameFilter::User,
});

pub fn set_settings(s: Settings) {
    *SETTINGS.lock().unwrap_or_else(|e| e.into_inner()) = s;
}

/// The traces to read for `paths`: a trace as it is; a PyTorch snapshot or profiler trace
/// (known by its content) converted into a temporary trace, once per command. Several
/// snapshots without ranks in their names are ranks in the order given.
pub fn inputs(paths: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let foreign: Vec<PathBuf> = paths
        .iter()
        .filter(|p| is_pytorch_file(p))
        .cloned()
        .collect();
    let ranks = ranks_of(&foreign, None);
    let settings = *SETTINGS.lock().unwrap_or_else(|e| e.into_inner());
    let mut out = Vec::with_capacity(paths.len());
    for p in paths {
        let Some(i) = foreign.iter().position(|f| f == p) else {
            out.push(p.clone());
            continue;
        };
        let mut done = CONVERTED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, trace, _)) = done.iter().find(|(_, _, orig)| orig == p) {
            out.push(trace.clone());
            continue;
        }
        let dir = tempfile::Builder::new()
            .prefix("poolsight-import-")
            .tempdir()?;
        let trace = dir.path().join("converted.pstrace");
        let world = (foreign.len() > 1).then_some(foreign.len() as u32);
        convert(p, &trace, settings, ranks[i], world, false)?;
        done.push((dir, trace.clone(), p.clone()));
        out.push(trace);
    }
    Ok(out)
}

/// The file a user named for `trace` (a converted PyTorch file's own path).
fn as_named(trace: &Path) -> Option<PathBuf> {
    let done = CONVERTED.lock().unwrap_or_else(|e| e.into_inner());
    done.iter()
        .find(|(_, t, _)| t == trace)
        .map(|(_, _, orig)| orig.clone())
}

/// Removes the temporary traces of converted PyTorch files (at the end of each command).
pub fn forget_conversions() {
    CONVERTED.lock().unwrap_or_else(|e| e.into_inner()).clear();
}

/// Opens and replays the traces ([`load::load`]: each chunk's checksum is checked as the
/// replay reads it), with a progress bar while replaying, then prints the warnings.
pub fn load_traces(paths: &[PathBuf], opts: ReplayOptions) -> anyhow::Result<Loaded> {
    let paths = &inputs(paths)?;
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
    let mut loaded = loaded?;
    // Reports name a converted file as the user did, not by its temporary trace.
    for t in &mut loaded.traces {
        if let Some(orig) = as_named(&t.path) {
            t.path = orig;
        }
    }
    for s in loaded
        .profiles
        .iter_mut()
        .flat_map(|p| p.sources.iter_mut())
    {
        if let Some(orig) = as_named(Path::new(&s.path)) {
            s.path = orig.display().to_string();
        }
    }
    for w in &mut loaded.warnings {
        if let Some(orig) = as_named(&w.path) {
            w.path = orig;
        }
    }
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
    profiles_with(
        input,
        ReplayOptions {
            categories,
            ..ReplayOptions::default()
        },
    )
}

/// The input's merged profile (or one per rank), replayed with `opts`.
pub fn profiles_with(input: &Input, opts: ReplayOptions) -> anyhow::Result<Vec<(String, Profile)>> {
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
