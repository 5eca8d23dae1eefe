//! Arguments several commands share, and the parsers clap calls for typed values.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use poolsight::analyzer::tables::functions::Unit;
use poolsight::analyzer::tables::timers::TimeUnit;
use poolsight::analyzer::tables::{self};
use poolsight::analyzer::views::flamegraph::{Metric, ParseMetricError};

/// How a report is printed.
#[derive(Copy, Clone, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Table,
    Json,
    Csv,
}

/// The traces to analyze and how to combine them.
#[derive(Args)]
pub struct Input {
    /// Trace file(s) (*.pstrace); several are the ranks of one job and merge into one report.
    #[arg(required = true)]
    pub traces: Vec<PathBuf>,
    /// With several traces, one report per trace (by rank) instead of the merged one.
    #[arg(long)]
    pub per_rank: bool,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

/// The report tables' names, for help and errors.
pub fn table_names() -> String {
    tables::names().join("|")
}

pub fn parse_table(s: &str) -> Result<&'static str, String> {
    tables::names()
        .into_iter()
        .find(|t| *t == s)
        .ok_or_else(|| format!("unknown table {s:?}: expected {}", table_names()))
}

pub fn parse_metric(s: &str) -> Result<Metric, String> {
    s.parse().map_err(|e: ParseMetricError| e.0)
}

pub fn parse_unit(s: &str) -> Result<Unit, String> {
    s.parse()
}

pub fn parse_time_unit(s: &str) -> Result<TimeUnit, String> {
    s.parse()
}
