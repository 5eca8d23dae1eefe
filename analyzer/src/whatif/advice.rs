//! What the model says at an out-of-memory (`poolsight oom`'s advice, from figures rather than
//! rules of thumb): the run replayed on the device's capacity under its recorded settings,
//! with expandable segments and with a split limit, each with its reserved peak, whether it
//! fits, and the smallest capacity it fits in.

use rayon::prelude::*;
use serde::Serialize;

use super::devices::{devices, CapacitySource};
use super::{replay_device, Allocator, Recorded, Settings};
use crate::read::Trace;
use crate::units::humanized as human;

/// One setting replayed on the device of an out-of-memory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModelRun {
    pub label: String,
    pub recorded: bool,
    pub reserved_peak_bytes: u64,
    pub fits: bool,
    /// The smallest capacity it fits in (`None`: none tried).
    pub min_capacity_bytes: Option<u64>,
}

/// The model's replays of one device at its out-of-memory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModelAdvice {
    pub device: u32,
    /// The capacity replayed: the bytes reserved plus the device's free at the recorded
    /// out-of-memory, or the trace's device memory.
    pub capacity_bytes: u64,
    pub runs: Vec<ModelRun>,
}

/// The settings tried at an out-of-memory of `requested` bytes: the recorded ones,
/// expandable segments, and a split limit at the request's size (at least 20 MiB, the
/// smallest PyTorch accepts), each over the recorded ones.
fn settings_at(recorded: &Settings, requested: u64) -> Vec<(Settings, bool)> {
    let mb = (requested >> 20).max(20);
    let mut out = vec![(recorded.clone(), true)];
    for conf in [
        "expandable_segments:True".to_string(),
        format!("max_split_size_mb:{mb}"),
    ] {
        if let Ok(s) = Settings::parse(&conf) {
            let s = s.over(recorded);
            if !out.iter().any(|(o, _)| *o == s) {
                out.push((s, false));
            }
        }
    }
    out
}

/// The model's replays of `trace`'s device `device`, whose first out-of-memory asked for
/// `requested` bytes; `None` when PyTorch's caching allocator did not record it (only a
/// snapshot's out-of-memory is the one the model's settings speak of), when the file gives no
/// capacity to replay on, or when the request alone is larger than it (no setting helps, and
/// `oom` says so already).
pub fn at_oom(
    trace: &Trace,
    recorded: &Recorded,
    device: u32,
    requested: u64,
) -> Option<ModelAdvice> {
    if !super::recorded_by_pytorch(trace) {
        return None;
    }
    let d = devices(trace, None)
        .into_iter()
        .find(|d| d.device == device)?;
    let capacity = d
        .capacity
        .filter(|&c| d.capacity_source != CapacitySource::None && requested <= c)?;
    let tried = settings_at(&recorded.settings, requested);
    let runs = tried
        .par_iter()
        .map(|(s, rec)| {
            let (o, min) = replay_device(&d, Allocator::Pytorch, s, true);
            ModelRun {
                label: s.label(),
                recorded: *rec,
                reserved_peak_bytes: o.reserved_peak,
                fits: o.first_failure.is_none(),
                min_capacity_bytes: min,
            }
        })
        .collect();
    Some(ModelAdvice {
        device,
        capacity_bytes: capacity,
        runs,
    })
}

impl ModelAdvice {
    /// The advice in words, one line per finding.
    pub fn lines(&self) -> Vec<String> {
        let cap = human(self.capacity_bytes);
        let needs = |r: &ModelRun| {
            r.min_capacity_bytes
                .map_or("more than any device".to_string(), human)
        };
        let mut out = Vec::new();
        if let Some(r) = self.runs.iter().find(|r| r.recorded) {
            out.push(if r.fits {
                format!(
                    "the model of PyTorch's allocator, replaying this run with its settings \
                     ({}) on the {cap} it had, does not run out of memory: the failure came \
                     from outside the allocator's rules (another process, a memory fraction?)",
                    r.label
                )
            } else {
                format!(
                    "the model of PyTorch's allocator, replaying this run with its settings \
                     ({}), runs out of memory in the {cap} it had too; the run needs {}",
                    r.label,
                    needs(r)
                )
            });
        }
        for r in self.runs.iter().filter(|r| !r.recorded) {
            out.push(if r.fits {
                format!(
                    "with {} this run peaks at {} reserved and fits in the {cap} (it needs {})",
                    r.label,
                    human(r.reserved_peak_bytes),
                    needs(r)
                )
            } else {
                format!(
                    "with {} this run still does not fit in the {cap} (it needs {})",
                    r.label,
                    needs(r)
                )
            });
        }
        if !self.runs.iter().any(|r| r.fits) {
            let best = self
                .runs
                .iter()
                .filter_map(|r| Some((r.min_capacity_bytes?, r)))
                .min_by_key(|(m, _)| *m);
            let tried: Vec<&str> = self.runs.iter().map(|r| r.label.as_str()).collect();
            out.push(match best {
                Some((m, r)) => format!(
                    "no setting of these ({}) fits in the device's {cap}: the smallest device \
                     this run fits is {}, with {}",
                    tried.join("; "),
                    human(m),
                    r.label
                ),
                None => format!(
                    "no setting of these ({}) fits in the device's {cap}",
                    tried.join("; ")
                ),
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn run(label: &str, recorded: bool, fits: bool, min: u64) -> ModelRun {
        ModelRun {
            label: label.into(),
            recorded,
            reserved_peak_bytes: 60 * MIB,
            fits,
            min_capacity_bytes: Some(min),
        }
    }

    #[test]
    fn no_setting_fits_is_said_with_the_smallest_device_that_would() {
        let mut a = ModelAdvice {
            device: 0,
            capacity_bytes: 40 * MIB,
            runs: vec![
                run("default", true, false, 80 * MIB),
                run("expandable_segments:True", false, false, 60 * MIB),
            ],
        };
        let lines = a.lines();
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert_eq!(
            lines[2],
            "no setting of these (default; expandable_segments:True) fits in the device's \
             40.00MB: the smallest device this run fits is 60.00MB, with expandable_segments:True"
        );
        a.runs[1].fits = true;
        let lines = a.lines();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[1].starts_with(
            "with expandable_segments:True this run peaks at 60.00MB reserved and fits"
        ));
        // The recorded settings fitting: the failure was not the allocator's rules'.
        a.runs[0].fits = true;
        assert!(a.lines()[0].contains("does not run out of memory"));
    }
}
