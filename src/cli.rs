//! The `poolsight` command: argument parsing and rendering only; the work lives in the crates.
//! The binary (`src/main.rs`) and the Python package's `poolsight` command both run [`main`] /
//! [`run_args`], so there is one CLI.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};
use poolsight::analyzer::export::{self, dataset};
use poolsight::analyzer::read::{info, load};
use poolsight::analyzer::tables::functions::{self, Unit};
use poolsight::analyzer::tables::timers::{self, TimeUnit, Which};
use poolsight::analyzer::tables::{self, Report, ReportOptions};
use poolsight::analyzer::tables::{epochs, lines};
use poolsight::analyzer::views::flamegraph::{self, Metric};
use poolsight::analyzer::views::{html, timeline};
use poolsight::analyzer::{Profile, ReplayOptions, Trace};

use crate::demo::{DemoDevice, DemoOptions};
use crate::{demo, diff_cmd, term};

/// Record what a training run does with GPU memory and time; analyze the trace later.
///
/// Analysis commands take one or more traces: several (the ranks of one job) merge into one
/// report, and --per-rank prints each on its own. Exit codes: 0 ok, 1 a `diff` rule was
/// crossed, 2 bad input or usage (one line on stderr).
#[derive(Parser)]
#[command(name = "poolsight", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Copy, Clone, PartialEq, Eq, ValueEnum)]
enum ExportFormat {
    Chrome,
    Folded,
    #[value(alias = "jsonl")]
    Json,
    Parquet,
}

/// `export --format parquet --tables`: which tables go into the dataset.
#[derive(Copy, Clone, PartialEq, Eq, ValueEnum)]
enum ParquetTables {
    /// events and stacks (every event)
    Events,
    /// functions, lines, timers, epochs (the reports as rows)
    Summary,
    /// both
    All,
}

#[derive(Copy, Clone, PartialEq, Eq, ValueEnum)]
enum Format {
    Table,
    Json,
    Csv,
}

/// The traces to analyze and how to combine them.
#[derive(Args)]
struct Input {
    /// Trace file(s) (*.pstrace); several are the ranks of one job and merge into one report.
    #[arg(required = true)]
    traces: Vec<PathBuf>,
    /// With several traces, one report per trace (by rank) instead of the merged one.
    #[arg(long)]
    per_rank: bool,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
}

