//! `epochs`: fastai's `PeakMemMetric` columns (fastai 1.0.61 `callbacks/mem.py`,
//! `PeakMemMetric.on_epoch_begin` / `on_epoch_end`, and `utils/mem.py`).
//!
//! fastai's GPU figures are NVML readings of the device memory in use, which is what the
//! pool holds from the device (its cached blocks included), each read as whole MB
//! (`int(bytes / 2**20)` in `gpu_mem_get_used`) *before* subtracting: used = mb(end) -
//! mb(begin), peak = mb(max during the epoch) - mb(begin). fastai polls the maximum from a
//! thread; here it is exact from the pool's events. Then fastai's rule: a peak below 0 reads 0,
//! else a positive used is subtracted from it (the peak is the overhead over what the epoch
//! kept). fastai empties the cache before its begin and end readings
//! (`gpu_mem_get_used_no_cache`); a program that wants the same calls `free_all_blocks` at its
//! epoch boundaries, and the readings here are the held bytes at the marks.
//!
//! fastai's CPU columns are `tracemalloc`'s, started at the epoch's begin: bytes of blocks
//! allocated since then, so they are never negative. The recorder keeps process-wide counters,
//! not per-block tags, so here they are the deltas from the epoch's begin, clamped at 0.
//!
//! poolsight's own figures stay beside fastai's: exact bytes held (`gpu_used_bytes`,
//! `gpu_peak_bytes`), live bytes handed out by the pool (`live_used_bytes`, `live_peak_bytes`)
//! and exact CPU bytes.
//!
//! Each `fit` is a table of its own, as fastai prints one per fit: a trace's epochs are split
//! into fits where an epoch number does not rise above the one before (fastai's `fine_tune`
//! fits epoch 0, then epochs 0 and 1), and rows are keyed by (fit, epoch), so repeated numbers
//! stay separate rows, in order.
//!
//! Several traces (ranks) merge by taking, per (fit, epoch) and column, the largest figure: the
//! rank closest to running out of memory is the one to look at (`--per-rank` shows each).

use std::collections::BTreeMap;

use serde::Serialize;

