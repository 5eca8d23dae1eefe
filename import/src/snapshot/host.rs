//! Pinned host memory (`_record_memory_history(record_pinned_host_memory=True)` in recent PyTorch): the CUDA host
//! allocator's `host_traces` and `host_segments`, in the layout of the device's own. They
//! become one more device, the host's, after the CUDA devices; nothing of it counts as device
//! memory.

use super::entries::{kind_name, Entry, Made, NONE};
use super::Unmapped;
use crate::pickle::{Store, Value};

/// The name the host device gets in a trace (`info`, `report`'s device lines).
pub(super) const PINNED_HOST: &str = "pinned";

/// The entries of `host_traces`: a list of entries (one host allocator), or a list of such
/// lists, read in order. Anything else in it is counted, not an error: the layout is new.
pub(super) fn entries(
    s: &Store<Made>,
    traces: Value<Made>,
    table: &[Entry],
    unmapped: &mut Unmapped,
) -> Vec<Entry> {
    let mut out = Vec::new();
    let take = |v: Value<Made>, out: &mut Vec<Entry>, unmapped: &mut Unmapped| match v {
        Value::Made(Made::Entry(i)) => match table.get(i as usize) {
            Some(e) if e.action.is_ok() => out.push(*e),
            Some(e) => unmapped.add(format!(
                "host trace entries with action `{}`",
                match e.action {
                    Err(name) if name != NONE => s.text(name),
                    _ => "?",
                }
            )),
            None => {}
        },
        other => unmapped.add(format!("`host_traces` items that are {}", kind_name(other))),
    };
    for &v in s.items(traces) {
        match v {
            Value::List(_) => {
                for &e in s.items(v) {
                    take(e, &mut out, unmapped);
                }
            }
            _ => take(v, &mut out, unmapped),
        }
    }
    out
}
