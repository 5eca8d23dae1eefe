//! The front door of every analysis command: the files named loaded through
//! [`poolsight::analyzer::load`] — PyTorch files converted by `poolsight_import::PyTorchFiles`,
//! stacks shown as `--frames` says — with a progress bar on a terminal, and what was wrong with
//! them on stderr.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use poolsight::analyzer::load::{FrameFilter, Inputs, LoadOptions, LoadWarning, Loaded, View};
use poolsight::analyzer::replay::CategoryPass;
use poolsight::analyzer::{Profile, ReplayOptions};

use poolsight_import::resolver::{PyTorchFiles, Watch};

use super::args::Input;
use super::output::ProgressBar;

/// One warning line on stderr, whatever a verifier's message holds.
pub fn warn(w: &LoadWarning) {
    eprintln!("poolsight: warning: {}", w.one_line());
}

/// How a command reads the files it is given: the frames to show (`--frames`), PyTorch files
/// converted on the way.
#[derive(Clone, Copy)]
pub struct Reading {
    pub frames: Option<FrameFilter>,
}

/// A conversion's progress bar, on a terminal.
struct Converting(Option<ProgressBar>);

impl Watch for Converting {
    fn read(&mut self, bytes: u64) {
        if let Some(bar) = &self.0 {
            bar.done.store(bytes, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

impl Drop for Converting {
    fn drop(&mut self) {
        if let Some(bar) = self.0.take() {
            bar.finish();
        }
    }
}

fn converting(_: &Path, total: u64) -> Box<dyn Watch> {
    let mut bar = ProgressBar::new();
    bar.begin("converting", total);
    Box::new(Converting(Some(bar)))
}

/// PyTorch's files read wherever a trace is, with a progress bar while converting.
pub const PYTORCH_FILES: PyTorchFiles<'static> = PyTorchFiles {
    progress: Some(&converting),
};

impl Reading {
    /// The loading options these say, PyTorch's files converted with a progress bar.
    pub fn options(&self) -> LoadOptions<'static> {
        LoadOptions {
            frames: self.frames,
            resolver: Some(&PYTORCH_FILES),
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
