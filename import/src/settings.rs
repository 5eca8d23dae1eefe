//! What a snapshot says of its allocator, for a model that replays the run (`poolsight
//! whatif`): its `allocator_settings` (the options in effect when the snapshot was taken:
//! `PYTORCH_CUDA_ALLOC_CONF`, `max_split_size`, `expandable_segments`,
//! `roundup_power2_divisions`, ...) and its `segments` (what the allocator held at the end,
//! block by block). Read in the conversion's own pass ([`crate::Converted::allocator`]), or in
//! a pass of its own ([`allocator_state`]).

use crate::pickle::{self, Build, Store, Value};
use crate::ImportError;

/// Keys interned first, so that the builder knows them by id.
const KEYS: [&str; 2] = ["action", "filename"];

/// Drops trace entries, frames and every list holding one.
struct Skip;

impl Build for Skip {
    type Made = ();

    fn dict(&mut self, _: &Store<()>, kv: &[Value<()>]) -> Option<()> {
        kv.chunks_exact(2)
            .any(|p| matches!(p[0], Value::Str(id) if (id as usize) < KEYS.len()))
            .then_some(())
    }

    fn list(&mut self, _: &Store<()>, items: &[Value<()>]) -> Option<()> {
        items
            .iter()
            .any(|v| matches!(v, Value::Made(())))
            .then_some(())
    }
}

/// What [`allocator_state`] reads, as a converted trace's header keeps it (format 1.7).
pub use poolsight_schema::header::{AllocatorState, HeldSegment};

/// The allocator settings and held segments of a snapshot pickle, in a pass of its own that
/// keeps nothing of the trace entries and frames. A conversion ([`crate::convert_file`]) hands
/// them back from its own pass ([`crate::Converted::allocator`]): this is for a caller that
/// has the trace already.
pub fn allocator_state(data: &[u8]) -> Result<AllocatorState, ImportError> {
    let parsed = pickle::parse(data, &KEYS, &mut Skip, None)?;
    Ok(state_of(&parsed.store, parsed.root))
}

/// The allocator settings and held segments of a parsed snapshot, whatever the parse kept of
/// its entries.
pub(crate) fn state_of<M: Copy>(s: &Store<M>, root: Value<M>) -> AllocatorState {
    let settings = s.get(root, "allocator_settings").map(|v| {
        s.pairs(v)
            .filter_map(|(k, v)| Some((s.str(k)?.to_string(), text(s, v))))
            .collect()
    });
    let segs = match root {
        Value::List(_) => Some(root),
        _ => s.get(root, "segments"),
    };
    let mut segments = Vec::new();
    for &seg in segs.map_or(&[][..], |v| s.items(v)) {
        let int = |key: &str| s.get(seg, key).and_then(|v| v.u64());
        let Some(address) = int("address") else {
            continue;
        };
        let small = match s.get(seg, "segment_type").and_then(|v| s.str(v)) {
            Some(t) => t == "small",
            None => s.get(seg, "is_large").and_then(|v| v.bool()) == Some(false),
        };
        let mut allocated = Vec::new();
        let mut at = address;
        for &b in s.get(seg, "blocks").map_or(&[][..], |v| s.items(v)) {
            let size = s.get(b, "size").and_then(|v| v.u64()).unwrap_or(0);
            let addr = s.get(b, "address").and_then(|v| v.u64()).unwrap_or(at);
            let state = s.get(b, "state").and_then(|v| s.str(v)).unwrap_or("");
            if state.starts_with("active") {
                allocated.push((addr, size));
            }
            at = addr.saturating_add(size);
        }
        segments.push(HeldSegment {
            device: int("device").unwrap_or(0).min(255) as u32,
            address,
            total_size: int("total_size").unwrap_or(0),
            stream: int("stream").unwrap_or(0),
            small,
            expandable: s.get(seg, "is_expandable").and_then(|v| v.bool()) == Some(true),
            allocated,
        });
    }
    AllocatorState { settings, segments }
}

fn text<M: Copy>(s: &Store<M>, v: Value<M>) -> String {
    match v {
        Value::None => "None".into(),
        Value::Bool(b) => if b { "True" } else { "False" }.into(),
        Value::Int(i) => i.to_string(),
        Value::UInt(u) => u.to_string(),
        Value::Float(f) => f.to_string(),
        Value::Str(id) => s.text(id).to_string(),
        Value::Dict(_) => {
            let items: Vec<String> = s
                .pairs(v)
                .map(|(k, x)| format!("'{}': {}", text(s, k), text(s, x)))
                .collect();
            format!("{{{}}}", items.join(", "))
        }
        other => other.kind_name().to_string(),
    }
}
