//! The comparison of two sides: each key's median per side, its delta, the display order, and
//! the rules checked against every row.

use std::cmp::Ordering;
use std::sync::Arc;

use rustc_hash::FxHashMap;
use serde::{Serialize, Serializer};

use super::rules::{Rule, Threshold};
use crate::tables::{diff_keys, Figure, Figures, Quantity, Section};

/// One key compared: `None` on a side that has no such key (added or removed).
///
/// The fields are in their JSON keys' alphabetical order, the order `diff --format json` has
/// always printed them in (it is written straight from these structs).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    pub base: Option<i64>,
    /// `new - base`, a missing side counting as 0.
    pub delta: i64,
    /// The delta in percent of the base; `None` when the base is missing or 0 and the new
    /// value is not (an infinite change).
    pub delta_pct: Option<f64>,
    /// Held once for every run and row that has it (see [`crate::tables::Keys`]).
    #[serde(serialize_with = "as_str")]
    pub key: Arc<str>,
    pub new: Option<i64>,
    #[serde(skip)]
    pub quantity: Quantity,
    pub section: Section,
    /// The stack behind a key that names only its innermost line (`peak.line`): the largest
    /// it sums in the new run (the base's when the new run lacks the key), outermost frame
    /// first; left out of other rows.
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "frames_of")]
    pub stack: Option<Arc<str>>,
}

fn frames_of<S: Serializer>(stack: &Option<Arc<str>>, s: S) -> Result<S::Ok, S::Error> {
    match stack {
        Some(text) => s.collect_seq(text.split('\n')),
        None => s.serialize_none(),
    }
}

fn as_str<S: Serializer>(key: &Arc<str>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(key)
}

impl Row {
    pub fn changed(&self) -> bool {
        self.base != self.new
    }

    pub(super) fn base_or_zero(&self) -> i64 {
        self.base.unwrap_or(0)
    }
}

/// How much a rule saw a row grow, in the rule's own terms.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Change {
    /// Percent of the base.
    Percent(f64),
    /// Growth from a base of 0 (or no base): infinitely many percent.
    FromZero,
    /// Growth in the metric's unit (bytes, ns, count).
    Amount(i64),
}

/// JSON: a number, or `null` for growth from zero (JSON has no infinity).
impl Serialize for Change {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match *self {
            Change::Percent(p) => s.serialize_f64(p),
            Change::FromZero => s.serialize_none(),
            Change::Amount(a) => s.serialize_i64(a),
        }
    }
}

/// A rule crossed by one row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Violation {
    pub key: String,
    /// The rule as the user wrote it.
    pub rule: String,
    pub value: Change,
}

/// The comparison of two sides, every key of either side, rows ordered for display.
#[derive(Debug, Clone, PartialEq)]
pub struct Diff {
    pub base_runs: usize,
    pub new_runs: usize,
    /// Headline rows first in a fixed order, then each section's rows, largest change first.
    pub rows: Vec<Row>,
    pub violations: Vec<Violation>,
    pub rules_checked: usize,
    /// Rules whose metric matched no key of either side: most likely a typo, which would
    /// otherwise pass silently forever.
    pub unmatched_rules: Vec<String>,
    /// Where the new run first holds more than the base by the margin ([`super::parting`]),
    /// when the caller lined the runs' timelines up.
    pub parting: Option<super::Parting>,
}

/// The median of a side's runs; a run without the key counts as 0. An even count takes the
/// mean of the middle two.
pub(super) fn median(values: &mut [i64]) -> i64 {
    values.sort_unstable();
    let n = values.len();
    if n == 0 {
        return 0;
    }
    if n % 2 == 1 {
        values[n / 2]
    } else {
        let sum = i128::from(values[n / 2 - 1]) + i128::from(values[n / 2]);
        i64::try_from(sum.div_euclid(2)).unwrap_or(i64::MAX)
    }
}

fn side(runs: &[Figures], key: &str) -> Option<i64> {
    let mut any = false;
    let mut v: Vec<i64> = runs
        .iter()
        .map(|r| {
            let f = r.by_key.get(key);
            any |= f.is_some();
            f.map_or(0, |f| f.value)
        })
        .collect();
    any.then(|| median(&mut v))
}

pub(super) fn percent(base: i64, new: i64) -> Option<f64> {
    let delta = new as f64 - base as f64;
    if base == 0 {
        return (new == 0).then_some(0.0);
    }
    Some(delta / (base as f64).abs() * 100.0)
}

/// A headline key's place in the order the summary table declares them.
fn headline_rank(key: &str) -> usize {
    diff_keys()
        .iter()
        .filter(|(_, k)| k.scope.is_empty())
        .position(|(_, k)| k.figure == key)
        .unwrap_or(usize::MAX)
}

/// Display order: sections in order; the headline as listed; elsewhere bytes, then time, then
/// counts, each by the size of the change, largest first, then by key so that equal traces
/// print identically.
fn display_order(a: &Row, b: &Row) -> Ordering {
    a.section.cmp(&b.section).then_with(|| {
        if a.section == Section::HEADLINE {
            return headline_rank(&a.key).cmp(&headline_rank(&b.key));
        }
        a.quantity
            .cmp(&b.quantity)
            .then_with(|| b.delta.unsigned_abs().cmp(&a.delta.unsigned_abs()))
            .then_with(|| a.key.cmp(&b.key))
    })
}