#[derive(Subcommand)]
enum Command {
    /// Train a small MLP on synthetic data through the memory pool, recording a trace.
    ///
    /// Every tensor goes through the CuPy-style pool; links (Classifier, MLP, Linear) and
    /// functions (LinearFunction, ReLU, SoftmaxCrossEntropy, Accuracy) are scoped forward and
    /// backward, epochs are marked. Then prints the report of the trace it wrote.
    Demo {
        /// Where to write the trace (and, beside it, the .svg flamegraph and the .html report).
        #[arg(long, default_value = "demo.pstrace")]
        out: PathBuf,
        /// Replace the trace if it exists (as a new file: a reader of the old one keeps it
        /// whole). Without it an existing file is an error; one being recorded always is.
        #[arg(long)]
        force: bool,
        /// Training epochs.
        #[arg(long, default_value_t = 3)]
        epochs: u32,
        /// `host` (simulated device memory, runs anywhere) or `cuda:N` (needs --features cuda).
        #[arg(long, default_value = "host", value_parser = parse_device)]
        device: DemoDevice,
        /// Widths of the hidden layers, comma-separated (try a wider one, then `diff`).
        #[arg(long, value_delimiter = ',', default_value = "256,256", value_parser = clap::value_parser!(u32).range(1..=65536))]
        hidden: Vec<u32>,
        /// Samples per training batch.
        #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=65536))]
        batch: u32,
        /// Training batches per epoch (fewer for a quick run).
        #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u32).range(1..))]
        steps_per_epoch: u32,
        /// Validation batches after each epoch.
        #[arg(long, default_value_t = 4)]
        eval_batches: u32,
        /// Samples per validation batch.
        #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
        eval_batch: u32,
    },
    /// Header, duration, events by kind, threads, devices, dropped events and torn chunks.
    ///
    /// Use it first on a trace from elsewhere: it verifies every chunk and says what, if
    /// anything, was lost (a writer killed mid-run leaves an unsealed file whose complete
    /// events are all still readable).
    Info {
        /// Trace file(s) (*.pstrace).
        #[arg(required = true)]
        traces: Vec<PathBuf>,
        #[arg(long, value_enum, default_value_t = Format::Table)]
        format: Format,
    },
    /// Memory used and acquired per function (Chainer's CupyMemoryProfileHook table).
    ///
    /// UsedBytes: bytes the function's calls took from the pool (nested calls included, as
    /// Chainer counts); AcquiredBytes: bytes the pool had to get from the device meanwhile.
    Functions {
        #[command(flatten)]
        input: Input,
        /// auto (one unit per column, from its largest value), auto_foreach (one per cell), or
        /// B, KB, MB, GB, TB, PB, EB, ZB.
        #[arg(long, default_value = "auto", value_parser = parse_unit)]
        unit: Unit,
        /// Add exclusive columns: bytes of the function's own mallocs, not its callees'.
        #[arg(long = "self")]
        with_self: bool,
    },
    /// Memory by calling context: open scopes and call sites (CuPy's LineProfileHook tree).
    Lines {
        #[command(flatten)]
        input: Input,
        /// Keep the outermost N-1 levels under _root (0: no limit), as CuPy's max_depth.
        #[arg(long, default_value_t = 0)]
        max_depth: usize,
    },
    /// Elapsed time per link and per function (Chainer's TimerHook tables).
    Timers {
        #[command(flatten)]
        input: Input,
        /// Only the link table.
        #[arg(long, conflicts_with = "functions")]
        links: bool,
        /// Only the function table.
        #[arg(long)]
        functions: bool,
        /// auto (one unit for the table, from its largest time, as Chainer), auto_foreach (one
        /// per row), sec, ms, us or ns.
        #[arg(long, default_value = "auto", value_parser = parse_time_unit)]
        unit: TimeUnit,
    },
    /// Memory deltas per epoch in MB (fastai's PeakMemMetric columns; GPU figures exact).
    Epochs {
        #[command(flatten)]
        input: Input,
    },
    /// Every report: headline figures, functions, lines, timers and epochs.
    Report {
        #[command(flatten)]
        input: Input,
        /// With --format csv: which table to write (a CSV file holds one table): summary,
        /// functions, lines, timers or epochs. Each command's own --format csv gives the same.
        #[arg(long, value_parser = parse_section)]
        table: Option<&'static str>,
    },
    /// A flamegraph SVG (inferno) of the calling contexts, by bytes or time.
    ///
    /// used: bytes taken from the pool; acquired: bytes the pool took from the device; peak:
    /// bytes still live at the moment of the pool's peak ("what filled my GPU?"); time: self
    /// time of scopes.
    Flamegraph {
        /// Trace file(s); several merge.
        #[arg(required = true)]
        traces: Vec<PathBuf>,
        /// Where to write the SVG.
        #[arg(short, long)]
        output: PathBuf,
        #[arg(long, default_value = "used", value_parser = parse_metric)]
        metric: Metric,
        /// Title of the graph (default: the metric and the trace).
        #[arg(long)]
        title: Option<String>,
    },
    /// An SVG plot of the pool's used and acquired bytes over time, epochs shaded, peak marked.
    Timeline {
        /// Trace file(s); one panel per trace.
        #[arg(required = true)]
        traces: Vec<PathBuf>,
        /// Where to write the SVG.
        #[arg(short, long)]
        output: PathBuf,
    },
    /// One self-contained interactive HTML page: the active-memory timeline by stack, what was
    /// live at any instant, flamegraphs, sortable tables.
    ///
    /// No network needed to open it: script, style and data are inline. Several traces (the
    /// ranks of one job) get a view selector: merged, or each rank.
    Html {
        /// Trace file(s); several are the ranks of one job.
        #[arg(required = true)]
        traces: Vec<PathBuf>,
        /// Where to write the page.
        #[arg(short, long)]
        output: PathBuf,
        /// Title of the page (default: the traces' names).
        #[arg(long)]
        title: Option<String>,
    },
    /// Convert a trace for other tools: Perfetto/Chrome, folded stacks, JSON Lines, Parquet.
    ///
    /// chrome (Perfetto / chrome://tracing: scopes as slices, pool bytes as counters, epochs,
    /// OOMs), folded (stack-collapsed lines for any flamegraph tool), json (JSON Lines: stacks,
    /// then every event, for pandas and jq), parquet (a dataset directory partitioned by run
    /// and rank, for DuckDB, DataFusion, Spark; see docs/parquet.md).
    Export {
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
    },
    /// Compare two runs and fail when memory or time grew past what --fail-on allows.
    ///
    /// Exit 0 when no rule is crossed, 1 when one is (each violation listed), 2 on bad input.
    Diff(diff_cmd::DiffArgs),
    /// Write a compact copy of a trace: event chunks encoded as columns and compressed.
    ///
    /// Every command reads packed traces as it reads live ones and gives the same output;
    /// a packed trace is typically 5-10x smaller. Packing a trace whose writer was killed
    /// keeps it unfinished; chunks the reader warns about are left out.
    Pack {
        /// The trace to pack (*.pstrace).
        trace: PathBuf,
        /// Where to write the packed trace.
        #[arg(short, long)]
        output: PathBuf,
        /// zstd level, 1 (fastest) to 22 (smallest); reading speed does not depend on it.
        #[arg(long, default_value_t = poolsight::analyzer::read::packed::DEFAULT_LEVEL, value_parser = clap::value_parser!(i32).range(1..=22))]
        level: i32,
    },
}

