//! `poolsight oom`: why a run ran out of memory, from any trace or PyTorch file; with the
//! model's figures (`analyzer::whatif::advice`) where the file gives the device's capacity.

use std::collections::HashMap;
use std::io::Write;

use clap::Args;
use poolsight::analyzer::load::Inputs;
use poolsight::analyzer::read::Trace;
use poolsight::analyzer::replay::{oom_states, CategoryPass};
use poolsight::analyzer::tables::oom::{device_name, json, render_table, Ooms};
use poolsight::analyzer::whatif::advice::{at_oom, ModelAdvice};
use poolsight::analyzer::whatif::Recorded;
use poolsight::analyzer::ReplayOptions;

use super::args::{Format, Input};
use super::load::Reading;

#[derive(Args)]
pub struct OomArgs {
    #[command(flatten)]
    input: Input,
}

/// The states of the traces' out-of-memory events (the state at the end where a trace has
/// none), each with the trace's path when there are several, and the model's advice at the
/// first out-of-memory of each device, from what `inputs` (the files the traces were opened
/// for) recorded of their allocator.
pub fn ooms_of(traces: &[Trace], inputs: &Inputs) -> Ooms {
    ooms_with(traces, |t| inputs.recorded_of(t)).0
}

/// [`ooms_of`], with what is known of each trace's allocator, and the model's replays.
fn ooms_with(
    traces: &[Trace],
    recorded: impl Fn(&Trace) -> Recorded,
) -> (Ooms, Vec<Option<ModelAdvice>>) {
    let (mut ooms, mut models) = (Vec::new(), Vec::new());
    for t in traces {
        let mut known: Option<Recorded> = None;
        let mut by_device: HashMap<u32, Option<ModelAdvice>> = HashMap::new();
        for mut s in oom_states(t) {
            if traces.len() > 1 {
                s.trace = Some(t.path.display().to_string());
            }
            let model = s.requested_bytes.and_then(|req| {
                let rec = known.get_or_insert_with(|| recorded(t));
                by_device
                    .entry(s.device)
                    .or_insert_with(|| at_oom(t, rec, s.device, req))
                    .clone()
            });
            if let Some(m) = &model {
                s.advice.extend(m.lines());
            }
            ooms.push(s);
            models.push(model);
        }
    }
    (Ooms { ooms }, models)
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
    // Each file read once: a snapshot's conversion hands back its allocator settings.
    let inputs = r.inputs(&args.input.traces)?;
    let loaded = r.load_inputs(&inputs, opts)?;
    let recorded = |t: &Trace| inputs.recorded_of(t);
    let (ooms, models) = ooms_with(&loaded.traces, recorded);
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
