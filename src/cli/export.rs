//! Traces for other tools and in other forms: `export` (Perfetto/Chrome, folded stacks, JSON
//! Lines, the Parquet dataset) and `pack`.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};
use poolsight::analyzer::export::pack::{self, PackOptions};
use poolsight::analyzer::export::{self, dataset};
use poolsight::analyzer::load::{Input, Inputs, LoadWarning};
use poolsight::analyzer::read::packed::DEFAULT_LEVEL;
use poolsight::analyzer::views::flamegraph::{self, Metric};
use poolsight::analyzer::{Profile, ReadError, ReplayOptions, Trace};
use rayon::prelude::*;

use super::args::parse_metric;
use super::load::{warn, Reading};
use super::output::{with_progress, wrote, Sink};

#[derive(Copy, Clone, PartialEq, Eq, ValueEnum)]
pub enum ExportFormat {
    Chrome,
    Folded,
    #[value(alias = "jsonl")]
    Json,
    Parquet,
}

/// `export --format parquet --tables`: which tables go into the dataset.
#[derive(Copy, Clone, PartialEq, Eq, ValueEnum)]
pub enum ParquetTables {
    /// events and stacks (every event)
    Events,
    /// functions, lines, timers, epochs (the reports as rows)
    Summary,
    /// both
    All,
}

#[derive(Args)]
pub struct ExportArgs {
    /// Trace file(s); chrome and folded merge several, json takes one, parquet exports
    /// each (in parallel) into one dataset.
    #[arg(required = true)]
    traces: Vec<PathBuf>,
    #[arg(long, value_enum)]
    format: ExportFormat,
    /// Where to write ("-" for stdout); parquet: the dataset's directory.
    #[arg(short, long)]
    output: PathBuf,
    /// parquet: which tables to write.
    #[arg(long, value_enum, default_value_t = ParquetTables::Events)]
    tables: ParquetTables,
    /// parquet: the run id of every trace given (a scheduler's job id, say) instead of
    /// the one computed from the headers.
    #[arg(long)]
    run_id: Option<String>,
    /// parquet: export damaged traces as far as they are readable instead of refusing.
    #[arg(long)]
    allow_incomplete: bool,
    /// folded: which amount the counts are.
    #[arg(long, default_value = "used", value_parser = parse_metric)]
    metric: Metric,
    /// chrome: points of the pool counter tracks (each the maximum of its time bucket).
    #[arg(long, default_value_t = 20_000)]
    points: usize,
}

pub fn export(args: ExportArgs, r: &Reading) -> anyhow::Result<()> {
    let inputs = r.inputs(&args.traces)?;
    match args.format {
        ExportFormat::Chrome => {
            let loaded = r.load_inputs(
                &inputs,
                ReplayOptions {
                    series_points: args.points,
                    ..ReplayOptions::default()
                },
            )?;
            let pairs: Vec<(&Trace, &Profile)> =
                loaded.traces.iter().zip(&loaded.profiles).collect();
            let mut sink = Sink::create(&args.output)?;
            export::chrome(&pairs, &mut sink)?;
            sink.finish()
        }
        ExportFormat::Folded => {
            let profile = Profile::merge(r.profiles(&inputs, args.metric == Metric::Peak)?);
            let mut sink = Sink::create(&args.output)?;
            for line in flamegraph::folded(&profile, args.metric) {
                writeln!(sink, "{line}")?;
            }
            sink.finish()
        }
        ExportFormat::Json => {
            anyhow::ensure!(
                inputs.len() == 1,
                "export --format json takes one trace (got {}); export each on its own",
                inputs.len()
            );
            let opened = inputs.open()?;
            opened.warnings.iter().for_each(warn);
            let mut sink = Sink::create(&args.output)?;
            export::jsonl(&opened.traces[0], &mut sink)?;
            sink.finish()
        }
        ExportFormat::Parquet => export_parquet(
            &inputs,
            &args.output,
            args.tables,
            args.run_id,
            args.allow_incomplete,
        ),
    }
}

/// Exports the traces into a Parquet dataset, in parallel, with a progress bar; one line per
/// trace written.
fn export_parquet(
    inputs: &Inputs,
    dir: &Path,
    tables: ParquetTables,
    run_id: Option<String>,
    allow_incomplete: bool,
) -> anyhow::Result<()> {
    let inputs: Vec<&Input> = inputs.iter().collect();
    let opened = inputs
        .par_iter()
        .map(|i| i.open(false))
        .collect::<Result<Vec<Trace>, ReadError>>()?;
    let opened = dataset::checked(opened, allow_incomplete)?;
    for t in &opened {
        for w in &t.warnings {
            warn(&LoadWarning {
                path: t.path.clone(),
                warning: w.clone(),
            });
        }
    }
    let total = dataset::progress_total(&opened);
    let written = with_progress("exporting", total, |progress| {
        let opts = dataset::ExportOptions {
            tables: match tables {
                ParquetTables::Events => dataset::Tables::Events,
                ParquetTables::Summary => dataset::Tables::Summary,
                ParquetTables::All => dataset::Tables::All,
            },
            run_id,
            progress: Some(progress),
        };
        dataset::export(&opened, dir, &opts)
    })?;
    for w in &written {
        eprintln!(
            "poolsight: exported {} as run {} rank {}: {} events, {} files, {} bytes",
            w.path.display(),
            w.run,
            w.rank,
            w.events,
            w.files.len(),
            w.bytes
        );
    }
    wrote(dir);
    Ok(())
}

#[derive(Args)]
pub struct PackArgs {
    /// The trace to pack (*.pstrace).
    trace: PathBuf,
    /// Where to write the packed trace.
    #[arg(short, long)]
    output: PathBuf,
    /// zstd level, 1 (fastest) to 22 (smallest); reading speed does not depend on it.
    #[arg(long, default_value_t = DEFAULT_LEVEL, value_parser = clap::value_parser!(i32).range(1..=22))]
    level: i32,
}

pub fn pack(args: PackArgs, r: &Reading, out: &mut impl Write) -> anyhow::Result<()> {
    let inputs = r.inputs(std::slice::from_ref(&args.trace))?;
    let input = inputs.iter().next().expect("one input for one path");
    // Packed as recorded: every frame kept.
    let mut trace = Trace::open_named(&input.trace, &input.named, false)?;
    let opts = PackOptions {
        level: args.level,
        ..Default::default()
    };
    let s = pack::pack(&trace, &args.output, &opts)?;
    for w in std::mem::take(&mut trace.warnings) {
        eprintln!("poolsight: warning: {}: {w}", args.trace.display());
    }
    writeln!(
        out,
        "{}: {} events, {} -> {} bytes ({:.2} -> {:.2} bytes/event, {:.1}x smaller)",
        args.output.display(),
        s.events,
        s.bytes_in,
        s.bytes_out,
        s.bytes_in as f64 / s.events.max(1) as f64,
        s.bytes_out as f64 / s.events.max(1) as f64,
        s.bytes_in as f64 / s.bytes_out.max(1) as f64
    )?;
    Ok(())
}
