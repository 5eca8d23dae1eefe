//! "Where they part": the first moment the new run holds more live bytes than the base by
//! more than a margin, the two runs lined up step by step (epoch by epoch: a `ProfilerStep`
//! range, fastai's or Lightning's epochs) where both have the same steps, and within a step
//! (or the whole run, where they do not) by the share of its time elapsed, so that a slower
//! run is compared at the same point of its work rather than at the same clock time; the new
//! run's bytes there are set against the most the base held within [`SLACK`] of that point
//! (no two runs keep exactly the same pace).
//!
//! Each run's live bytes over time are its series ([`crate::replay::Series`]): buckets of
//! equal width holding the most reached in them, so no moment above the margin falls between
//! two points; the moment found is a bucket's start, as precise as the series.

use serde::Serialize;

use super::rules::{Rule, Threshold};
use crate::replay::Profile;

/// How far apart, as a share of the span lined up, the same point of two runs' work may lie:
/// the new run's bytes are compared with the base's most within it.
pub const SLACK: f64 = 0.02;

/// One run's live bytes over time and its steps, as the comparison needs them.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    /// (ns since the start, live bytes at most in the bucket from there), by time.
    pub points: Vec<(u64, i64)>,
    pub duration_ns: u64,
    /// (epoch number, begin ns, end ns), in order.
    pub steps: Vec<(u32, u64, u64)>,
    pub peak_bytes: u64,
}

impl Timeline {
    /// The timeline of a run's trace whose peak is the largest (a run of several ranks: the
    /// rank whose peak the headline says).
    pub fn of(p: &Profile) -> Option<Timeline> {
        let s = p.sources.iter().max_by_key(|s| s.pool.peak_used_bytes)?;
        let t0 = s.series.points.first().map_or(0, |p| p.0);
        Some(Timeline {
            points: (s.series.points.iter())
                .map(|&(t, used, _)| (t.saturating_sub(t0), used))
                .collect(),
            duration_ns: s.duration_ns,
            steps: (s.epochs.iter())
                .map(|e| {
                    (
                        e.epoch,
                        e.begin_ns.saturating_sub(t0),
                        e.end_ns.saturating_sub(t0),
                    )
                })
                .collect(),
            peak_bytes: s.pool.peak_used_bytes,
        })
    }

    /// The live bytes at `t`: the bucket's that holds it, or, between buckets with no event,
    /// the last one's before it.
    fn at(&self, t: u64) -> i64 {
        match self.points.partition_point(|p| p.0 <= t) {
            0 => 0,
            i => self.points[i - 1].1,
        }
    }

    /// The most live bytes from `t0` to `t1`.
    fn most_in(&self, t0: u64, t1: u64) -> i64 {
        let from = self.points.partition_point(|p| p.0 <= t0);
        let to = self.points.partition_point(|p| p.0 <= t1);
        (self.points[from..to].iter())
            .map(|p| p.1)
            .fold(self.at(t0), i64::max)
    }

    /// The spans the two runs are lined up by: (begin, end, step) — the time before the first
    /// step, then each step — when both runs have the same steps; else the whole run.
    fn spans(&self, same_steps: bool) -> Vec<(u64, u64, Option<u32>)> {
        if !same_steps {
            return vec![(0, self.duration_ns.max(self.last()), None)];
        }
        let mut out = vec![(0, self.steps[0].1, None)];
        out.extend(self.steps.iter().map(|&(n, b, e)| (b, e, Some(n))));
        out
    }

    fn last(&self) -> u64 {
        self.points.last().map_or(0, |p| p.0)
    }
}

/// Where the new run's live bytes first exceed the base's by more than the margin.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Parting {
    /// The margin, in bytes, and what it is: `1% of the base's peak (the default)` or the
    /// rule's (`peak_used>+5%`).
    pub margin_bytes: u64,
    pub margin: String,
    /// What was found; `None` when the new run never goes over the base by the margin.
    pub at: Option<PartingPoint>,
    /// Whether the runs were lined up step by step (both have the same steps); else by the
    /// share of the whole run elapsed.
    pub by_steps: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PartingPoint {
    /// The step both runs were in (their epoch number), if they were lined up by steps; `None`
    /// before the first step or when lined up by time alone ([`Parting::by_steps`]).
    pub step: Option<u32>,
    /// How far into the step (or into the run) both were, as a share of its time (0 to 1).
    pub share: f64,
    /// The moment in each run, ns since its start.
    pub base_ns: u64,
    pub new_ns: u64,
    pub base_bytes: i64,
    pub new_bytes: i64,
}

