//! PyTorch's files read wherever a trace is: [`PyTorchFiles`], the [`Resolver`] that every
//! front end (the CLI, the Python module) hands the loading step, converting each snapshot or
//! profiler trace into a temporary trace that lasts as long as the loaded input. Each file is
//! opened once: its kind judged from the open file, which is then converted.

use std::path::{Path, PathBuf};

use poolsight_alloc_models::pytorch::Settings;
use poolsight_reader::resolve::{ConvertError, Converted as Resolved, Resolver};

use crate::settings::AllocatorState;
use crate::{convert_opened, detect_opened, rank_from_name, FrameFilter, Kind, Options};

/// Watches one conversion, for a progress display: told the input bytes read so far; dropped
/// when the conversion ends, however it ends.
pub trait Watch {
    fn read(&mut self, bytes: u64);
}

/// What starts a [`Watch`] for a file of `total` bytes about to be converted.
pub type Progress<'a> = &'a (dyn Fn(&Path, u64) -> Box<dyn Watch> + Sync);

/// PyTorch's files (snapshots, profiler traces) read wherever a trace is. Several without
/// ranks in their names are ranks in the order given ([`ranks_of`]).
#[derive(Default, Clone, Copy)]
pub struct PyTorchFiles<'a> {
    /// Watches each conversion (`None`: nothing is shown).
    pub progress: Option<Progress<'a>>,
}

/// The ranks of the files of one job: `rank` for one file, else from the names
/// ([`rank_from_name`]), else (several files, their names not giving each its own) their order.
pub fn ranks_of(inputs: &[PathBuf], rank: Option<u32>) -> Vec<Option<u32>> {
    if inputs.len() == 1 {
        return vec![rank.or_else(|| rank_from_name(&inputs[0]))];
    }
    let named: Vec<Option<u32>> = inputs.iter().map(|p| rank_from_name(p)).collect();
    let mut distinct: Vec<u32> = named.iter().flatten().copied().collect();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.len() == inputs.len() {
        named
    } else {
        (0..inputs.len() as u32).map(Some).collect()
    }
}

/// Why a snapshot's `allocator_settings` make it unusable: the model must read them as
/// PyTorch did, or every what-if of the file would be of other settings.
#[derive(Debug, thiserror::Error)]
#[error("the allocator_settings of {path} do not parse: {reason}")]
pub struct BadSettings {
    pub path: PathBuf,
    pub reason: String,
}

/// A snapshot's `allocator_settings` read as the model reads them (the converted trace keeps
/// them for `whatif` and `oom`).
pub fn check_settings(named: &Path, state: Option<&AllocatorState>) -> Result<(), BadSettings> {
    match state.and_then(|s| s.settings.as_ref()) {
        Some(pairs) => Settings::from_recorded(pairs)
            .map(|_| ())
            .map_err(|e| BadSettings {
                path: named.to_path_buf(),
                reason: e.to_string(),
            }),
        None => Ok(()),
    }
}

/// A conversion's failure, naming the file as the user named it.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {source}")]
struct Failed {
    path: String,
    source: crate::ImportError,
}

impl Resolver for PyTorchFiles<'_> {
    fn resolve(
        &self,
        paths: &[&Path],
        frames: FrameFilter,
    ) -> Result<Vec<Option<Resolved>>, ConvertError> {
        // Each file opened once: its kind judged from the open file, then converted from it.
        let mut opened: Vec<Option<std::fs::File>> = Vec::with_capacity(paths.len());
        for &p in paths {
            let file = if p.is_dir() {
                None
            } else {
                std::fs::File::open(p).ok()
            };
            let ours =
                file.filter(|f| matches!(detect_opened(f), Ok(Kind::Snapshot | Kind::Profile)));
            opened.push(ours);
        }
        // Ranks among the files converted, as `poolsight import` gives them.
        let ours: Vec<PathBuf> = (paths.iter().zip(&opened))
            .filter(|(_, f)| f.is_some())
            .map(|(p, _)| p.to_path_buf())
            .collect();
        let mut ranks = ranks_of(&ours, None).into_iter();
        let world_size = (ours.len() > 1).then_some(ours.len() as u32);
        let mut out = Vec::with_capacity(paths.len());
        for (&p, file) in paths.iter().zip(opened) {
            let Some(file) = file else {
                out.push(None);
                continue;
            };
            let rank = ranks.next().flatten();
            let dir = tempfile::Builder::new()
                .prefix("poolsight-import-")
                .tempdir()?;
            let trace = dir.path().join("converted.pstrace");
            let opts = Options {
                frames,
                rank,
                world_size,
                overwrite: false,
                categories: Vec::new(),
            };
            let total = file.metadata().map(|m| m.len()).unwrap_or(0);
            let mut watch = self.progress.map(|start| start(p, total));
            let mut read = |n: u64| {
                if let Some(w) = watch.as_mut() {
                    w.read(n);
                }
            };
            let c = convert_opened(&file, p, &trace, &opts, Some(&mut read));
            drop(watch);
            let c = c.map_err(|source| Failed {
                path: p.display().to_string(),
                source,
            })?;
            check_settings(p, c.allocator.as_ref())?;
            out.push(Some(Resolved {
                trace,
                keep: Box::new(dir),
            }));
        }
        Ok(out)
    }
}
