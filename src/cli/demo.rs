//! `demo`: train the built-in MLP ([`crate::demo`]), then print the report of its trace and
//! write its flamegraph and HTML report beside it.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use poolsight::analyzer::tables::{Report, ReportOptions};
use poolsight::analyzer::views::flamegraph::{self, Metric};

use super::load::Reading;
use super::output::{names, write_file};
use super::views::write_html;
use crate::demo::{self, DemoDevice, DemoOptions};

#[derive(Args)]
pub struct DemoArgs {
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
}

fn parse_device(s: &str) -> Result<DemoDevice, String> {
    s.parse().map_err(|e: demo::DemoError| e.to_string())
}

pub fn demo(args: DemoArgs, r: &Reading, out: &mut impl Write) -> anyhow::Result<()> {
    let opts = DemoOptions {
        out: args.out,
        epochs: args.epochs,
        device: args.device,
        hidden: args.hidden.into_iter().map(|h| h as usize).collect(),
        batch: args.batch as usize,
        steps_per_epoch: args.steps_per_epoch,
        eval_batches: args.eval_batches,
        eval_batch: args.eval_batch as usize,
        overwrite: args.force,
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
    // One replay for the report, the flamegraph and the page (which needs the bytes live at
    // the peak; the others do not read them).
    let traces = std::slice::from_ref(&outcome.path);
    let loaded = r.load_with_peak(traces)?;
    let profile = &loaded.profiles[0];
    let opts = ReportOptions::default();
    write!(
        out,
        "{}",
        Report::compute(profile, &opts).render_table(&opts)
    )?;
    out.flush()?;
    let svg_path = outcome.path.with_extension("svg");
    let title = format!(
        "poolsight demo: bytes used from the pool ({})",
        names(traces)
    );
    write_file(
        &svg_path,
        &flamegraph::flamegraph_svg(profile, Metric::Used, &title)?,
    )?;
    let html_path = outcome.path.with_extension("html");
    write_html(
        &loaded,
        &html_path,
        &format!("poolsight demo ({})", names(traces)),
    )?;
    writeln!(
        out,
        "\nflamegraph: {}\ninteractive report: {} (open it in a browser)",
        svg_path.display(),
        html_path.display()
    )?;
    Ok(())
}
