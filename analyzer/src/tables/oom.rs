//! `oom`: why a run ran out of memory ([`crate::replay::oom_states`] computes the state at each
//! out-of-memory; this module renders it). Also the last section of `report` when a file holds
//! an out-of-memory.

use serde::Serialize;

use super::render::{aligned, humanized};
use crate::read::Trace;
use crate::replay::{OomState, PoolState};
use crate::whatif::advice::{at_oom, ModelAdvice};
use crate::whatif::Recorded;

/// The out-of-memory section of `traces`, built once for `oom`, `report` and `html`: the
/// state at each out-of-memory event (at the end, for a trace without one), named by its trace
/// when there are several, and at each device's first out-of-memory the allocator model's
/// replays under the settings the trace recorded ([`Recorded::of_trace`]), their advice among
/// the state's. The models, one per state, are for `--format json`.
pub fn section<'t>(
    traces: impl IntoIterator<Item = &'t Trace>,
) -> (Ooms, Vec<Option<ModelAdvice>>) {
    let traces: Vec<&Trace> = traces.into_iter().collect();
    let (mut ooms, mut models) = (Vec::new(), Vec::new());
    for &t in &traces {
        let mut known: Option<Recorded> = None;
        let mut by_device: std::collections::HashMap<u32, Option<ModelAdvice>> =
            std::collections::HashMap::new();
        for mut s in crate::replay::oom_states(t) {
            if traces.len() > 1 {
                s.trace = Some(t.path.display().to_string());
            }
            let model = s.requested_bytes.and_then(|req| {
                let rec = known.get_or_insert_with(|| Recorded::of_trace(t));
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

/// A device's name in `traces` (`cuda:0`), or `device N`.
pub fn device_name(traces: &[Trace], id: u32) -> String {
    traces
        .iter()
        .flat_map(|t| &t.defs.devices)
        .find(|d| d.id == id && !d.name.is_empty())
        .map_or_else(|| format!("device {id}"), |d| d.name.clone())
}

/// The `oom` command's result: the states of every trace, in order.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Ooms {
    pub ooms: Vec<OomState>,
}

/// `oom --format json`: each state, with the model's replays where they were made (the model's
/// findings are in the state's `advice` as well).
#[derive(Debug, Serialize)]
pub struct OomsJson<'a> {
    pub ooms: Vec<OomJson<'a>>,
}

#[derive(Debug, Serialize)]
pub struct OomJson<'a> {
    #[serde(flatten)]
    pub state: &'a OomState,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub whatif: Option<&'a ModelAdvice>,
}

/// The JSON of `ooms`, `models[i]` the model's replays at `ooms.ooms[i]`.
pub fn json<'a>(ooms: &'a Ooms, models: &'a [Option<ModelAdvice>]) -> OomsJson<'a> {
    OomsJson {
        ooms: (ooms.ooms.iter())
            .enumerate()
            .map(|(i, state)| OomJson {
                state,
                whatif: models.get(i).and_then(Option::as_ref),
            })
            .collect(),
    }
}

fn pct(part: u64, whole: u64) -> String {
    if whole == 0 {
        "-".into()
    } else {
        format!("{:.0}%", part as f64 * 100.0 / whole as f64)
    }
}

fn pools_table(pools: &[PoolState]) -> String {
    let mut rows = vec![vec![
        "Pool".to_string(),
        "Stream".into(),
        "Segments".into(),
        "Reserved".into(),
        "Free".into(),
        "LargestFree".into(),
        "InactiveSplits".into(),
    ]];
    for p in pools {
        rows.push(vec![
            p.pool.to_string(),
            p.stream.to_string(),
            p.segments.to_string(),
            humanized(p.reserved_bytes),
            humanized(p.free_bytes),
            humanized(p.largest_free_block_bytes),
            format!(
                "{} ({})",
                p.inactive_split_blocks,
                humanized(p.inactive_split_bytes)
            ),
        ]);
    }
    aligned(&rows, true)
}

/// One state as a person reads it.
pub fn render_state(s: &OomState, device_name: &str) -> String {
    let mut out = String::new();
    let at = s.ns as f64 / 1e9;
    match (s.requested_bytes, s.rounded_bytes) {
        (Some(req), Some(rounded)) => out.push_str(&format!(
            "out of memory on {device_name}, stream {}, at {at:.6} s: asked {} (the allocator \
             rounds it to {}, {} pool)\n",
            s.stream,
            humanized(req),
            humanized(rounded),
            s.request_pool.unwrap_or("large")
        )),
        _ => out.push_str(&format!(
            "no out-of-memory in this file: the allocator's state on {device_name} at its end \
             ({at:.6} s)\n"
        )),
    }
    let free = s
        .device_free_bytes
        .map_or("not recorded".to_string(), humanized);
    out.push_str(&format!(
        "  device free {free}; reserved {}, allocated {}, reserved but unallocated {}\n",
        humanized(s.reserved_bytes),
        humanized(s.allocated_bytes),
        humanized(s.reserved_unallocated_bytes)
    ));
    if !s.pools.is_empty() {
        out.push('\n');
        for l in pools_table(&s.pools).lines() {
            out.push_str(&format!("  {l}\n"));
        }
    }
    if !s.live_by_category.is_empty() {
        let mut cats: Vec<(&String, &u64)> = s.live_by_category.iter().collect();
        cats.sort_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
        out.push_str("\n  live by category:\n");
        let mut rows = Vec::new();
        for (c, b) in cats {
            rows.push(vec![
                format!("    {c}"),
                humanized(*b),
                pct(*b, s.allocated_bytes),
            ]);
        }
        out.push_str(&aligned(&rows, true));
    }
    if !s.top_lines.is_empty() {
        out.push_str("\n  live by line (largest first):\n");
        let rows: Vec<Vec<String>> = s
            .top_lines
            .iter()
            .map(|l| {
                vec![
                    format!("    {}", humanized(l.bytes)),
                    pct(l.bytes, s.allocated_bytes),
                ]
            })
            .collect();
        for (figures, l) in aligned(&rows, false).lines().zip(&s.top_lines) {
            out.push_str(&format!("{figures}  {}\n", l.line));
        }
    }
    if !s.request_stack.is_empty() {
        out.push_str("\n  the request's stack (innermost last):\n");
        for f in &s.request_stack {
            out.push_str(&format!("    {f}\n"));
        }
    }
    if !s.advice.is_empty() {
        out.push_str("\n  what would help:\n");
        for a in &s.advice {
            out.push_str(&format!("  - {a}\n"));
        }
    }
    out
}

/// Every state, one after another.
pub fn render_table(o: &Ooms, device_name: impl Fn(u32) -> String) -> String {
    let parts: Vec<String> = o
        .ooms
        .iter()
        .map(|s| render_state(s, &device_name(s.device)))
        .collect();
    if parts.is_empty() {
        return "no memory in this file: nothing to explain\n".to_string();
    }
    parts.join("\n")
}
