//! One JSON object per line (stacks first, then every event), for pandas and `jq` users who
//! want the raw events rather than a report.

use std::io::{BufWriter, Write};

use rustc_hash::FxHashMap;

use super::{
    frame_text, json_str, scope_span, scope_text, ExportError, ExportSummary, BUFFER_BYTES,
};
use poolsight_analyzer::read::names::{mark_kind_name, mem_kind_name};
use poolsight_analyzer::read::{ChunkKind, Trace};

/// Writes one trace as JSON Lines: first a `stack` line per interned stack (by id), then every
/// event in chunk order, rebase markers left out. The keys are stable (scripts rely on them):
///
/// - `{"type":"stack","id","parent","file","line","name","kind","phase"}`, `kind` one of site,
///   function, link, scope, foreign;
/// - memory events: `{"type":"malloc_post"|..,"ns","thread","device","stream","ptr","bytes",
///   "stack"}`, types as `poolsight info` names them;
/// - scopes: `{"type":"function"|"link"|"scope","end_ns","duration_ns","stack","thread"}`;
/// - marks: `{"type":"epoch_begin"|"epoch_end"|"cpu_sample"|"scope_abort","ns","epoch","a","b"}`
///   (`scope_abort`: `epoch` holds the raising scope's stack id, `a` the ticks it opened at).
///
/// Times are nanoseconds since the trace started. Lines are in the order chunks were reserved,
/// which is time order within a thread but not across threads: sort by time when that matters.
pub fn jsonl(trace: &Trace, out: &mut dyn Write) -> Result<ExportSummary, ExportError> {
    let mut w = BufWriter::with_capacity(BUFFER_BYTES, out);
    let mut summary = ExportSummary::default();
    let defs = &trace.defs;
    let mut ids: Vec<u32> = defs.stacks.keys().copied().collect();
    ids.sort_unstable();
    for id in ids {
        let Some(&(parent, frame)) = defs.stacks.get(&id) else {
            continue;
        };
        let f = frame_text(defs, frame);
        write!(
            w,
            "{{\"type\":\"stack\",\"id\":{id},\"parent\":{parent},\"file\":"
        )?;
        json_str(&mut w, f.file)?;
        write!(w, ",\"line\":{},\"name\":", f.line)?;
        json_str(&mut w, &f.name)?;
        writeln!(
            w,
            ",\"kind\":\"{}\",\"phase\":\"{}\"}}",
            f.kind.as_str(),
            f.phase.as_str()
        )?;
        summary.stacks += 1;
    }
    // Scope kinds by stack: one lookup chain per stack, not per event.
    let mut scope_kinds: FxHashMap<u32, &'static str> = FxHashMap::default();
    for c in &trace.chunks {
        match c.kind {
            ChunkKind::Mem => {
                for (ticks, e) in trace.mem_timeline(c) {
                    writeln!(
                        w,
                        "{{\"type\":\"{}\",\"ns\":{},\"thread\":{},\"device\":{},\"stream\":{},\"ptr\":{},\"bytes\":{},\"stack\":{}}}",
                        mem_kind_name(e.kind()),
                        trace.ns_since_start(ticks),
                        c.thread,
                        e.device(),
                        e.stream(),
                        e.ptr(),
                        e.bytes(),
                        e.stack(),
                    )?;
                    summary.mem_events += 1;
                }
            }
            ChunkKind::Scope => {
                for (end_ticks, e) in trace.scope_timeline(c) {
                    let stack = e.stack();
                    let kind = *scope_kinds
                        .entry(stack)
                        .or_insert_with(|| scope_text(defs, stack).category());
                    let (start_ns, end_ns) = scope_span(trace, end_ticks, e.duration());
                    writeln!(
                        w,
                        "{{\"type\":\"{kind}\",\"end_ns\":{end_ns},\"duration_ns\":{},\"stack\":{stack},\"thread\":{}}}",
                        end_ns - start_ns,
                        c.thread,
                    )?;
                    summary.scopes += 1;
                }
            }
            ChunkKind::Mark => {
                for e in trace.mark_events(c) {
                    writeln!(
                        w,
                        "{{\"type\":\"{}\",\"ns\":{},\"epoch\":{},\"a\":{},\"b\":{}}}",
                        mark_kind_name(e.kind()),
                        trace.ns_since_start(e.ticks()),
                        e.aux(),
                        e.a(),
                        e.b(),
                    )?;
                    summary.marks += 1;
                }
            }
            ChunkKind::Defs | ChunkKind::Footer => {}
        }
        trace.release_pages(c);
    }
    w.flush()?;
    summary.records = summary.stacks + summary.mem_events + summary.scopes + summary.marks;
    Ok(summary)
}