/// Runs the command line of this process.
pub fn main() -> ExitCode {
    ExitCode::from(run_args(std::env::args_os()))
}

/// Runs the command line `args` (`args[0]` is the program name) and returns the exit code:
/// 0 ok, 1 a `diff` rule was crossed, 2 bad input or usage. Never exits the process, so the
/// Python package can run it in-process.
pub fn run_args<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("poolsight: {}", one_line(&e));
            2
        }
    }
}

/// `--help` and `--version` print as clap prints them; a usage error becomes one line on
/// stderr (clap's first, without its usage block and hint) with exit code 2, as every other
/// error.
fn usage_error(e: clap::Error) -> u8 {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                2
            } else {
                0
            }
        }
        _ => {
            // clap's message, with its `[possible values: ...]` and tips, up to the usage
            // block, joined on one line.
            let text = e.render().to_string();
            let parts: Vec<&str> = text
                .lines()
                .map(str::trim)
                .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
                .filter(|l| !l.is_empty())
                .collect();
            let line = parts.join(" ");
            let line = line.strip_prefix("error: ").unwrap_or(&line);
            eprintln!("poolsight: {line}");
            2
        }
    }
}

/// The error and its causes on one line, skipping a cause whose text the message already
/// holds (library errors name their source in their own message).
fn one_line(e: &anyhow::Error) -> String {
    let mut msg = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !msg.contains(&c) {
            msg.push_str(": ");
            msg.push_str(&c);
        }
    }
    msg.replace('\n', " ")
}

fn section_names() -> String {
    tables::names().join("|")
}

fn parse_section(s: &str) -> Result<&'static str, String> {
    tables::names()
        .into_iter()
        .find(|t| *t == s)
        .ok_or_else(|| format!("unknown table {s:?}: expected {}", section_names()))
}

fn parse_device(s: &str) -> Result<DemoDevice, String> {
    s.parse().map_err(|e: demo::DemoError| e.to_string())
}

fn parse_metric(s: &str) -> Result<Metric, String> {
    s.parse()
        .map_err(|e: poolsight::analyzer::views::flamegraph::ParseMetricError| e.0)
}

fn parse_unit(s: &str) -> Result<Unit, String> {
    s.parse()
}

fn parse_time_unit(s: &str) -> Result<TimeUnit, String> {
    s.parse()
}

/// The merged profile, or one per trace with `--per-rank`, each with a heading.
fn views(input: &Input, live_at_peak: bool) -> anyhow::Result<Vec<(String, Profile)>> {
    let profiles = term::load_profiles(&input.traces, live_at_peak)?;
    Ok(load::views(profiles, input.per_rank)
        .into_iter()
        .map(|v| (v.heading, v.profile))
        .collect())
}

