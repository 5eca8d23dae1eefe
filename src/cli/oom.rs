//! `poolsight oom`: why a run ran out of memory, from any trace or PyTorch file; with the
//! model's figures (`analyzer::whatif::advice`) where the file gives the device's capacity;
//! the section is the analyzer's ([`section`]), as `report` and `html` show it.

use std::io::Write;

use clap::Args;
use poolsight::analyzer::read::Trace;
use poolsight::analyzer::replay::CategoryPass;
use poolsight::analyzer::tables::oom::{device_name, json, render_table, section};
use poolsight::analyzer::ReplayOptions;

use super::args::{Format, Input};
use super::load::Reading;

#[derive(Args)]
pub struct OomArgs {
    #[command(flatten)]
    input: Input,
}

/// A device's name in the traces (`cuda:0`), or `device N`.
pub fn device_namer(traces: &[Trace]) -> impl Fn(u32) -> String + '_ {
    move |id| device_name(traces, id)
}

pub fn oom(args: OomArgs, r: &Reading, out: &mut impl Write) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.input.format != Format::Csv,
        "oom has no CSV form: use --format table or json"
    );
    let opts = ReplayOptions {
        categories: CategoryPass::Never,
        ..ReplayOptions::default()
    };
    // Each file read once; a converted snapshot's trace keeps its allocator settings.
    let inputs = r.inputs(&args.input.traces)?;
    let loaded = r.load_inputs(&inputs, opts)?;
    let (ooms, models) = section(&loaded.traces);
    match args.input.format {
        Format::Json => writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&json(&ooms, &models))?
        )?,
        _ => write!(out, "{}", render_table(&ooms, device_namer(&loaded.traces)))?,
    }
    Ok(())
}
