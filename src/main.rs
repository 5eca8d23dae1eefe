//! The `poolsight` command: argument parsing and rendering only; the work lives in the crates.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use poolsight::analyzer::{info, Trace};
use poolsight::demo::{DemoDevice, DemoOptions};
use poolsight::recorder::CountingAllocator;

// Exact heap bytes for the demo's per-epoch CPU figures, as tracemalloc gives Python.
#[global_allocator]
static ALLOC: CountingAllocator = CountingAllocator::new();

/// Record what a training run does with GPU memory and time; analyze the trace later.
#[derive(Parser)]
#[command(name = "poolsight", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Copy, Clone, PartialEq, Eq, ValueEnum)]
enum Format {
    Table,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Train a small MLP on synthetic data through the memory pool, recording a trace.
    ///
    /// Every tensor goes through the CuPy-style pool; links (Classifier, MLP, Linear) and
    /// functions (LinearFunction, ReLU, SoftmaxCrossEntropy, Accuracy) are scoped forward and
    /// backward, epochs are marked. Then prints what the trace holds.
    Demo {
        /// Where to write the trace.
        #[arg(long, default_value = "demo.pstrace")]
        out: PathBuf,
        /// Training epochs.
        #[arg(long, default_value_t = 3)]
        epochs: u32,
        /// `host` (simulated device memory, runs anywhere) or `cuda:N` (needs --features cuda).
        #[arg(long, default_value = "host", value_parser = parse_device)]
        device: DemoDevice,
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("poolsight: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn parse_device(s: &str) -> Result<DemoDevice, String> {
    s.parse()
        .map_err(|e: poolsight::demo::DemoError| e.to_string())
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    match cli.command {
        Command::Demo {
            out: path,
            epochs,
            device,
        } => {
            let opts = DemoOptions {
                out: path,
                epochs,
                device,
                ..DemoOptions::default()
            };
            let started = std::time::Instant::now();
            let outcome = poolsight::demo::run(&opts)?;
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
            let trace = Trace::open(&outcome.path)?;
            write!(out, "{}", info::render_table(&info::info(&trace)))?;
        }
        Command::Info { traces, format } => {
            let mut infos = Vec::new();
            for path in &traces {
                let trace = Trace::open(path)?;
                infos.push(info::info(&trace));
            }
            match format {
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
    }
    Ok(ExitCode::SUCCESS)
}