/// Prints one rendering per view: tables and CSV under `== heading ==` lines, JSON as one
/// document (an array of `{"trace", ...report}` objects with --per-rank).
fn emit<T: serde::Serialize>(
    out: &mut impl Write,
    format: Format,
    views: &[(String, T)],
    table: impl Fn(&T) -> String,
    csv: impl Fn(&T) -> String,
) -> anyhow::Result<()> {
    match format {
        Format::Json => {
            let json = if views.len() == 1 && views[0].0.is_empty() {
                serde_json::to_string_pretty(&views[0].1)?
            } else {
                let list: Vec<serde_json::Value> = views
                    .iter()
                    .map(|(name, v)| {
                        let mut j = serde_json::to_value(v)?;
                        if let Some(o) = j.as_object_mut() {
                            o.insert("trace".into(), name.clone().into());
                        }
                        Ok(j)
                    })
                    .collect::<serde_json::Result<_>>()?;
                serde_json::to_string_pretty(&list)?
            };
            writeln!(out, "{json}")?;
        }
        Format::Csv if views.iter().any(|(name, _)| !name.is_empty()) => {
            // One table for every rank: a leading `trace` column says whose row it is.
            for (i, (name, v)) in views.iter().enumerate() {
                let text = csv(v);
                let (header, rows) = text.split_once('\n').unwrap_or((&text, ""));
                if i == 0 {
                    writeln!(out, "trace,{header}")?;
                }
                let cell = poolsight::analyzer::tables::csv::cell(name);
                for record in csv_records(rows) {
                    writeln!(out, "{cell},{record}")?;
                }
            }
        }
        Format::Table | Format::Csv => {
            for (i, (name, v)) in views.iter().enumerate() {
                if !name.is_empty() {
                    if i > 0 {
                        writeln!(out)?;
                    }
                    writeln!(out, "== {name} ==")?;
                }
                let text = if format == Format::Table {
                    table(v)
                } else {
                    csv(v)
                };
                write!(out, "{text}")?;
            }
        }
    }
    Ok(())
}