/// Compares the runs of two sides and checks the rules against every row, shown or not.
pub fn compare(base: &[Figures], new: &[Figures], rules: &[Rule]) -> Diff {
    let most = base.iter().chain(new).map(|r| r.by_key.len()).max();
    let mut kinds: FxHashMap<&Arc<str>, Figure> =
        FxHashMap::with_capacity_and_hasher(most.unwrap_or(0), Default::default());
    for run in base.iter().chain(new) {
        for (k, f) in &run.by_key {
            kinds.entry(k).or_insert(*f);
        }
    }
    let mut rows: Vec<Row> = kinds
        .into_iter()
        .map(|(key, f)| {
            let (b, n) = (side(base, key), side(new, key));
            let (b0, n0) = (b.unwrap_or(0), n.unwrap_or(0));
            Row {
                section: f.section,
                key: key.clone(),
                quantity: f.quantity,
                base: b,
                new: n,
                delta: n0.saturating_sub(b0),
                delta_pct: b.and_then(|_| percent(b0, n0)),
                stack: (new.iter().chain(base))
                    .find_map(|r| r.stacks.get(key))
                    .cloned(),
            }
        })
        .collect();
    // Keys are unique, so the order is total: an unstable sort gives the one order.
    rows.sort_unstable_by(display_order);

    let mut violations = Vec::new();
    let mut unmatched_rules = Vec::new();
    for rule in rules {
        let mut matched = false;
        for row in rows.iter().filter(|r| rule.matches(&r.key)) {
            matched = true;
            if let Some(value) = rule.crossed_by(row) {
                violations.push(Violation {
                    rule: rule.text.clone(),
                    key: row.key.to_string(),
                    value,
                });
            }
        }
        if !matched {
            unmatched_rules.push(rule.text.clone());
        }
    }
    Diff {
        base_runs: base.len(),
        new_runs: new.len(),
        rows,
        violations,
        rules_checked: rules.len(),
        unmatched_rules,
        parting: None,
    }
}

/// The sections shown only when asked for by name ([`ShowOptions::sections`]): `lines`, the
/// cumulative bytes of every request by whole stack (what a peak's growth is not), and
/// `categories`, whose bytes at the peak the `peak` section already shows.
pub const ASKED_FOR: [&str; 2] = ["lines", "categories"];

/// What to show of a diff: unchanged rows are hidden unless `all`; `top` caps each section
/// (the headline excepted); `sections` names the sections shown beside the headline (empty:
/// all but [`ASKED_FOR`]). Rules are checked against every row whatever is shown.
#[derive(Debug, Clone, Default)]
pub struct ShowOptions {
    pub all: bool,
    pub top: Option<usize>,
    pub sections: Vec<Section>,
}

impl ShowOptions {
    /// Whether `section` is shown.
    pub fn shows(&self, section: Section) -> bool {
        section == Section::HEADLINE
            || if self.sections.is_empty() {
                !ASKED_FOR.contains(&section.as_str())
            } else {
                self.sections.contains(&section)
            }
    }
}

/// One section's shown rows and how many more it had.
pub struct Shown<'a> {
    pub section: Section,
    pub rows: Vec<&'a Row>,
    pub more: usize,
}

impl Diff {
    /// The rows to show, by section, in display order. The headline is always shown whole:
    /// "peak used did not move" is an answer a reader looks for. A section neither run has a
    /// figure of (whatif without `--whatif`, epochs of a run without any) is left out unless
    /// named.
    pub fn shown(&self, opts: &ShowOptions) -> Vec<Shown<'_>> {
        let mut present = vec![Section::HEADLINE];
        present.extend(opts.sections.iter().copied());
        for r in &self.rows {
            if !present.contains(&r.section) {
                present.push(r.section);
            }
        }
        Section::all()
            .into_iter()
            .filter(|&section| opts.shows(section) && present.contains(&section))
            .map(|section| {
                let rows: Vec<&Row> = self
                    .rows
                    .iter()
                    .filter(|r| r.section == section)
                    .filter(|r| section == Section::HEADLINE || opts.all || r.changed())
                    .collect();
                let cap = match opts.top {
                    Some(n) if section != Section::HEADLINE => n.min(rows.len()),
                    _ => rows.len(),
                };
                let more = rows.len() - cap;
                Shown {
                    section,
                    rows: rows.into_iter().take(cap).collect(),
                    more,
                }
            })
            .collect()
    }

    /// Whether any rule was crossed: the command's exit status 1.
    pub fn failed(&self) -> bool {
        !self.violations.is_empty()
    }

    /// The stable JSON document: `{"rows":[...],"violations":[...]}`, rows as shown.
    pub fn json(&self, opts: &ShowOptions) -> DiffJson<'_> {
        DiffJson {
            partial: Vec::new(),
            parting: self.parting.as_ref(),
            rows: self.shown(opts).into_iter().flat_map(|s| s.rows).collect(),
            violations: &self.violations,
        }
    }
}

/// Serialized as it is, keys in alphabetical order (see [`Row`]).
#[derive(Serialize)]
pub struct DiffJson<'a> {
    /// What was read of a damaged side, as warnings say it; left out when none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub partial: Vec<String>,
    /// Where the runs part ([`super::parting`]); left out when not computed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parting: Option<&'a super::Parting>,
    pub rows: Vec<&'a Row>,
    pub violations: &'a [Violation],
}

impl Rule {
    /// The change that crosses this rule, if the row's does.
    pub fn crossed_by(&self, row: &Row) -> Option<Change> {
        let over = |x: f64, limit: f64| {
            if self.inclusive {
                x >= limit
            } else {
                x > limit
            }
        };
        match self.threshold {
            Threshold::Percent(limit) => {
                let (b, n) = (row.base_or_zero(), row.new.unwrap_or(0));
                match percent(b, n) {
                    Some(p) => over(p, limit).then_some(Change::Percent(p)),
                    None => (n > b).then_some(Change::FromZero),
                }
            }
            Threshold::Amount(limit) => {
                over(row.delta as f64, limit).then_some(Change::Amount(row.delta))
            }
        }
    }
}
