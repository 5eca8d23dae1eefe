//! The front door of every analysis command: the files named loaded through
//! [`poolsight::analyzer::load`] — PyTorch files converted by [`PyTorchFiles`], stacks shown as
//! `--frames` says — with a progress bar on a terminal, and what was wrong with them on stderr.

use std::path::PathBuf;
use std::sync::Arc;

use poolsight::analyzer::load::{FrameFilter, Inputs, LoadOptions, LoadWarning, Loaded, View};
use poolsight::analyzer::replay::CategoryPass;
use poolsight::analyzer::{Profile, ReplayOptions};

use super::args::Input;
use super::import::PyTorchFiles;
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

/// How a command reads the files it is given: the frames to show (`--frames`), PyTorch files
/// converted on the way.
#[derive(Clone, Copy)]
pub struct Reading {
    pub frames: Option<FrameFilter>,
}

impl Reading {
    fn options(&self) -> LoadOptions<'static> {
        LoadOptions {
            frames: self.frames,
            resolver: Some(&PyTorchFiles { progress: true }),
        }
    }

    /// The files at `paths`, PyTorch files converted (see [`Inputs::resolve`]).
    pub fn inputs(&self, paths: &[PathBuf]) -> anyhow::Result<Inputs> {
        Ok(Inputs::resolve(paths, &self.options())?)
    }

    /// Opens and replays the files at `paths` (each chunk's checksum is checked as the replay
    /// reads it), with a progress bar while replaying, then prints the warnings.
    pub fn load(&self, paths: &[PathBuf], opts: ReplayOptions) -> anyhow::Result<Loaded> {
        self.load_inputs(&self.inputs(paths)?, opts)
    }

    /// [`Reading::load`] of files already resolved.
    pub fn load_inputs(&self, inputs: &Inputs, opts: ReplayOptions) -> anyhow::Result<Loaded> {
        let mut bar = ProgressBar::new();
        let opts = ReplayOptions {
            progress: Some(Arc::clone(&bar.done)),
            ..opts
        };
        let loaded = inputs.load(&opts, |total| bar.begin("replaying", total));
        bar.finish();
        let loaded = loaded?;
        loaded.warnings.iter().for_each(warn);
        Ok(loaded)
    }

    /// The files loaded for what shows the blocks live at the peak (`html`, the demo, a
    /// flamegraph of the peak).
    pub fn load_with_peak(&self, paths: &[PathBuf]) -> anyhow::Result<Loaded> {
        self.load(
            paths,
            ReplayOptions {
                live_at_peak: true,
                ..ReplayOptions::default()
            },
        )
    }

    /// The files' profiles, for a picture or an export of them (no categories).
    pub fn profiles(&self, inputs: &Inputs, live_at_peak: bool) -> anyhow::Result<Vec<Profile>> {
        let opts = ReplayOptions {
            live_at_peak,
            categories: CategoryPass::Never,
            ..ReplayOptions::default()
        };
        Ok(self.load_inputs(inputs, opts)?.profiles)
    }

    /// The input's merged profile (or one per rank), replayed with `opts`, each with its
    /// heading.
    pub fn views(&self, input: &Input, opts: ReplayOptions) -> anyhow::Result<Vec<View>> {
        Ok(self.load(&input.traces, opts)?.into_views(input.per_rank))
    }

    /// The input loaded, and `f` computed for each of its views; `categories` says when the
    /// replay computes bytes by category and module.
    pub fn computed<T>(
        &self,
        input: &Input,
        categories: CategoryPass,
        f: impl Fn(&Profile) -> T,
    ) -> anyhow::Result<Vec<(String, T)>> {
        let opts = ReplayOptions {
            categories,
            ..ReplayOptions::default()
        };
        Ok(self
            .views(input, opts)?
            .into_iter()
            .map(|v| (v.heading, f(&v.profile)))
            .collect())
    }
}
