//! `poolsight import`, and the conversion every analysis command does when it is handed a
//! PyTorch file instead of a trace ([`PyTorchFiles`], the resolver the loading step is given).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use anyhow::Context;
use clap::Args;
use poolsight::analyzer::load::{self, ConvertError, Resolver};
use poolsight::analyzer::whatif::Recorded;
use poolsight_import::settings::AllocatorState;
use poolsight_import::{convert_file, detect_file, rank_from_name, Converted, FrameFilter, Kind};

use super::output::ProgressBar;

#[derive(Args)]
pub struct ImportArgs {
    /// PyTorch memory snapshots (`_dump_snapshot` pickles, OOM dumps) or torch.profiler JSON
    /// traces; several are the ranks of one job.
    #[arg(required = true)]
    inputs: Vec<PathBuf>,
    /// Where to write: a trace file for one input; for several, a directory that gets one
    /// `<name>.pstrace` per input.
    #[arg(short, long)]
    output: PathBuf,
    /// The rank of a single input (default: from its name, `snapshot_<N>.pickle` or
    /// `..._rank-<N>.pickle`; several inputs without ranks in their names take their order).
    #[arg(long)]
    rank: Option<u32>,
    /// Replace output files that exist.
    #[arg(long)]
    force: bool,
}

pub fn import(args: ImportArgs, frames: FrameFilter, out: &mut impl Write) -> anyhow::Result<()> {
    let several = args.inputs.len() > 1;
    anyhow::ensure!(
        !(several && args.rank.is_some()),
        "--rank names the rank of a single input; with several, each takes its rank from its name or its position"
    );
    if several {
        std::fs::create_dir_all(&args.output)
            .with_context(|| format!("cannot create the directory {}", args.output.display()))?;
    }
    let ranks = ranks_of(&args.inputs, args.rank);
    for (input, rank) in args.inputs.iter().zip(ranks) {
        let output = if several {
            let stem = input.file_stem().unwrap_or_default().to_string_lossy();
            args.output.join(format!("{stem}.pstrace"))
        } else {
            args.output.clone()
        };
        let world = several.then_some(args.inputs.len() as u32);
        let c = convert(input, &output, frames, rank, world, args.force, true)?;
        writeln!(
            out,
            "{}: {} {} entries -> {} events in {}{}{}",
            input.display(),
            match c.kind {
                Kind::Profile => "torch.profiler trace,",
                _ => "snapshot,",
            },
            c.entries,
            c.events,
            output.display(),
            rank.map(|r| format!(", rank {r}")).unwrap_or_default(),
            if c.overflowed {
                ", begins mid-run (blocks freed but never allocated in it count as live from the start)"
            } else {
                ""
            }
        )?;
        for u in &c.unmapped {
            writeln!(out, "  not mapped: {u}")?;
        }
    }
    Ok(())
}

/// Ranks: `--rank` for one input, else from the names, else (several inputs) their order.
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

/// Converts one file, with a progress bar on a terminal when `progress` says so.
pub fn convert(
    input: &Path,
    output: &Path,
    frames: FrameFilter,
    rank: Option<u32>,
    world_size: Option<u32>,
    overwrite: bool,
    progress: bool,
) -> anyhow::Result<Converted> {
    anyhow::ensure!(
        !input.is_dir(),
        "{} is a directory, not a snapshot or profiler trace",
        input.display()
    );
    let total = std::fs::metadata(input)
        .with_context(|| format!("cannot read {}", input.display()))?
        .len();
    let mut bar = ProgressBar::new();
    if progress {
        bar.begin("converting", total);
    }
    let done = bar.done.clone();
    let opts = poolsight_import::Options {
        frames,
        rank,
        world_size,
        overwrite,
        categories: Vec::new(),
    };
    let mut progress = |n: u64| done.store(n, Ordering::Relaxed);
    let result = convert_file(input, output, &opts, Some(&mut progress));
    bar.finish();
    result.with_context(|| input.display().to_string())
}

/// Whether `path` is a PyTorch file to convert (by its content) rather than a trace.
pub fn is_pytorch_file(path: &Path) -> bool {
    !path.is_dir() && matches!(detect_file(path), Ok(Kind::Snapshot | Kind::Profile))
}

/// PyTorch's files (snapshots, profiler traces) read wherever a trace is: converted through
/// `poolsight-import` into temporary traces that last as long as the loaded inputs. Several
/// without ranks in their names are ranks in the order given.
pub struct PyTorchFiles {
    /// A progress bar on a terminal while converting.
    pub progress: bool,
}

impl Resolver for PyTorchFiles {
    fn converts(&self, path: &Path) -> bool {
        is_pytorch_file(path)
    }

    fn convert(
        &self,
        paths: &[&Path],
        frames: FrameFilter,
    ) -> Result<Vec<load::Converted>, ConvertError> {
        let owned: Vec<PathBuf> = paths.iter().map(|p| p.to_path_buf()).collect();
        let ranks = ranks_of(&owned, None);
        let world = (paths.len() > 1).then_some(paths.len() as u32);
        let mut out = Vec::with_capacity(paths.len());
        for (p, rank) in paths.iter().zip(ranks) {
            let dir = tempfile::Builder::new()
                .prefix("poolsight-import-")
                .tempdir()?;
            let trace = dir.path().join("converted.pstrace");
            let c = convert(p, &trace, frames, rank, world, false, self.progress)?;
            check_settings(p, c.allocator.as_ref())?;
            out.push(load::Converted {
                trace,
                keep: Box::new(dir),
            });
        }
        Ok(out)
    }
}

/// A snapshot's `allocator_settings` read as the model reads them (the converted trace keeps
/// them for `whatif` and `oom`): settings it cannot read are the conversion's error.
fn check_settings(named: &Path, state: Option<&AllocatorState>) -> anyhow::Result<()> {
    if let Some(state) = state {
        Recorded::from_state(state).with_context(|| {
            format!("the allocator_settings of {} do not parse", named.display())
        })?;
    }
    Ok(())
}