fn run(cli: Cli) -> anyhow::Result<u8> {
    let mut out = std::io::stdout().lock();
    match cli.command {
        Command::Demo {
            out: path,
            force,
            epochs,
            device,
            hidden,
            batch,
            steps_per_epoch,
            eval_batches,
            eval_batch,
        } => {
            let opts = DemoOptions {
                out: path,
                epochs,
                device,
                hidden: hidden.into_iter().map(|h| h as usize).collect(),
                batch: batch as usize,
                steps_per_epoch,
                eval_batches,
                eval_batch: eval_batch as usize,
                overwrite: force,
                ..DemoOptions::default()
            };
            let started = std::time::Instant::now();
            let outcome = demo::run(&opts)?;
            for (n, (loss, acc)) in outcome.losses.iter().zip(&outcome.accuracies).enumerate() {
                writeln!(
                    out,
                    "epoch {:>2}  train loss {loss:.4}  validation accuracy {:.1}%",
                    n + 1,
                    acc * 100.0
                )?;
            }
            writeln!(
                out,
                "trained on {} in {:.2} s; wrote {} ({} events, {} bytes)\n",
                outcome.device_name,
                started.elapsed().as_secs_f64(),
                outcome.path.display(),
                outcome.summary.events,
                outcome.summary.file_bytes
            )?;
            // One replay for the report, the flamegraph and the page (which needs the bytes
            // live at the peak; the others do not read them).
            let loaded = load_with_peak(std::slice::from_ref(&outcome.path))?;
            let profile = &loaded.profiles[0];
            let opts = ReportOptions::default();
            let r = Report::compute(profile, &opts);
            write!(out, "{}", r.render_table(&opts))?;
            out.flush()?;
            let svg_path = outcome.path.with_extension("svg");
            let title = format!(
                "poolsight demo: bytes used from the pool ({})",
                names(std::slice::from_ref(&outcome.path))
            );
            let svg = flamegraph::flamegraph_svg(profile, Metric::Used, &title)?;
            term::write_file(&svg_path, &svg)?;
            let html_path = outcome.path.with_extension("html");
            let title = format!(
                "poolsight demo ({})",
                names(std::slice::from_ref(&outcome.path))
            );
            write_html(&loaded, &html_path, &title)?;
            writeln!(
                out,
                "\nflamegraph: {}\ninteractive report: {} (open it in a browser)",
                svg_path.display(),
                html_path.display()
            )?;
        }
        Command::Info { traces, format } => {
            let mut infos = Vec::new();
            for path in &traces {
                // As every report loads a trace: checksums checked as the replay reads each
                // chunk, the whole file checked first only if one fails. The warnings go to
                // stderr as for every command, and `info` lists them too.
                let loaded =
                    term::load_traces(std::slice::from_ref(path), ReplayOptions::default())?;
                let (trace, profile) = (&loaded.traces[0], &loaded.profiles[0]);
                let mut i = info::info(trace);
                info::add_replay(&mut i, profile);
                infos.push(i);
            }
            match format {
                Format::Csv => write!(out, "{}", info::render_csv(&infos))?,
                Format::Table => {
                    for (n, i) in infos.iter().enumerate() {
                        if n > 0 {
                            writeln!(out)?;
                        }
                        write!(out, "{}", info::render_table(i))?;
                    }
                }
                Format::Json => {
                    let json = if infos.len() == 1 {
                        serde_json::to_string_pretty(&infos[0])?
                    } else {
                        serde_json::to_string_pretty(&infos)?
                    };
                    writeln!(out, "{json}")?;
                }
            }
        }
        Command::Functions {
            input,
            unit,
            with_self,
        } => {
            let v = computed(&input, functions::functions)?;
            emit(
                &mut out,
                input.format,
                &v,
                |f| functions::render_table(f, unit, with_self),
                functions::render_csv,
            )?;
        }
        Command::Lines { input, max_depth } => {
            let v = computed(&input, |p| lines::lines(p, max_depth))?;
            emit(
                &mut out,
                input.format,
                &v,
                lines::render_table,
                lines::render_csv,
            )?;
        }
        Command::Timers {
            input,
            links,
            functions,
            unit,
        } => {
            let which = match (links, functions) {
                (true, _) => Which::Links,
                (_, true) => Which::Functions,
                _ => Which::Both,
            };
            let v = computed(&input, timers::timers)?;
            emit(
                &mut out,
                input.format,
                &v,
                |t| timers::render_table(t, which, unit),
                timers::render_csv,
            )?;
        }
        Command::Epochs { input } => {
            let v = computed(&input, epochs::epochs)?;
            emit(
                &mut out,
                input.format,
                &v,
                epochs::render_table,
                epochs::render_csv,
            )?;
        }
        Command::Diff(args) => return diff_cmd::run(args, &mut out),
        Command::Flamegraph {
            traces,
            output,
            metric,
            title,
        } => {
            let profile = Profile::merge(term::load_profiles(&traces, metric == Metric::Peak)?);
            let title = title.unwrap_or_else(|| {
                format!(
                    "poolsight: {metric} by calling context ({})",
                    names(&traces)
                )
            });
            let svg = flamegraph::flamegraph_svg(&profile, metric, &title)?;
            term::write_file(&output, &svg)?;
        }
        Command::Html {
            traces,
            output,
            title,
        } => {
            let title = title.unwrap_or_else(|| format!("poolsight: {}", names(&traces)));
            write_html(&load_with_peak(&traces)?, &output, &title)?;
        }
        Command::Timeline { traces, output } => {
            let profile = Profile::merge(term::load_profiles(&traces, false)?);
            term::write_file(&output, &timeline::timeline_svg(&profile)?)?;
        }
        Command::Export {
            traces,
            format,
            output,
            metric,
            points,
            tables,
            run_id,
            allow_incomplete,
        } => match format {
            ExportFormat::Chrome => {
                let loaded = term::load_traces(
                    &traces,
                    ReplayOptions {
                        series_points: points,
                        ..ReplayOptions::default()
                    },
                )?;
                let pairs: Vec<(&Trace, &Profile)> =
                    loaded.traces.iter().zip(&loaded.profiles).collect();
                let mut sink = Sink::create(&output)?;
                export::chrome(&pairs, &mut sink)?;
                sink.finish()?;
            }
            ExportFormat::Folded => {
                let profile = Profile::merge(term::load_profiles(&traces, metric == Metric::Peak)?);
                let mut sink = Sink::create(&output)?;
                for line in flamegraph::folded(&profile, metric) {
                    writeln!(sink, "{line}")?;
                }
                sink.finish()?;
            }
            ExportFormat::Json => {
                anyhow::ensure!(
                    traces.len() == 1,
                    "export --format json takes one trace (got {}); export each on its own",
                    traces.len()
                );
                let opened = load::open_all(&traces)?;
                opened.warnings.iter().for_each(term::warn);
                let mut sink = Sink::create(&output)?;
                export::jsonl(&opened.traces[0], &mut sink)?;
                sink.finish()?;
            }
            ExportFormat::Parquet => {
                export_parquet(&traces, &output, tables, run_id, allow_incomplete)?
            }
        },
        Command::Report { input, table } => {
            let section = match (input.format, table) {
                (Format::Csv, Some(t)) => t,
                (Format::Csv, None) => anyhow::bail!(
                    "report --format csv writes one table: choose it with --table {}",
                    section_names()
                ),
                (_, Some(_)) => {
                    anyhow::bail!("--table chooses a CSV table: use it with --format csv")
                }
                (_, None) => "summary",
            };
            let opts = ReportOptions::default();
            let v = computed(&input, |p| Report::compute(p, &opts))?;
            emit(
                &mut out,
                input.format,
                &v,
                |r| r.render_table(&opts),
                |r| r.render_csv(section).unwrap_or_default(),
            )?;
        }
        Command::Pack {
            trace,
            output,
            level,
        } => {
            term::check_trace_path(&trace)?;
            let opts = poolsight::analyzer::read::pack::PackOptions {
                level,
                ..Default::default()
            };
            let (s, warnings) = poolsight::analyzer::read::pack::pack_file(&trace, &output, &opts)?;
            for w in &warnings {
                eprintln!("poolsight: warning: {}: {w}", trace.display());
            }
            writeln!(
                out,
                "{}: {} events, {} -> {} bytes ({:.2} -> {:.2} bytes/event, {:.1}x smaller)",
                output.display(),
                s.events,
                s.bytes_in,
                s.bytes_out,
                s.bytes_in as f64 / s.events.max(1) as f64,
                s.bytes_out as f64 / s.events.max(1) as f64,
                s.bytes_in as f64 / s.bytes_out.max(1) as f64
            )?;
        }
    }
    Ok(0)
}

