//! What a prediction says: a trace written by `fake_cuda` (a training step run on fake CUDA
//! tensors, `poolsight.torch.fake_cuda`) read as what the step would do on the GPU — its
//! active and reserved peaks (the caching allocator model replaying the run), whether it fits,
//! the first request that would not, the smallest capacity, what was live at the peak — as
//! `poolsight predict` prints it and its `--format json` writes it, and as the Python module
//! returns it.

use std::path::Path;

use serde::Serialize;

use crate::load::{LoadError, LoadOptions, LoadWarning};
use crate::replay::{binary_bytes as gib, CategoryPass, Predicted};
use crate::tables::peak::{self, Share};
use crate::whatif::{self, Allocator, Failure, Options, Recorded, WhatifError};
use crate::ReplayOptions;
use poolsight_alloc_models::pytorch::{Settings, SettingsError};

/// What a prediction says, as `poolsight predict` prints it and `--format json` writes it.
#[derive(Debug, Clone, Serialize)]
pub struct Prediction {
    pub trace: String,
    #[serde(flatten)]
    pub gpu: Option<Predicted>,
    /// The bytes the allocator may hold (the GPU's usable memory, or `--capacity`).
    pub capacity_bytes: Option<u64>,
    /// `PYTORCH_CUDA_ALLOC_CONF` the reserved figures are replayed under.
    pub settings: String,
    /// Most bytes of blocks handed out at once (`torch.cuda.max_memory_allocated()`).
    pub active_peak_bytes: u64,
    pub active_peak_ns: u64,
    /// Most bytes held from the device at once (`max_memory_reserved()`), the allocator model
    /// replaying the run.
    pub reserved_peak_bytes: u64,
    pub fragmentation_bytes: u64,
    pub fits: bool,
    pub first_failure: Option<Failure>,
    /// The smallest capacity the run fits in under these settings.
    pub min_capacity_bytes: Option<u64>,
    pub live_at_peak_by_category: Vec<Share>,
    pub live_at_peak_by_line: Vec<Share>,
}

