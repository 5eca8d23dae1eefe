//! The pictures: `flamegraph`, `timeline`, `html`.

use std::path::{Path, PathBuf};

use clap::Args;
use poolsight::analyzer::load::Loaded;
use poolsight::analyzer::views::flamegraph::{self, Metric};
use poolsight::analyzer::views::{html, timeline};
use poolsight::analyzer::Profile;

use super::args::parse_metric;
use super::load::Reading;
use super::output::{names, write_file};

#[derive(Args)]
pub struct FlamegraphArgs {
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
}

pub fn flamegraph(args: FlamegraphArgs, r: &Reading) -> anyhow::Result<()> {
    let metric = args.metric;
    let inputs = r.inputs(&args.traces)?;
    let profile = Profile::merge(r.profiles(&inputs, metric == Metric::Peak)?);
    let title = args.title.unwrap_or_else(|| {
        format!(
            "poolsight: {metric} by calling context ({})",
            names(&args.traces)
        )
    });
    let svg = flamegraph::flamegraph_svg(&profile, metric, &title)?;
    write_file(&args.output, &svg)
}

#[derive(Args)]
pub struct TimelineArgs {
    /// Trace file(s); one panel per trace.
    #[arg(required = true)]
    traces: Vec<PathBuf>,
    /// Where to write the SVG.
    #[arg(short, long)]
    output: PathBuf,
}

pub fn timeline(args: TimelineArgs, r: &Reading) -> anyhow::Result<()> {
    let profile = Profile::merge(r.profiles(&r.inputs(&args.traces)?, false)?);
    write_file(&args.output, &timeline::timeline_svg(&profile)?)
}

#[derive(Args)]
pub struct HtmlArgs {
    /// Trace file(s); several are the ranks of one job.
    #[arg(required = true)]
    traces: Vec<PathBuf>,
    /// Where to write the page.
    #[arg(short, long)]
    output: PathBuf,
    /// Title of the page (default: the traces' names).
    #[arg(long)]
    title: Option<String>,
}

pub fn html(args: HtmlArgs, r: &Reading) -> anyhow::Result<()> {
    let title = args
        .title
        .unwrap_or_else(|| format!("poolsight: {}", names(&args.traces)));
    write_html(&r.load_with_peak(&args.traces)?, &args.output, &title)
}

/// Writes the HTML report of traces loaded with the bytes live at the peak.
pub fn write_html(loaded: &Loaded, output: &Path, title: &str) -> anyhow::Result<()> {
    let page = html::report_page(title, &loaded.traces, &loaded.profiles);
    write_file(output, page.as_bytes())
}