/// Exports the traces into a Parquet dataset, in parallel, with a progress bar; one line per
/// trace written.
fn export_parquet(
    traces: &[PathBuf],
    dir: &Path,
    tables: ParquetTables,
    run_id: Option<String>,
    allow_incomplete: bool,
) -> anyhow::Result<()> {
    for p in traces {
        term::check_trace_path(p)?;
    }
    let opened = dataset::open(traces, allow_incomplete)?;
    for t in &opened {
        for w in &t.warnings {
            term::warn(&load::LoadWarning {
                path: t.path.clone(),
                warning: w.clone(),
            });
        }
    }
    let total = dataset::progress_total(&opened);
    let written = term::with_progress("exporting", total, |progress| {
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
    term::wrote(dir);
    Ok(())
}

/// Replays the traces (with the bytes live at the peak) and writes their HTML report.
/// The traces loaded for the reports that show the blocks live at the peak (the demo's and
/// `html`).
fn load_with_peak(traces: &[PathBuf]) -> anyhow::Result<poolsight::analyzer::read::load::Loaded> {
    term::load_traces(
        traces,
        ReplayOptions {
            live_at_peak: true,
            ..ReplayOptions::default()
        },
    )
}

fn write_html(
    loaded: &poolsight::analyzer::read::load::Loaded,
    output: &Path,
    title: &str,
) -> anyhow::Result<()> {
    let page = html::report_page(title, &loaded.traces, &loaded.profiles);
    term::write_file(output, page.as_bytes())
}

/// The records of CSV text (without its header), each possibly spanning lines inside quotes.
fn csv_records(text: &str) -> Vec<&str> {
    let mut records = Vec::new();
    let (mut start, mut quoted) = (0, false);
    for (i, b) in text.bytes().enumerate() {
        match b {
            b'"' => quoted = !quoted,
            b'\n' if !quoted => {
                records.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if start < text.len() {
        records.push(&text[start..]);
    }
    records
}

/// Loads the input and computes one report per view.
fn computed<T>(input: &Input, f: impl Fn(&Profile) -> T) -> anyhow::Result<Vec<(String, T)>> {
    Ok(views(input, false)?
        .into_iter()
        .map(|(name, p)| (name, f(&p)))
        .collect())
}

/// The traces' file names, for titles.
fn names(traces: &[PathBuf]) -> String {
    traces
        .iter()
        .map(|p| {
            p.file_name().map_or_else(
                || p.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Where an export goes: a buffered file, or stdout for "-".
enum Sink {
    File(PathBuf, std::io::BufWriter<std::fs::File>),
    Stdout(std::io::Stdout),
}

impl Sink {
    fn create(path: &Path) -> anyhow::Result<Sink> {
        if path == Path::new("-") {
            return Ok(Sink::Stdout(std::io::stdout()));
        }
        let f = std::fs::File::create(path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        Ok(Sink::File(
            path.to_path_buf(),
            std::io::BufWriter::with_capacity(1 << 20, f),
        ))
    }

    fn finish(self) -> anyhow::Result<()> {
        match self {
            Sink::File(path, mut w) => {
                w.flush()
                    .with_context(|| format!("cannot write {}", path.display()))?;
                term::wrote(&path);
            }
            Sink::Stdout(mut s) => s.flush()?,
        }
        Ok(())
    }
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Sink::File(_, w) => w.write(buf),
            Sink::Stdout(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Sink::File(_, w) => w.flush(),
            Sink::Stdout(s) => s.flush(),
        }
    }
}