use super::columns::html_rows;
use super::{
    Cell, Columns, DiffKey, Figures, HtmlColumn, HtmlTable, Quantity, ReportOptions, Table,
};
use crate::replay::{signed, EpochFigures, Memory, Profile};
use crate::tables::csv::to_csv;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct EpochRow {
    pub epoch: u32,
    pub cpu_used_mb: i64,
    pub cpu_peak_mb: i64,
    pub gpu_used_mb: i64,
    pub gpu_peak_mb: i64,
    /// Exact change of the bytes held from the device over the epoch.
    pub gpu_used_bytes: i64,
    /// Exact highest bytes held during the epoch above its beginning.
    pub gpu_peak_bytes: i64,
    pub cpu_used_bytes: i64,
    pub cpu_peak_bytes: i64,
    /// Change of the bytes handed out by the pool (live tensors) over the epoch.
    pub live_used_bytes: i64,
    /// Highest live bytes during the epoch above its beginning.
    pub live_peak_bytes: i64,
    /// False when the trace ended inside the epoch.
    pub complete: bool,
    /// Which fit of the run the epoch belongs to, from 0: a new fit starts where an epoch
    /// number does not rise above the previous one.
    pub fit: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Epochs {
    pub epochs: Vec<EpochRow>,
    /// What memory the `gpu_*` figures are about; left out of the JSON where the trace does
    /// not say (a GPU pool, as before format 1.4). The keys keep fastai's names whatever it is.
    #[serde(skip_serializing_if = "Memory::unspecified")]
    pub memory: Memory,
}

/// Python's `int(x / 2**20)`: truncation toward zero.
fn mb(bytes: i64) -> i64 {
    (bytes as f64 / (1u64 << 20) as f64).trunc() as i64
}

pub fn row(e: &EpochFigures) -> EpochRow {
    let gpu_used_mb = mb(e.held_end_bytes) - mb(e.held_begin_bytes);
    let mut gpu_peak_mb = mb(e.held_max_bytes) - mb(e.held_begin_bytes);
    if gpu_peak_mb < 0 {
        gpu_peak_mb = 0;
    } else if gpu_used_mb > 0 {
        gpu_peak_mb -= gpu_used_mb;
    }
    let cpu_used = signed(e.cpu_end_bytes)
        .saturating_sub(signed(e.cpu_begin_bytes))
        .max(0);
    let cpu_peak = signed(e.cpu_peak_bytes)
        .saturating_sub(signed(e.cpu_begin_bytes))
        .max(0);
    EpochRow {
        epoch: e.epoch,
        cpu_used_mb: mb(cpu_used),
        cpu_peak_mb: mb(cpu_peak),
        gpu_used_mb,
        gpu_peak_mb,
        gpu_used_bytes: e.held_end_bytes.saturating_sub(e.held_begin_bytes),
        gpu_peak_bytes: e.held_max_bytes.saturating_sub(e.held_begin_bytes),
        cpu_used_bytes: cpu_used,
        cpu_peak_bytes: cpu_peak,
        live_used_bytes: e.gpu_end_bytes.saturating_sub(e.gpu_begin_bytes),
        live_peak_bytes: e.gpu_max_bytes.saturating_sub(e.gpu_begin_bytes),
        complete: e.complete,
        fit: 0,
    }
}

pub fn epochs(p: &Profile) -> Epochs {
    let mut by_key: BTreeMap<(u32, u32), EpochRow> = BTreeMap::new();
    let mut order: Vec<(u32, u32)> = Vec::new();
    for s in &p.sources {
        let mut fit = 0;
        let mut last: Option<u32> = None;
        for e in &s.epochs {
            if last.is_some_and(|l| e.epoch <= l) {
                fit += 1;
            }
            last = Some(e.epoch);
            let r = EpochRow { fit, ..row(e) };
            match by_key.get_mut(&(fit, r.epoch)) {
                Some(m) => {
                    m.cpu_used_mb = m.cpu_used_mb.max(r.cpu_used_mb);
                    m.cpu_peak_mb = m.cpu_peak_mb.max(r.cpu_peak_mb);
                    m.gpu_used_mb = m.gpu_used_mb.max(r.gpu_used_mb);
                    m.gpu_peak_mb = m.gpu_peak_mb.max(r.gpu_peak_mb);
                    m.gpu_used_bytes = m.gpu_used_bytes.max(r.gpu_used_bytes);
                    m.gpu_peak_bytes = m.gpu_peak_bytes.max(r.gpu_peak_bytes);
                    m.cpu_used_bytes = m.cpu_used_bytes.max(r.cpu_used_bytes);
                    m.cpu_peak_bytes = m.cpu_peak_bytes.max(r.cpu_peak_bytes);
                    m.live_used_bytes = m.live_used_bytes.max(r.live_used_bytes);
                    m.live_peak_bytes = m.live_peak_bytes.max(r.live_peak_bytes);
                    m.complete &= r.complete;
                }
                None => {
                    order.push((fit, r.epoch));
                    by_key.insert((fit, r.epoch), r);
                }
            }
        }
    }
    // Rows of one fit together, fits in order; within a fit, in the order first seen.
    order.sort_by_key(|&(fit, _)| fit);
    Epochs {
        epochs: order
            .into_iter()
            .filter_map(|k| by_key.remove(&k))
            .collect(),
        memory: p.memory(),
    }
}

/// The table as fastprogress prints it (`ConsoleMasterBar.write(line, table=True)` in
/// fastprogress/fastprogress.py): header names padded to 8 and joined by two spaces; each value
/// followed by spaces up to its header's width plus two; the header again at each fit. An
/// epoch the trace ended inside is marked with `*` and a note. The device columns keep
/// fastai's `gpu used` where the memory is a GPU's (or the trace does not say), and name what
/// it is otherwise ([`Memory::epoch_column`]).
pub fn render_table(e: &Epochs) -> String {
    if e.epochs.is_empty() {
        return "no epochs in this trace (mark them with epoch_begin/epoch_end)\n".into();
    }
    let device = format!("{} used", e.memory.epoch_column());
    let names: Vec<String> = ["epoch", "cpu used", "peak", &device, "peak"]
        .iter()
        .map(|n| format!("{n:<8}"))
        .collect();
    let header = names.join("  ") + "\n";
    let mut out = String::new();
    let mut cut = false;
    for (i, r) in e.epochs.iter().enumerate() {
        // A table per fit, as fastai prints one per fit.
        if i == 0 || r.fit != e.epochs[i - 1].fit {
            out.push_str(&header);
        }
        let mark = if r.complete { "" } else { "*" };
        cut |= !r.complete;
        let values = [
            format!("{}{mark}", r.epoch),
            r.cpu_used_mb.to_string(),
            r.cpu_peak_mb.to_string(),
            r.gpu_used_mb.to_string(),
            r.gpu_peak_mb.to_string(),
        ];
        for (v, n) in values.iter().zip(&names) {
            let w = n.len() + 2;
            out.push_str(&format!("{v:<w$}"));
        }
        out.push('\n');
    }
    if cut {
        out.push_str("* the trace ended inside this epoch: figures up to the trace's end\n");
    }
    out
}

pub fn render_csv(e: &Epochs) -> String {
    to_csv(&e.epochs)
}

impl Table for Epochs {
    const NAME: &'static str = "epochs";
    const FIGURES: &'static [DiffKey] = &[
        DiffKey::scoped("epoch", "gpu_used", Quantity::Bytes),
        DiffKey::scoped("epoch", "gpu_peak", Quantity::Bytes),
        DiffKey::scoped("epoch", "cpu_used", Quantity::Bytes),
        DiffKey::scoped("epoch", "cpu_peak", Quantity::Bytes),
    ];

    fn compute(p: &Profile, _: &ReportOptions) -> Epochs {
        epochs(p)
    }

    fn render_table(&self, _: &ReportOptions) -> String {
        render_table(self)
    }

    fn render_csv(&self) -> String {
        render_csv(self)
    }

    fn figures(&self, out: &mut Figures) {
        for e in &self.epochs {
            // The epochs of a later fit (fastai's fine_tune repeats numbers) as "fit:epoch".
            let n = if e.fit == 0 {
                e.epoch.to_string()
            } else {
                format!("{}:{}", e.fit, e.epoch)
            };
            out.scoped::<Self>("epoch", &n, "gpu_used", e.gpu_used_bytes);
            out.scoped::<Self>("epoch", &n, "gpu_peak", e.gpu_peak_bytes);
            out.scoped::<Self>("epoch", &n, "cpu_used", e.cpu_used_bytes);
            out.scoped::<Self>("epoch", &n, "cpu_peak", e.cpu_peak_bytes);
        }
    }

    /// fastai's `PeakMemMetric` columns and the exact bytes, as the `epochs` JSON.
    fn columns(&self) -> Option<Columns> {
        let rows = &self.epochs;
        Columns::default()
            .ints("epoch", rows, |r| i64::from(r.epoch))
            .ints("cpu_used_mb", rows, |r| r.cpu_used_mb)
            .ints("cpu_peak_mb", rows, |r| r.cpu_peak_mb)
            .ints("gpu_used_mb", rows, |r| r.gpu_used_mb)
            .ints("gpu_peak_mb", rows, |r| r.gpu_peak_mb)
            .ints("gpu_used_bytes", rows, |r| r.gpu_used_bytes)
            .ints("gpu_peak_bytes", rows, |r| r.gpu_peak_bytes)
            .ints("cpu_used_bytes", rows, |r| r.cpu_used_bytes)
            .ints("cpu_peak_bytes", rows, |r| r.cpu_peak_bytes)
            .ints("live_used_bytes", rows, |r| r.live_used_bytes)
            .ints("live_peak_bytes", rows, |r| r.live_peak_bytes)
            .bools("complete", rows, |r| r.complete)
            .ints("fit", rows, |r| i64::from(r.fit))
            .into()
    }

    fn html(&self) -> Vec<HtmlTable> {
        // The device columns' labels, worded as the table's ([`Memory::epoch_column`]).
        let [used, peak, used_bytes, peak_bytes] = match self.memory.epoch_column() {
            "tensor" => [
                "tensor used",
                "tensor peak",
                "tensor used bytes",
                "tensor peak bytes",
            ],
            "pool" => [
                "pool used",
                "pool peak",
                "pool used bytes",
                "pool peak bytes",
            ],
            _ => ["gpu used", "gpu peak", "gpu used bytes", "gpu peak bytes"],
        };
        vec![HtmlTable {
            id: "epochs-table",
            title: "epochs",
            note: "fastai PeakMemMetric, MB",
            columns: vec![
                HtmlColumn::new("epoch", "epoch", Cell::Plain),
                HtmlColumn::new("cpu_used_mb", "cpu used", Cell::Plain),
                HtmlColumn::new("cpu_peak_mb", "cpu peak", Cell::Plain),
                HtmlColumn::new("gpu_used_mb", used, Cell::Plain),
                HtmlColumn::new("gpu_peak_mb", peak, Cell::Plain),
                HtmlColumn::new("gpu_used_bytes", used_bytes, Cell::Count),
                HtmlColumn::new("gpu_peak_bytes", peak_bytes, Cell::Count),
            ],
            rows: html_rows(&self.epochs),
        }]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Held bytes (begin, end, max); live bytes and CPU figures fixed.
    fn fig(begin: i64, end: i64, max: i64) -> EpochFigures {
        EpochFigures {
            epoch: 1,
            begin_ns: 0,
            end_ns: 1,
            complete: true,
            gpu_begin_bytes: 0,
            gpu_end_bytes: 0,
            gpu_max_bytes: 0,
            held_begin_bytes: begin,
            held_end_bytes: end,
            held_max_bytes: max,
            cpu_begin_bytes: 0,
            cpu_end_bytes: 0,
            cpu_peak_bytes: 2 << 20,
        }
    }

    const MB: i64 = 1 << 20;

    /// fastai callbacks/mem.py `PeakMemMetric.on_epoch_end`: used 80, peak 6300 - 80.
    #[test]
    fn fastai_rule() {
        let r = row(&fig(100 * MB, 180 * MB, 6400 * MB));
        assert_eq!((r.gpu_used_mb, r.gpu_peak_mb, r.cpu_peak_mb), (80, 6220, 2));
        // Used negative: peak is the straight difference from the beginning.
        let r = row(&fig(500 * MB, 100 * MB, 900 * MB));
        assert_eq!((r.gpu_used_mb, r.gpu_peak_mb), (-400, 400));
    }

    /// utils/mem.py `gpu_mem_get_used`: each reading is `int(bytes / 2**20)` before the
    /// subtraction. Begin 0.5 MB, end 1.5 MB: mb(1.5) - mb(0.5) = 1 - 0 = 1 (the exact delta,
    /// 1 MB, would read 1 as well); begin 0.9 MB, end 1.1 MB: 1 - 0 = 1, where the delta
    /// (0.2 MB) would read 0; begin 1.9 MB, max 2.1 MB: peak 2 - 1 = 1.
    #[test]
    fn readings_truncate_before_subtracting() {
        let r = row(&fig(MB / 2, MB + MB / 2, MB + MB / 2));
        assert_eq!((r.gpu_used_mb, r.gpu_peak_mb), (1, 0));
        let r = row(&fig(MB * 9 / 10, MB * 11 / 10, MB * 11 / 10));
        assert_eq!((r.gpu_used_mb, r.gpu_used_bytes), (1, MB / 5));
        let r = row(&fig(MB * 19 / 10, MB * 19 / 10, MB * 21 / 10));
        assert_eq!((r.gpu_used_mb, r.gpu_peak_mb), (0, 1));
    }

    /// tracemalloc counts only blocks allocated since the epoch began: never negative.
    #[test]
    fn cpu_never_negative() {
        let mut f = fig(0, 0, 0);
        f.cpu_begin_bytes = 50 << 20;
        f.cpu_end_bytes = 10 << 20;
        f.cpu_peak_bytes = 50 << 20;
        let r = row(&f);
        assert_eq!((r.cpu_used_mb, r.cpu_peak_mb, r.cpu_used_bytes), (0, 0, 0));
    }

    /// fastai's `fine_tune`: a fit of epoch 0, then a fit of epochs 0 and 1. Three rows in
    /// order, a table per fit (merging repeated numbers by maximum showed two rows).
    #[test]
    fn repeated_epoch_numbers_are_separate_fits() {
        let mut source = crate::replay::Source::default();
        for (n, held) in [(0, 10), (0, 20), (1, 30)] {
            source.epochs.push(EpochFigures {
                epoch: n,
                ..fig(0, held * MB, held * MB)
            });
        }
        let p = Profile {
            sources: vec![source],
            tree: Default::default(),
        };
        let e = epochs(&p);
        let rows: Vec<_> = e
            .epochs
            .iter()
            .map(|r| (r.fit, r.epoch, r.gpu_used_mb))
            .collect();
        assert_eq!(rows, [(0, 0, 10), (1, 0, 20), (1, 1, 30)]);
        assert_eq!(
            render_table(&e),
            "epoch     cpu used  peak      gpu used  peak    \n\
             0         0         2         10        0         \n\
             epoch     cpu used  peak      gpu used  peak    \n\
             0         0         2         20        0         \n\
             1         0         2         30        0         \n"
        );
    }

    /// Memory that is not a GPU's is not called one; fastai's names stay where it is (or where
    /// the trace does not say).
    #[test]
    fn device_columns_name_the_memory() {
        use crate::replay::MemoryKind;
        let header = |kind, observed| {
            let e = Epochs {
                epochs: vec![row(&fig(0, 0, 0))],
                memory: Memory { kind, observed },
            };
            render_table(&e)
                .lines()
                .next()
                .unwrap_or("")
                .trim_end()
                .to_string()
        };
        let gpu = "epoch     cpu used  peak      gpu used  peak";
        assert_eq!(header(MemoryKind::Unspecified, false), gpu);
        assert_eq!(header(MemoryKind::Gpu, true), gpu);
        assert_eq!(
            header(MemoryKind::Cpu, true),
            "epoch     cpu used  peak      tensor used  peak"
        );
        assert_eq!(
            header(MemoryKind::Cpu, false),
            "epoch     cpu used  peak      pool used  peak"
        );
    }

    /// fastprogress `ConsoleMasterBar.write(table=True)`.
    #[test]
    fn table_layout() {
        let e = Epochs {
            epochs: vec![row(&fig(0, 80 * MB, 6300 * MB))],
            memory: Memory::default(),
        };
        assert_eq!(
            render_table(&e),
            "epoch     cpu used  peak      gpu used  peak    \n\
             1         0         2         80        6220      \n"
        );
    }
}
