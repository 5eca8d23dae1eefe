//! Whether a run is whole enough to compare: a trace that was killed before it was sealed,
//! lost chunks, dropped events or recorded nothing gives figures that look like a change
//! of the code when they are a loss of data. `info` names these; `diff` refuses them unless
//! told otherwise, so that a CI gate cannot pass on a broken run.

use crate::replay::Source;

/// What makes the run of `s` partial, one short phrase each; empty when it is whole.
pub fn problems(s: &Source) -> Vec<String> {
    let mut out = Vec::new();
    if !s.sealed {
        out.push(
            "unfinished (the writer never sealed its footer: killed, crashed or still recording)"
                .into(),
        );
    }
    if s.torn_chunks > 0 {
        out.push(format!("{} torn or corrupt chunk(s)", s.torn_chunks));
    }
    if s.dropped_events > 0 {
        out.push(format!("{} dropped event(s)", s.dropped_events));
    }
    if s.events == 0 {
        out.push("empty (no events recorded)".into());
    }
    out
}

/// One line naming each partial trace among `sources` and what is wrong with it; `None`
/// when all are whole.
pub fn describe(sources: &[Source]) -> Option<String> {
    let parts: Vec<String> = sources
        .iter()
        .filter_map(|s| {
            let p = problems(s);
            (!p.is_empty()).then(|| format!("{}: {}", s.path, p.join(", ")))
        })
        .collect();
    (!parts.is_empty()).then(|| parts.join("; "))
}