/// Why a prediction could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PredictError {
    #[error("PYTORCH_CUDA_ALLOC_CONF {settings:?}: {source}")]
    Settings {
        settings: String,
        source: SettingsError,
    },
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Whatif(#[from] WhatifError),
    #[error("{0}")]
    Empty(&'static str),
}

/// Reads the prediction in `trace` (written by `fake_cuda` under `poolsight.record`): its
/// peaks, and the run replayed through the caching allocator model under `settings` on
/// `capacity` bytes (`None`: what the trace's device says). What was wrong with parts of the
/// file goes to `warn`.
pub fn summarize(
    trace: &Path,
    settings: &str,
    capacity: Option<u64>,
    load: &LoadOptions,
    warn: &mut dyn FnMut(&LoadWarning),
) -> Result<Prediction, PredictError> {
    let parsed = Settings::parse(settings).map_err(|source| PredictError::Settings {
        settings: settings.to_string(),
        source,
    })?;
    let replay = ReplayOptions {
        categories: CategoryPass::IfLabelled,
        live_at_peak: true,
        ..ReplayOptions::default()
    };
    let loaded = crate::load::load(&[trace], load, &replay, |_| {})?;
    loaded.warnings.iter().for_each(&mut *warn);
    let profile =
        (loaded.profiles.into_iter().next()).ok_or(PredictError::Empty("no trace was read"))?;
    let gpu = profile.prediction().cloned();
    let peak = peak::peak(&profile);
    let tr = loaded
        .traces
        .into_iter()
        .next()
        .ok_or(PredictError::Empty("no trace was read"))?;
    let recorded = Recorded::of_trace(&tr);
    let opts = Options {
        allocator: Allocator::Pytorch,
        alternatives: vec![parsed.clone()],
        capacity,
        min_capacity: true,
    };
    let name = trace.display().to_string();
    let reports = whatif::whatif(&tr, &name, &recorded, &opts)?;
    // The predicted device's report (the trace has no other device with requests).
    let report = reports
        .iter()
        .max_by_key(|rep| rep.requests)
        .ok_or(PredictError::Empty("the trace holds no memory requests"))?;
    let label = parsed.label();
    let run = report
        .runs
        .iter()
        .find(|run| run.label == label && !run.recorded)
        .or_else(|| report.runs.iter().find(|run| run.label == label))
        .or_else(|| report.runs.first())
        .ok_or(PredictError::Empty("the allocator model replayed nothing"))?;
    Ok(Prediction {
        trace: name,
        gpu,
        capacity_bytes: report.capacity_bytes,
        settings: if settings.trim().is_empty() {
            "default".into()
        } else {
            settings.trim().into()
        },
        active_peak_bytes: peak.peak_used_bytes,
        active_peak_ns: peak.peak_ns,
        reserved_peak_bytes: run.reserved_peak_bytes,
        fragmentation_bytes: run.fragmentation_bytes,
        fits: run.fits,
        first_failure: run.first_failure.clone(),
        min_capacity_bytes: run.min_capacity_bytes,
        live_at_peak_by_category: peak.by_category,
        live_at_peak_by_line: peak.by_line,
    })
}

/// Shortens a stack line to what fits a terminal: its innermost frames.
fn short(line: &str, width: usize) -> String {
    if line.chars().count() <= width {
        return line.to_string();
    }
    let tail: String = line
        .chars()
        .rev()
        .take(width.saturating_sub(2))
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    format!("… {tail}")
}

/// The prediction as `--format json` writes it.
pub fn json(p: &Prediction) -> String {
    serde_json::to_string_pretty(p)
        .unwrap_or_else(|e| format!("{{\"error\": {:?}}}", e.to_string()))
}

/// The prediction as a person reads it.
pub fn render(p: &Prediction) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    match &p.gpu {
        Some(g) => {
            let _ = writeln!(o, "{}", g.line());
        }
        None => {
            let _ = writeln!(
                o,
                "{}: not a prediction (no device of it was predicted by fake_cuda)",
                p.trace
            );
        }
    }
    let cap = p.capacity_bytes.map_or("unknown".into(), gib);
    let _ = writeln!(
        o,
        "active peak      {}  (the most bytes of live blocks: max_memory_allocated)",
        gib(p.active_peak_bytes)
    );
    if p.first_failure.is_some() {
        // The model's replay goes on past a failed request without serving it.
        let _ = writeln!(
            o,
            "reserved peak    {}  (the requests that fail not served; the allocator model under PYTORCH_CUDA_ALLOC_CONF={})",
            gib(p.reserved_peak_bytes),
            p.settings,
        );
    } else {
        let _ = writeln!(
            o,
            "reserved peak    {}  (the allocator model under PYTORCH_CUDA_ALLOC_CONF={}; {} of it cached, not live when last at that peak)",
            gib(p.reserved_peak_bytes),
            p.settings,
            gib(p.fragmentation_bytes)
        );
    }
    let _ = writeln!(o, "capacity         {cap}  (what the allocator may hold)");
    match (&p.first_failure, p.capacity_bytes) {
        (None, Some(c)) => {
            let _ = writeln!(
                o,
                "fits             yes, {} to spare at the reserved peak",
                gib(c.saturating_sub(p.reserved_peak_bytes))
            );
        }
        (None, None) => {
            let _ = writeln!(o, "fits             (no capacity known)");
        }
        (Some(f), _) => {
            let _ = writeln!(
                o,
                "fits             NO: a request of {} would fail at {} ({} reserved, {} allocated then)",
                gib(f.requested_bytes),
                f.line.as_deref().unwrap_or("an unknown line"),
                gib(f.reserved_bytes),
                gib(f.allocated_bytes)
            );
        }
    }
    if let Some(m) = p.min_capacity_bytes {
        let card = p
            .gpu
            .as_ref()
            .map(|g| {
                format!(
                    " (a GPU of at least {} with {} for the CUDA context)",
                    gib(m.saturating_add(g.prediction.context_bytes)),
                    gib(g.prediction.context_bytes)
                )
            })
            .unwrap_or_default();
        let _ = writeln!(o, "smallest capacity {}{card}", gib(m));
    }
    if !p.live_at_peak_by_category.is_empty() || !p.live_at_peak_by_line.is_empty() {
        let _ = writeln!(o, "live at the active peak:");
        let total = p.active_peak_bytes.max(1) as f64;
        for (title, rows) in [
            ("by category", &p.live_at_peak_by_category),
            ("by line", &p.live_at_peak_by_line),
        ] {
            if rows.is_empty() {
                continue;
            }
            let _ = writeln!(o, "  {title}:");
            for s in rows {
                let _ = writeln!(
                    o,
                    "    {:>11} {:>4.0}%  {}",
                    gib(s.bytes),
                    s.bytes as f64 * 100.0 / total,
                    short(&s.name, 130)
                );
            }
        }
    }
    o
}
