//! A snapshot's `allocator_settings`: the PyTorch caching allocator's options in effect when
//! the snapshot was taken (`PYTORCH_CUDA_ALLOC_CONF`, `max_split_size`, `expandable_segments`,
//! `roundup_power2_divisions`, ...), for a model that replays the run with them
//! (`poolsight whatif`). Read in a pass of its own that keeps nothing of the entries and
//! segments.

use crate::pickle::{self, Build, Store, Value};
use crate::ImportError;

/// Keys interned first, so that the builder knows them by id.
const KEYS: [&str; 3] = ["action", "filename", "blocks"];

/// Drops trace entries, frames, segments and every list holding one.
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

/// The `allocator_settings` of a snapshot pickle as (key, value) text, values as Python
/// prints them (`True`, `-1`, `0.6`, `{'1': 4, '2': 0}`); `None` for a snapshot without them.
pub fn allocator_settings(data: &[u8]) -> Result<Option<Vec<(String, String)>>, ImportError> {
    let parsed = pickle::parse(data, &KEYS, &mut Skip, None)?;
    let s = &parsed.store;
    let Some(settings) = s.get(parsed.root, "allocator_settings") else {
        return Ok(None);
    };
    Ok(Some(
        s.pairs(settings)
            .filter_map(|(k, v)| Some((s.str(k)?.to_string(), text(s, v))))
            .collect(),
    ))
}

fn text(s: &Store<()>, v: Value<()>) -> String {
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
