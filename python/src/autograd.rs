//! Which module call made an autograd node, for `poolsight.torch`: backward operators are
//! recorded under the module whose forward made their node.
//!
//! Autograd numbers the nodes a thread makes in order (`_sequence_nr`); the next number is
//! `torch._C._autograd._get_sequence_nr()`. A module call that starts at number `lo` and ends
//! at `hi` made exactly the nodes `lo..hi` of its thread, and calls nest, so the innermost call
//! whose span holds a node's number is the call that made it. The spans are kept here, in
//! Rust, because every backward operator asks.

use std::collections::BTreeMap;
use std::sync::Mutex;

use pyo3::prelude::*;

/// Spans kept at most; past it the oldest half is dropped (their nodes' backward is long over
/// in any training loop). The Python side clears them at each forward pass after a backward,
/// which keeps `find` short: it may pass over every span that does not hold its node.
const MAX_SPANS: usize = 1 << 20;

/// Module calls by the span of autograd sequence numbers they made nodes in.
#[pyclass(module = "poolsight._native", frozen)]
pub struct Spans {
    /// (lo, u64::MAX - hi) -> stack: for one `lo`, the innermost (smallest `hi`) comes last.
    spans: Mutex<BTreeMap<(u64, u64), u32>>,
}

#[pymethods]
impl Spans {
    #[new]
    fn new() -> Self {
        Spans {
            spans: Mutex::new(BTreeMap::new()),
        }
    }

    /// A call under `stack` made the nodes `lo..hi` (nothing when it made none).
    fn add(&self, lo: u64, hi: u64, stack: u32) {
        if hi <= lo {
            return;
        }
        let mut spans = self.spans.lock().unwrap_or_else(|e| e.into_inner());
        if spans.len() >= MAX_SPANS {
            let middle = spans.keys().nth(MAX_SPANS / 2).copied().unwrap_or_default();
            let newer = spans.split_off(&middle);
            *spans = newer;
        }
        spans.insert((lo, u64::MAX - hi), stack);
    }

    /// The stack of the innermost call that made node number `seq`, if a recorded one did.
    pub(crate) fn find(&self, seq: u64) -> Option<u32> {
        let spans = self.spans.lock().unwrap_or_else(|e| e.into_inner());
        spans
            .range(..=(seq, u64::MAX))
            .rev()
            .find(|((_, inv_hi), _)| seq < u64::MAX - inv_hi)
            .map(|(_, &stack)| stack)
    }

    /// Forgets every span (a new forward pass begins after the last one's backward ran).
    fn clear(&self) {
        self.spans.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    fn __len__(&self) -> usize {
        self.spans.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Spans>()?;
    Ok(())
}
