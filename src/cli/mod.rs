//! The `poolsight` command: argument parsing and rendering only; the work lives in the crates.
//! The binary (`src/main.rs`) and the Python package's `poolsight` command both run [`main`] /
//! [`run_args`], so there is one CLI.
//!
//! One file per family of commands: [`tables`] (`info` and the report tables), [`views`]
//! (`flamegraph`, `timeline`, `html`), [`export`] (`export`, `pack`), [`diff`], [`demo`];
//! [`load`] is the front door every analysis command goes through to read its traces
//! ([`load::Reading`], handed to each command),
//! [`output`] what they write, [`args`] the arguments they share.

mod args;
mod demo;
mod diff;
mod export;
mod import;
mod load;
mod oom;
mod output;
mod predict;
mod tables;
mod views;
mod whatif;

use std::io::Write;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
    /// Which frames of each stack to keep, for PyTorch files (snapshots, profiler traces) and
    /// for traces recorded with Python stacks. user: your own Python lines, module forwards
    /// and, innermost, the operator that allocated (`aten::addmm`, under its autograd node in
    /// backward), launchers, interpreter, libc, dispatcher and PyTorch's plumbing dropped;
    /// viewer: what PyTorch's memory viewer shows (unwinder, interpreter and dispatcher frames
    /// dropped); python: Python frames only; all: every frame recorded. Default: user for
    /// PyTorch's files and for traces that observe PyTorch's allocator (`track()`, pytest
    /// --poolsight); every frame as recorded for traces of a pool's hooks (poolsight's pool,
    /// CuPy's TraceHook), whose `lines` is CuPy's LineProfileHook tree. Scopes and call sites
    /// that poolsight records itself are always kept.
    #[arg(long, global = true, value_name = "user|viewer|python|all")]
    frames: Option<poolsight_import::FrameFilter>,
}

#[derive(Subcommand)]
enum Command {
    /// Train a small MLP on synthetic data through the memory pool, recording a trace.
    ///
    /// Every tensor goes through the CuPy-style pool; links (Classifier, MLP, Linear) and
    /// functions (LinearFunction, ReLU, SoftmaxCrossEntropy, Accuracy) are scoped forward and
    /// backward, epochs are marked. Then prints the report of the trace it wrote.
    Demo(demo::DemoArgs),
    /// Header, duration, events by kind, threads, devices, dropped events and torn chunks.
    ///
    /// Use it first on a trace from elsewhere: it verifies every chunk and says what, if
    /// anything, was lost (a writer killed mid-run leaves an unsealed file whose complete
    /// events are all still readable).
    Info(tables::InfoArgs),
    /// Memory used and acquired per function (Chainer's CupyMemoryProfileHook table).
    ///
    /// UsedBytes: bytes the function's calls took from the pool (nested calls included, as
    /// Chainer counts); AcquiredBytes: bytes the pool had to get from the device meanwhile.
    Functions(tables::FunctionsArgs),
    /// Memory by calling context: open scopes and call sites (CuPy's LineProfileHook tree).
    Lines(tables::LinesArgs),
    /// Elapsed time per link and per function (Chainer's TimerHook tables).
    Timers(tables::TimersArgs),
    /// Memory deltas per epoch in MB (fastai's PeakMemMetric columns; GPU figures exact).
    Epochs(tables::EpochsArgs),
    /// Bytes by memory category and by module (PyTorch's MemTracker breakdown).
    ///
    /// Categories (the label of each allocation: parameter, activation, gradient, ...): live
    /// bytes at the peak (they add up to it), each one's own maximum, at the end. Modules (link
    /// scopes, by class path): calls; live bytes before, after and at the peak of the call
    /// with the highest peak (MemTracker's Pre/Post/Peak-Forward); bytes allocated by backward
    /// operators under it; its bytes live at the peak.
    Categories(tables::CategoriesArgs),
    /// Every report: headline figures, functions, lines, timers and epochs, and categories for
    /// a trace whose allocations carry them.
    Report(tables::ReportArgs),
    /// Why a run ran out of memory: the request, reserved against allocated, per pool and
    /// stream the largest free block, what was live by category and line, what would help.
    ///
    /// Reads a PyTorch snapshot dumped at an OOM (segments only, or with its trace), a
    /// snapshot whose trace holds an `oom` entry, or a trace with poolsight's OutOfMemory
    /// events. A file without an out-of-memory gets the state at its end explained.
    Oom(oom::OomArgs),
    /// A flamegraph SVG (inferno) of the calling contexts, by bytes or time.
    ///
    /// used: bytes taken from the pool; acquired: bytes the pool took from the device; peak:
    /// bytes still live at the moment of the pool's peak ("what filled my GPU?"); time: self
    /// time of scopes.
    Flamegraph(views::FlamegraphArgs),
    /// An SVG plot of the pool's used and acquired bytes over time, epochs shaded, peak marked.
    Timeline(views::TimelineArgs),
    /// One self-contained interactive HTML page: the active-memory timeline by stack, what was
    /// live at any instant, flamegraphs, sortable tables.
    ///
    /// No network needed to open it: script, style and data are inline. Several traces (the
    /// ranks of one job) get a view selector: merged, or each rank.
    Html(views::HtmlArgs),
    /// Convert a trace for other tools: Perfetto/Chrome, folded stacks, JSON Lines, Parquet.
    ///
    /// chrome (Perfetto / chrome://tracing: scopes as slices, pool bytes as counters, epochs,
    /// OOMs), folded (stack-collapsed lines for any flamegraph tool), json (JSON Lines: stacks,
    /// then every event, for pandas and jq), parquet (a dataset directory partitioned by run
    /// and rank, for DuckDB, DataFusion, Spark; see docs/parquet.md).
    Export(export::ExportArgs),
    /// Compare two runs and fail when memory or time grew past what --fail-on allows.
    ///
    /// Exit 0 when no rule is crossed, 1 when one is (each violation listed), 2 on bad input.
    Diff(Box<diff::DiffArgs>),
    /// Convert PyTorch memory snapshots or torch.profiler traces into poolsight traces.
    ///
    /// Every command also reads those files directly (converting them each time); importing
    /// once is quicker for repeated analysis. Snapshots are read without running anything
    /// from the pickle. See docs/pytorch-files.md for how each entry maps.
    Import(import::ImportArgs),
    /// Write a compact copy of a trace: event chunks encoded as columns and compressed.
    ///
    /// Every command reads packed traces as it reads live ones and gives the same output;
    /// a packed trace is typically 5-10x smaller. Packing a trace whose writer was killed
    /// keeps it unfinished; chunks the reader warns about are left out.
    Pack(export::PackArgs),
    /// What would fit: the run replayed through PyTorch's caching allocator under its recorded
    /// settings and alternatives (expandable segments, max_split_size_mb, ...): reserved peak,
    /// fragmentation, and the first request that would not fit a --capacity.
    ///
    /// --min-capacity finds the smallest device each setting fits in; --check compares the
    /// model with the segments and blocks a snapshot recorded. See docs/whatif.md.
    Whatif(whatif::WhatifArgs),
    /// Predict a CUDA run without a GPU: a Python command run on fake CUDA tensors.
    ///
    /// `poolsight predict [--gpu NAME | --capacity BYTES] [-o TRACE] -- COMMAND...` runs the
    /// command (`python train.py ...`) under poolsight.torch.fake_cuda, writes the trace, and
    /// prints the predicted active and reserved peaks, whether it fits the GPU, the first
    /// request that would not, the smallest capacity, and what was live at the peak. Exit 0
    /// fits, 1 does not, 2 bad input or the command failed. `poolsight predict --help` lists
    /// every option; see docs/predict.md.
    Predict(predict::PredictArgs),
}

