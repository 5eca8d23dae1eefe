//! `epochs`: fastai's `PeakMemMetric` columns.
//!
//! fastai polls; here the GPU figures are exact, from the pool's events replayed in time
//! order: used is the end-of-epoch bytes minus the beginning's, peak the highest bytes in
//! between minus the beginning's, each truncated to MB (`int(bytes / 2**20)`). fastai's rule
//! then applies to the GPU peak: a negative peak reads 0, else a positive used is subtracted
//! from it (the peak is reported as overhead on top of what the epoch kept). The CPU columns
//! are the same deltas from the recorder's CPU source, without that rule, as fastai's.
//!
//! Several traces (ranks) merge by taking, per epoch and column, the largest figure: the rank
//! closest to running out of memory is the one to look at (`--per-rank` shows each).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::csv::to_csv;
use crate::replay::{signed, EpochFigures, Profile};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct EpochRow {
    pub epoch: u32,
    pub cpu_used_mb: i64,
    pub cpu_peak_mb: i64,
    pub gpu_used_mb: i64,
    pub gpu_peak_mb: i64,
    pub gpu_used_bytes: i64,
    pub gpu_peak_bytes: i64,
    pub cpu_used_bytes: i64,
    pub cpu_peak_bytes: i64,
    /// False when the trace ended inside the epoch.
    pub complete: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Epochs {
    pub epochs: Vec<EpochRow>,
}

/// Python's `int(x / 2**20)`: truncation toward zero.
fn mb(bytes: i64) -> i64 {
    (bytes as f64 / (1u64 << 20) as f64).trunc() as i64
}

pub fn row(e: &EpochFigures) -> EpochRow {
    let gpu_used = e.gpu_end_bytes.saturating_sub(e.gpu_begin_bytes);
    let gpu_peak = e.gpu_max_bytes.saturating_sub(e.gpu_begin_bytes);
    let cpu_used = signed(e.cpu_end_bytes).saturating_sub(signed(e.cpu_begin_bytes));
    let cpu_peak = signed(e.cpu_peak_bytes).saturating_sub(signed(e.cpu_begin_bytes));
    let gpu_used_mb = mb(gpu_used);
    let mut gpu_peak_mb = mb(gpu_peak);
    if gpu_peak_mb < 0 {
        gpu_peak_mb = 0;
    } else if gpu_used_mb > 0 {
        gpu_peak_mb = gpu_peak_mb.saturating_sub(gpu_used_mb);
    }
    EpochRow {
        epoch: e.epoch,
        cpu_used_mb: mb(cpu_used),
        cpu_peak_mb: mb(cpu_peak),
        gpu_used_mb,
        gpu_peak_mb,
        gpu_used_bytes: gpu_used,
        gpu_peak_bytes: gpu_peak,
        cpu_used_bytes: cpu_used,
        cpu_peak_bytes: cpu_peak,
        complete: e.complete,
    }
}

pub fn epochs(p: &Profile) -> Epochs {
    let mut by_epoch: BTreeMap<u32, EpochRow> = BTreeMap::new();
    let mut order: Vec<u32> = Vec::new();
    for s in &p.sources {
        for e in &s.epochs {
            let r = row(e);
            match by_epoch.get_mut(&r.epoch) {
                Some(m) => {
                    m.cpu_used_mb = m.cpu_used_mb.max(r.cpu_used_mb);
                    m.cpu_peak_mb = m.cpu_peak_mb.max(r.cpu_peak_mb);
                    m.gpu_used_mb = m.gpu_used_mb.max(r.gpu_used_mb);
                    m.gpu_peak_mb = m.gpu_peak_mb.max(r.gpu_peak_mb);
                    m.gpu_used_bytes = m.gpu_used_bytes.max(r.gpu_used_bytes);
                    m.gpu_peak_bytes = m.gpu_peak_bytes.max(r.gpu_peak_bytes);
                    m.cpu_used_bytes = m.cpu_used_bytes.max(r.cpu_used_bytes);
                    m.cpu_peak_bytes = m.cpu_peak_bytes.max(r.cpu_peak_bytes);
                    m.complete &= r.complete;
                }
                None => {
                    order.push(r.epoch);
                    by_epoch.insert(r.epoch, r);
                }
            }
        }
    }
    Epochs {
        epochs: order
            .into_iter()
            .filter_map(|n| by_epoch.remove(&n))
            .collect(),
    }
}

/// fastai's layout: `epoch` and the four memory columns, numbers right-aligned under their
/// names. An epoch the trace ended inside is marked with `*` and a note.
pub fn render_table(e: &Epochs) -> String {
    if e.epochs.is_empty() {
        return "no epochs in this trace (mark them with epoch_begin/epoch_end)\n".into();
    }
    let head = ["epoch", "cpu used", "peak", "gpu used", "peak"];
    let mut out = head.join(" ");
    out.insert_str(5, "  ");
    out.push('\n');
    let mut cut = false;
    for r in &e.epochs {
        let mark = if r.complete { " " } else { "*" };
        cut |= !r.complete;
        out.push_str(&format!(
            "{:>5}{mark}  {:>8} {:>4} {:>8} {:>4}\n",
            r.epoch, r.cpu_used_mb, r.cpu_peak_mb, r.gpu_used_mb, r.gpu_peak_mb
        ));
    }
    if cut {
        out.push_str("* the trace ended inside this epoch: figures up to the trace's end\n");
    }
    out
}

pub fn render_csv(e: &Epochs) -> String {
    to_csv(&e.epochs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fig(begin: i64, end: i64, max: i64) -> EpochFigures {
        EpochFigures {
            epoch: 1,
            begin_ns: 0,
            end_ns: 1,
            complete: true,
            gpu_begin_bytes: begin,
            gpu_end_bytes: end,
            gpu_max_bytes: max,
            cpu_begin_bytes: 0,
            cpu_end_bytes: 0,
            cpu_peak_bytes: 2 << 20,
        }
    }

    const MB: i64 = 1 << 20;

    /// fastai's first sample row: used 80, peak 6300 - 80.
    #[test]
    fn fastai_rule() {
        let r = row(&fig(100 * MB, 180 * MB, 6400 * MB));
        assert_eq!((r.gpu_used_mb, r.gpu_peak_mb, r.cpu_peak_mb), (80, 6220, 2));
        // Used negative: peak is the straight difference from the beginning.
        let r = row(&fig(500 * MB, 100 * MB, 900 * MB));
        assert_eq!((r.gpu_used_mb, r.gpu_peak_mb), (-400, 400));
        // Truncation toward zero, as int().
        let r = row(&fig(0, MB / 2, MB + MB / 2));
        assert_eq!((r.gpu_used_mb, r.gpu_peak_mb), (0, 1));
        let r = row(&fig(MB, MB / 2, MB));
        assert_eq!(r.gpu_used_mb, 0);
    }

    #[test]
    fn table_layout() {
        let e = Epochs {
            epochs: vec![row(&fig(0, 80 * MB, 6300 * MB))],
        };
        assert_eq!(
            render_table(&e),
            "epoch   cpu used peak gpu used peak\n    1          0    2       80 6220\n"
        );
    }
}