/// The margin a parting must exceed: the tightest rule on `peak_used`'s (a percentage of the
/// base's peak, or an amount), else 1 % of the base's peak.
pub fn margin(rules: &[Rule], base_peak: u64) -> (u64, String) {
    let of_rule = |r: &Rule| match r.threshold {
        Threshold::Percent(p) => (base_peak as f64 * p.max(0.0) / 100.0) as u64,
        Threshold::Amount(a) => a.max(0.0) as u64,
    };
    rules
        .iter()
        .filter(|r| r.matches("peak_used"))
        .map(|r| (of_rule(r), format!("the rule {}", r.text)))
        .min_by_key(|m| m.0)
        .unwrap_or_else(|| (base_peak / 100, "1% of the base's peak".to_string()))
}

/// The first moment the new run holds more than the base plus `margin`, the runs lined up
/// step by step where both have the same steps, else from their starts.
pub fn parting(base: &Timeline, new: &Timeline, margin: (u64, String)) -> Parting {
    let same_steps = !base.steps.is_empty()
        && base.steps.len() == new.steps.len()
        && (base.steps.iter().zip(&new.steps)).all(|(a, b)| a.0 == b.0);
    let mut at = None;
    'spans: for (b, n) in base
        .spans(same_steps)
        .into_iter()
        .zip(new.spans(same_steps))
    {
        let (lb, ln) = (b.1.saturating_sub(b.0), n.1.saturating_sub(n.0));
        // Every bucket start of either run inside the span, as the share of it elapsed. A
        // span of no time (a snapshot dumped without its history) is the one level it holds
        // throughout.
        let share = |t: u64, begin: u64, len: u64| (t - begin) as f64 / len as f64;
        let mut shares: Vec<f64> = (base.points.iter())
            .filter(|p| lb > 0 && p.0 >= b.0 && p.0 <= b.1)
            .map(|p| share(p.0, b.0, lb))
            .chain(
                (new.points.iter())
                    .filter(|p| ln > 0 && p.0 >= n.0 && p.0 <= n.1)
                    .map(|p| share(p.0, n.0, ln)),
            )
            .collect();
        shares.push(0.0);
        shares.sort_unstable_by(f64::total_cmp);
        shares.dedup();
        for f in shares {
            let (bt, nt) = (
                b.0 + (f * lb as f64).round() as u64,
                n.0 + (f * ln as f64).round() as u64,
            );
            // The base's most within SLACK of the same point: two runs of the same work
            // never keep exactly the same pace, and a rise a hair earlier is no growth.
            let slack = (SLACK * lb as f64) as u64;
            let (bb, nb) = (
                base.most_in(bt.saturating_sub(slack), bt + slack),
                new.at(nt),
            );
            if i128::from(nb) - i128::from(bb) > i128::from(margin.0) {
                at = Some(PartingPoint {
                    step: n.2,
                    share: f,
                    base_ns: bt,
                    new_ns: nt,
                    base_bytes: bb,
                    new_bytes: nb,
                });
                break 'spans;
            }
        }
    }
    Parting {
        margin_bytes: margin.0,
        margin: margin.1,
        by_steps: same_steps,
        at,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(points: &[(u64, i64)], steps: &[(u32, u64, u64)]) -> Timeline {
        Timeline {
            points: points.to_vec(),
            duration_ns: points.last().map_or(0, |p| p.0),
            steps: steps.to_vec(),
            peak_bytes: points.iter().map(|p| p.1).max().unwrap_or(0) as u64,
        }
    }

    #[test]
    fn the_first_moment_over_the_margin_is_where_they_part() {
        let base = line(&[(0, 10), (10, 100), (20, 100), (30, 10)], &[]);
        let new = line(&[(0, 10), (10, 105), (20, 150), (30, 10)], &[]);
        let p = parting(&base, &new, (10, "m".into()));
        let at = p.at.expect("parts");
        assert_eq!((at.new_ns, at.base_bytes, at.new_bytes), (20, 100, 150));
        // A margin above every gap: they never part.
        assert_eq!(parting(&base, &new, (50, "m".into())).at, None);
    }

    #[test]
    fn a_slower_run_is_compared_at_the_same_point_of_its_work() {
        // The same work, the new run twice as slow: at the same clock time it still holds
        // what the base has freed, which is no growth.
        let base = line(&[(0, 0), (10, 50), (20, 0), (30, 0)], &[]);
        let new = line(&[(0, 0), (20, 50), (40, 0), (60, 0)], &[]);
        assert_eq!(parting(&base, &new, (10, "m".into())).at, None);
    }

    #[test]
    fn runs_with_the_same_steps_are_lined_up_step_by_step() {
        // Step 1 is slower in the new run (same memory); step 2 holds more halfway in.
        let base = line(
            &[(0, 0), (10, 50), (20, 0), (25, 50), (30, 0), (35, 0)],
            &[(1, 5, 20), (2, 20, 35)],
        );
        let new = line(
            &[(0, 0), (15, 50), (30, 0), (38, 90), (40, 0), (45, 0)],
            &[(1, 5, 30), (2, 30, 45)],
        );
        let p = parting(&base, &new, (10, "m".into()));
        assert!(p.by_steps);
        let at = p.at.expect("parts");
        assert_eq!(at.step, Some(2));
        assert_eq!((at.base_bytes, at.new_bytes), (50, 90));
        assert_eq!(at.new_ns, 38);
        // By time alone the slower first step would read as growth at 20 ns.
        let (mut b, mut n) = (base.clone(), new.clone());
        b.steps.clear();
        n.steps.clear();
        assert!(parting(&b, &n, (10, "m".into())).at.unwrap().new_ns < 38);
    }

    #[test]
    fn a_rise_a_hair_earlier_is_no_parting() {
        // The same work, the new run's allocation 1% of the run earlier than the base's.
        let base = line(&[(0, 0), (41, 100), (80, 0), (100, 0)], &[]);
        let new = line(&[(0, 0), (40, 100), (80, 0), (100, 0)], &[]);
        assert_eq!(parting(&base, &new, (10, "m".into())).at, None);
        // Earlier by more than the slack, it is where they part.
        let new = line(&[(0, 0), (30, 100), (80, 0), (100, 0)], &[]);
        assert_eq!(
            parting(&base, &new, (10, "m".into())).at.unwrap().new_ns,
            30
        );
    }

    #[test]
    fn a_base_without_history_is_its_one_level() {
        // An out-of-memory dump: what it held, at one instant.
        let base = line(&[(0, 100)], &[]);
        let new = line(&[(0, 0), (10, 100), (20, 200), (30, 50)], &[]);
        let at = parting(&base, &new, (10, "m".into())).at.expect("parts");
        assert_eq!((at.new_ns, at.base_bytes, at.new_bytes), (20, 100, 200));
        // And the new side: a dump holding more than the base ever did.
        let dump = line(&[(0, 300)], &[]);
        let at = parting(&new, &dump, (10, "m".into())).at.expect("parts");
        assert_eq!((at.base_bytes, at.new_bytes), (0, 300));
        assert_eq!(parting(&dump, &dump, (10, "m".into())).at, None);
    }

    #[test]
    fn the_margin_is_the_tightest_peak_rule() {
        let rules: Vec<Rule> = ["peak_used>+5%", "peak_used>+1KB", "time>+5%"]
            .iter()
            .map(|r| r.parse().unwrap())
            .collect();
        assert_eq!(margin(&rules, 1 << 20).0, 1024);
        assert_eq!(margin(&rules[..1], 1000).0, 50);
        assert_eq!(margin(&[], 1000), (10, "1% of the base's peak".to_string()));
    }
}
