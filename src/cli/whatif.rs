//! `poolsight whatif`: argument parsing and printing over [`poolsight::analyzer::whatif`]
//! (a run's requests replayed through a model of an allocator, `--check` the model against a
//! snapshot's segments: `whatif::find`).

use std::io::Write;
use std::path::PathBuf;

use clap::{Args, ValueEnum};
use poolsight::analyzer::whatif::{self, Allocator, Found, Options, Settings};

use super::load::{warn, Reading};
const HELP: &str = "\
Each setting is a PYTORCH_CUDA_ALLOC_CONF string, one alternative per --setting:
  expandable_segments:True          one growing segment per stream, mapped in 2/20 MiB pages
  max_split_size_mb:N               blocks of N MiB or more are never split (N >= 20)
  max_non_split_rounding_mb:N       ... and serve requests at most N MiB smaller (default 20)
  roundup_power2_divisions:N        round sizes to N steps between powers of two, or per
                                    interval: '[256:1,512:2,>:4]' (intervals in MiB)
  garbage_collection_threshold:F    free old cached segments past F of the allowed memory
                                    (acts only with per_process_memory_fraction)
  per_process_memory_fraction:F     torch.cuda.set_per_process_memory_fraction(F)
  several at once: --setting expandable_segments:True,max_split_size_mb:256

The first row is the run's recorded settings (a snapshot's allocator_settings; PyTorch's
defaults for other traces); each alternative is applied over them. Without --setting, four
alternatives are tried: expandable_segments:True, max_split_size_mb:128,
roundup_power2_divisions:4 and garbage_collection_threshold:0.6 (with a memory fraction of 1.0).

The capacity is what the allocator could take from the device: --capacity, else the trace's
device memory where recorded, else at a recorded out-of-memory the bytes reserved plus those
the device still had free; without one, nothing fails. Units: B, KB/KiB, MB/MiB, GB/GiB,
TB/TiB, all 1024 steps (an \"80GB\" GPU is 80 GiB).

Columns: reserved peak (bytes held from the device at most), allocated peak (bytes of blocks
handed out at most), fragmentation (reserved minus allocated at the reserved peak), inactive
split (free bytes in split segments there), whether the run fits, and the first request that
would not (its time, size and line).

--check replays with the recorded settings and compares the model's device allocations
(count, sizes, order) and each block's offset in its segment with what the snapshot recorded.

--allocator cupy replays the run through CuPy's pool instead (512-byte rounding, best fit,
one arena per stream, no settings).

Examples:
  poolsight whatif oom_snapshot.pickle
  poolsight whatif run.pickle --setting expandable_segments:True --capacity 24GiB --min-capacity
  poolsight whatif run.pickle --check --format json";

#[derive(Copy, Clone, PartialEq, Eq, ValueEnum)]
pub enum WhatifFormat {
    Table,
    Json,
}

#[derive(Copy, Clone, PartialEq, Eq, ValueEnum)]
pub enum AllocatorArg {
    /// PyTorch's CUDA caching allocator, under settings.
    Pytorch,
    /// CuPy's memory pool.
    Cupy,
}

#[derive(Args)]
#[command(after_help = HELP)]
pub struct WhatifArgs {
    /// Trace files or PyTorch snapshots; each is replayed on its own, device by device.
    #[arg(required = true)]
    traces: Vec<PathBuf>,
    /// An alternative to the recorded settings, as PYTORCH_CUDA_ALLOC_CONF spells it
    /// (repeatable; replaces the default alternatives).
    #[arg(long = "setting", value_name = "K:V[,K:V]", value_parser = parse_setting)]
    settings: Vec<Settings>,
    /// The bytes the allocator may take from the device (16GiB, 80GB, 24576MiB, ...).
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    capacity: Option<u64>,
    /// Also find, for each setting, the smallest capacity the run fits in.
    #[arg(long)]
    min_capacity: bool,
    /// Compare the model, with the recorded settings, with the recorded segments and blocks.
    #[arg(long)]
    check: bool,
    /// The allocator to replay the run through.
    #[arg(long, value_enum, default_value_t = AllocatorArg::Pytorch)]
    allocator: AllocatorArg,
    #[arg(long, value_enum, default_value_t = WhatifFormat::Table)]
    format: WhatifFormat,
}

/// A `PYTORCH_CUDA_ALLOC_CONF` string.
pub fn parse_setting(s: &str) -> Result<Settings, String> {
    Settings::parse(s).map_err(|e| e.to_string())
}

/// Bytes with an optional unit (1024 steps): `16GiB`, `80GB`, `512M`, `1048576`.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    poolsight::analyzer::units::parse_bytes(s)
}

pub fn run(args: WhatifArgs, r: &Reading, out: &mut impl Write) -> anyhow::Result<()> {
    let opts = Options {
        allocator: match args.allocator {
            AllocatorArg::Pytorch => Allocator::Pytorch,
            AllocatorArg::Cupy => Allocator::Cupy,
        },
        alternatives: args.settings,
        capacity: args.capacity,
        min_capacity: args.min_capacity,
    };
    let found = whatif::find(&args.traces, &opts, args.check, &r.options(), &mut warn)?;
    match (&found, args.format) {
        (_, WhatifFormat::Json) => {
            writeln!(out, "{}", serde_json::to_string_pretty(&found.json())?)?
        }
        (Found::Checks(c), WhatifFormat::Table) => write!(out, "{}", whatif::render::checks(c))?,
        (Found::Reports(r), WhatifFormat::Table) => {
            write!(out, "{}", whatif::render::tables(r, args.min_capacity))?
        }
    }
    Ok(())
}
