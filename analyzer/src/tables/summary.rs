//! The headline a reader looks at first and a CI diff gates on: peak used and acquired bytes,
//! allocations, out-of-memory errors, events and wall time.

use serde::Serialize;

use super::render::{humanized, seconds};
use super::{DiffKey, Figures, Quantity, ReportOptions, Table};
use crate::replay::{signed, Memory, Predicted, Profile};

/// Headline figures. With several traces (ranks), peaks are the largest rank's and counts
/// are summed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Summary {
    pub traces: Vec<String>,
    pub events: u64,
    pub duration_ns: u64,
    pub peak_used_bytes: u64,
    pub peak_acquired_bytes: u64,
    /// Pool mallocs that succeeded.
    pub total_allocations: u64,
    /// Pool misses that went to the device.
    pub device_allocations: u64,
    pub out_of_memory: u64,
    pub warnings: Vec<String>,
    /// What memory the figures are about; left out of the JSON where the trace does not say
    /// (a pool, as before format 1.4).
    #[serde(skip_serializing_if = "Memory::unspecified")]
    pub memory: Memory,
    /// Set when the figures are a prediction (`poolsight.torch.fake_cuda`, format 1.7).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prediction: Option<Predicted>,
}

pub fn summary(p: &Profile) -> Summary {
    let s = &p.sources;
    Summary {
        traces: s.iter().map(|s| s.path.clone()).collect(),
        events: s.iter().map(|s| s.events).sum(),
        duration_ns: p.duration_ns(),
        peak_used_bytes: s.iter().map(|s| s.pool.peak_used_bytes).max().unwrap_or(0),
        peak_acquired_bytes: s
            .iter()
            .map(|s| s.pool.peak_acquired_bytes)
            .max()
            .unwrap_or(0),
        total_allocations: s.iter().map(|s| s.pool.mallocs).sum(),
        device_allocations: s.iter().map(|s| s.pool.device_allocs).sum(),
        out_of_memory: s.iter().map(|s| s.pool.out_of_memory).sum(),
        warnings: s
            .iter()
            .flat_map(|s| s.warnings.iter().map(move |w| format!("{}: {w}", s.path)))
            .collect(),
        memory: p.memory(),
        prediction: p.prediction().cloned(),
    }
}

pub fn render_summary(s: &Summary) -> String {
    let ooms = if s.out_of_memory > 0 {
        format!("; {} out-of-memory errors", s.out_of_memory)
    } else {
        String::new()
    };
    // Live bytes at the peak first: that is what fills a device. The tables below count
    // cumulative bytes, which a reader could mistake for it, so the headline says so. Memory
    // observed outside any pool (PyTorch's tensors) has no pool and nothing held beyond what
    // is live: the headline says what memory it is instead.
    let m = &s.memory;
    let peak = if m.observed {
        format!(
            "peak live {} of {} ({}: no pool); {} allocations{ooms}",
            humanized(s.peak_used_bytes),
            m.what(),
            if s.prediction.is_some() {
                "predicted"
            } else {
                "observed"
            },
            s.total_allocations,
        )
    } else {
        let from = m.pool_source();
        format!(
            "peak live {} (the pool held at most {} from {from}); {} allocations ({} from {from}){ooms}",
            humanized(s.peak_used_bytes),
            humanized(s.peak_acquired_bytes),
            s.total_allocations,
            s.device_allocations,
        )
    };
    let predicted = match &s.prediction {
        Some(p) => format!("{}\n", p.line()),
        None => String::new(),
    };
    format!(
        "{predicted}{peak}; {} events over {}\n\
         functions and lines below count cumulative bytes: every allocation request, frees not subtracted\n",
        s.events,
        seconds(s.duration_ns),
    )
}

/// The headline figures as one CSV row (the trace paths joined by `;`).
#[derive(Debug, Default, Serialize)]
struct SummaryRow {
    traces: String,
    events: u64,
    duration_ns: u64,
    peak_used_bytes: u64,
    peak_acquired_bytes: u64,
    total_allocations: u64,
    device_allocations: u64,
    out_of_memory: u64,
    warnings: u64,
}

impl Table for Summary {
    const NAME: &'static str = "summary";
    const SECTION: &'static str = "headline";
    const FIGURES: &'static [DiffKey] = &[
        DiffKey::headline("peak_used", None, Quantity::Bytes),
        DiffKey::headline("peak_acquired", Some("acquired"), Quantity::Bytes),
        DiffKey::headline("allocations", None, Quantity::Count),
        DiffKey::headline("device_allocations", None, Quantity::Count),
        DiffKey::headline("out_of_memory", None, Quantity::Count),
        DiffKey::headline("time", Some("wall_time"), Quantity::Nanoseconds),
    ];

    fn compute(p: &Profile, _: &ReportOptions) -> Summary {
        summary(p)
    }

    fn render_table(&self, _: &ReportOptions) -> String {
        render_summary(self)
    }

    fn render_csv(&self) -> String {
        super::csv::to_csv(&[SummaryRow {
            traces: self.traces.join(";"),
            events: self.events,
            duration_ns: self.duration_ns,
            peak_used_bytes: self.peak_used_bytes,
            peak_acquired_bytes: self.peak_acquired_bytes,
            total_allocations: self.total_allocations,
            device_allocations: self.device_allocations,
            out_of_memory: self.out_of_memory,
            warnings: self.warnings.len() as u64,
        }])
    }

    fn figures(&self, out: &mut Figures) {
        out.headline::<Self>("peak_used", signed(self.peak_used_bytes));
        out.headline::<Self>("peak_acquired", signed(self.peak_acquired_bytes));
        out.headline::<Self>("allocations", signed(self.total_allocations));
        out.headline::<Self>("device_allocations", signed(self.device_allocations));
        out.headline::<Self>("out_of_memory", signed(self.out_of_memory));
        out.headline::<Self>("time", signed(self.duration_ns));
    }
}