/// The names of the commands (`demo`, `info`, `functions`, ...).
pub fn command_names() -> Vec<String> {
    use clap::CommandFactory;
    Cli::command()
        .get_subcommands()
        .map(|c| c.get_name().to_owned())
        .collect()
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
        // The reader stopped reading (`| head`): what it took was written, nothing failed.
        Err(e) if closed_pipe(&e) => 0,
        Err(e) => {
            eprintln!("poolsight: {}", one_line(&e));
            2
        }
    }
}

/// Whether `e` is a write to a pipe whose reader is gone.
pub(crate) fn closed_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
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

fn run(cli: Cli) -> anyhow::Result<u8> {
    let mut out = std::io::stdout().lock();
    let reading = load::Reading { frames: cli.frames };
    let r = &reading;
    match cli.command {
        Command::Demo(a) => demo::demo(a, r, &mut out)?,
        Command::Info(a) => tables::info(a, r, &mut out)?,
        Command::Functions(a) => tables::functions(a, r, &mut out)?,
        Command::Lines(a) => tables::lines(a, r, &mut out)?,
        Command::Timers(a) => tables::timers(a, r, &mut out)?,
        Command::Epochs(a) => tables::epochs(a, r, &mut out)?,
        Command::Categories(a) => tables::categories(a, r, &mut out)?,
        Command::Report(a) => tables::report(a, r, &mut out)?,
        Command::Oom(a) => oom::oom(a, r, &mut out)?,
        Command::Flamegraph(a) => views::flamegraph(a, r)?,
        Command::Timeline(a) => views::timeline(a, r)?,
        Command::Html(a) => views::html(a, r)?,
        Command::Export(a) => export::export(a, r)?,
        Command::Diff(a) => return diff::run(*a, r, &mut out),
        Command::Pack(a) => export::pack(a, r, &mut out)?,
        Command::Import(a) => import::import(a, cli.frames.unwrap_or_default(), &mut out)?,
        Command::Whatif(a) => whatif::run(a, r, &mut out)?,
        Command::Predict(a) => return predict::run(a),
    }
    out.flush()?;
    Ok(0)
}
