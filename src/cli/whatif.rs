//! `poolsight whatif`: argument parsing and printing over [`poolsight::analyzer::whatif`]
//! (a run's requests replayed through a model of an allocator, `--check` the model against a
//! snapshot's segments), and the file opened for a replay that it shares with `oom`'s model
//! and `diff --whatif`.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, ValueEnum};
use poolsight::analyzer::load::LoadWarning;
use poolsight::analyzer::read::Trace;
use poolsight::analyzer::whatif::{self, Allocator, Check, Options, Recorded, Report, Settings};

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
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (examples: 16GiB, 80GB, 1048576)"))?;
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {s:?} (B, KB, MB, GB, TB)"
            ))
        }
    };
    let bytes = n * scale as f64;
    if !(bytes.is_finite() && bytes >= 1.0 && bytes < u64::MAX as f64) {
        return Err(format!("{s:?} is not a usable capacity"));
    }
    Ok(bytes as u64)
}

/// Opens `named` for a replay, through the loading step each command uses: a trace as it is
/// (PyTorch's default settings), a PyTorch snapshot converted once, its `allocator_settings`
/// and `segments` handed back by the same read ([`poolsight::analyzer::load::Input::recorded`]);
/// its stacks shown as `--frames` says; its warnings on stderr, naming the file as the user did.
pub fn open(named: &Path, r: &Reading) -> anyhow::Result<(Trace, Recorded)> {
    let inputs = r.inputs(std::slice::from_ref(&named.to_path_buf()))?;
    let input = inputs.iter().next().context("no file to open")?;
    let trace = input.open(false)?;
    for w in &trace.warnings {
        warn(&LoadWarning {
            path: named.to_path_buf(),
            warning: w.clone(),
        });
    }
    let recorded = Recorded::of_trace(&trace);
    Ok((trace, recorded))
}

/// What `whatif` found for some files: the replays' reports, or with `check` the checks.
pub enum Found {
    Reports(Vec<Report>),
    Checks(Vec<Check>),
}

impl Found {
    /// The JSON document `--format json` prints.
    pub fn json(&self) -> serde_json::Value {
        match self {
            Found::Reports(r) => whatif::json(r),
            Found::Checks(c) => whatif::checks_json(c),
        }
    }
}

/// Each file opened once ([`open`]), on its own, and replayed (or checked) device by device:
/// what the CLI prints and `poolsight.whatif()` returns.
pub fn find(paths: &[PathBuf], opts: &Options, check: bool, r: &Reading) -> anyhow::Result<Found> {
    if check {
        anyhow::ensure!(
            opts.allocator == Allocator::Pytorch,
            whatif::WhatifError::CupyCheck
        );
    }
    let (mut reports, mut checks) = (Vec::new(), Vec::new());
    for named in paths {
        let (trace, recorded) = open(named, r)?;
        let name = named.display().to_string();
        if check {
            checks.extend(whatif::check(&trace, &name, &recorded, opts.capacity));
        } else {
            reports.extend(whatif::whatif(&trace, &name, &recorded, opts)?);
        }
    }
    Ok(if check {
        Found::Checks(checks)
    } else {
        Found::Reports(reports)
    })
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
    let found = find(&args.traces, &opts, args.check, r)?;
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
