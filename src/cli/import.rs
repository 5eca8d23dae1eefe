//! `poolsight import`: PyTorch's files converted into trace files, with a progress bar. Every
//! other command reads them through `poolsight_import::PyTorchFiles` (see `load.rs`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use anyhow::Context;
use clap::Args;
use poolsight_import::{convert_file, ranks_of, Converted, FrameFilter, Kind};

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
