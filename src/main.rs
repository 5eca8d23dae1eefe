//! The `poolsight` command: argument parsing and rendering only; the work lives in the crates.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use poolsight::analyzer::{info, Trace};

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

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    match cli.command {
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
