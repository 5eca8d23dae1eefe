//! `poolsight oom`: why a run ran out of memory, from any trace or PyTorch file.

use std::io::Write;

use clap::Args;
use poolsight::analyzer::read::Trace;
use poolsight::analyzer::replay::{oom_states, CategoryPass};
use poolsight::analyzer::tables::oom::{device_name, render_table, Ooms};
use poolsight::analyzer::ReplayOptions;

use super::args::{Format, Input};
use super::load::Reading;

#[derive(Args)]
pub struct OomArgs {
    #[command(flatten)]
    input: Input,
}

/// The states of the traces' out-of-memory events (the state at the end where a trace has
/// none), each with the trace's path when there are several.
pub fn ooms_of(traces: &[Trace]) -> Ooms {
    let mut ooms = Vec::new();
    for t in traces {
        for mut s in oom_states(t) {
            if traces.len() > 1 {
                s.trace = Some(t.path.display().to_string());
            }
            ooms.push(s);
        }
    }
    Ooms { ooms }
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
    let loaded = r.load(&args.input.traces, opts)?;
    let ooms = ooms_of(&loaded.traces);
    match args.input.format {
        Format::Json => writeln!(out, "{}", serde_json::to_string_pretty(&ooms)?)?,
        _ => write!(out, "{}", render_table(&ooms, device_namer(&loaded.traces)))?,
    }
    Ok(())
}
