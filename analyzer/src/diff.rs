//! `diff`: compare a base run with a new one, figure by figure, and check CI rules.
//!
//! Every report is flattened into [`Figures`]: one number per stable key, the key being what a
//! user writes in a rule, so that a row of the output can be copied into `--fail-on` as is:
//!
//! | key | section | quantity |
//! |---|---|---|
//! | `peak_used`, `peak_acquired` | headline | bytes |
//! | `allocations`, `device_allocations`, `out_of_memory` | headline | count |
//! | `time` (wall time of the trace) | headline | ns |
//! | `function:NAME.used`, `.acquired`, `.self_used`, `.self_acquired` | functions | bytes |
//! | `function:NAME.occurrence` | functions | count |
//! | `function:NAME.time`, `link:NAME.time` | timers | ns |
//! | `link:NAME.occurrence` | timers | count |
//! | `line:STACK.used`, `.acquired` (STACK: `file:line:function` frames joined by `;`) | lines | bytes |
//! | `epoch:N.gpu_used`, `.gpu_peak`, `.cpu_used`, `.cpu_peak` | epochs | bytes |
//!
//! Keys never hold an address or a trace-local id, so two runs of the same program give the
//! same keys. A side may hold several runs (the same job recorded again): each figure is the
//! median over them, which is what makes time rules usable on noisy CI machines (one slow run
//! out of three moves nothing). A key a run lacks counts as 0 in that run's place.
//!
//! Rules: `METRIC > VALUE` or `METRIC >= VALUE`, where METRIC is a key above (`*` matches any
//! run of characters, so `function:*.used` is every function) and VALUE a growth: a percentage
//! (`+5%`), a size (`+64MB`, 1024 steps as every table of poolsight), a duration (`100ms`) or a
//! plain number (bytes, ns or a count, as the metric is). A percentage of a base of 0 is
//! infinite: any growth from nothing crosses a percentage rule, since a CI gate that let a
//! brand-new allocation through would be no gate.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::str::FromStr;

use serde::{Deserialize, Serialize, Serializer};

use crate::lines::LineNode;
use crate::render::{humanized, time_auto};
use crate::report::Report;

/// The report a row comes from; rendered in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Section {
    /// Peak used and acquired bytes, allocations, wall time.
    Headline,
    Functions,
    Lines,
    Timers,
    Epochs,
}

impl Section {
    pub const ALL: [Section; 5] = [
        Section::Headline,
        Section::Functions,
        Section::Lines,
        Section::Timers,
        Section::Epochs,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Section::Headline => "headline",
            Section::Functions => "functions",
            Section::Lines => "lines",
            Section::Timers => "timers",
            Section::Epochs => "epochs",
        }
    }
}

impl fmt::Display for Section {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a figure counts; decides how it prints and which rule values fit it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Quantity {
    Bytes,
    Nanoseconds,
    Count,
}

impl Quantity {
    fn name(self) -> &'static str {
        match self {
            Quantity::Bytes => "a size in bytes",
            Quantity::Nanoseconds => "a duration",
            Quantity::Count => "a count",
        }
    }
}

/// One figure of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Figure {
    pub section: Section,
    pub quantity: Quantity,
    pub value: i64,
}

/// Every figure of one run, by key (see the module documentation for the keys).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Figures {
    pub by_key: HashMap<String, Figure>,
}

/// Headline keys in the order they print; the second name is each one's rule alias.
const HEADLINE: [(&str, Option<&str>, Quantity); 6] = [
    ("peak_used", None, Quantity::Bytes),
    ("peak_acquired", Some("acquired"), Quantity::Bytes),
    ("allocations", None, Quantity::Count),
    ("device_allocations", None, Quantity::Count),
    ("out_of_memory", None, Quantity::Count),
    ("time", Some("wall_time"), Quantity::Nanoseconds),
];

/// A scope's figures: name, section, quantity.
type ScopeFigures = &'static [(&'static str, Section, Quantity)];

/// Scoped keys: `scope:NAME.figure`, with each figure's section and quantity.
const SCOPES: [(&str, ScopeFigures); 4] = [
    (
        "function",
        &[
            ("used", Section::Functions, Quantity::Bytes),
            ("acquired", Section::Functions, Quantity::Bytes),
            ("self_used", Section::Functions, Quantity::Bytes),
            ("self_acquired", Section::Functions, Quantity::Bytes),
            ("occurrence", Section::Functions, Quantity::Count),
            ("time", Section::Timers, Quantity::Nanoseconds),
        ],
    ),
    (
        "link",
        &[
            ("time", Section::Timers, Quantity::Nanoseconds),
            ("occurrence", Section::Timers, Quantity::Count),
        ],
    ),
    (
        "line",
        &[
            ("used", Section::Lines, Quantity::Bytes),
            ("acquired", Section::Lines, Quantity::Bytes),
        ],
    ),
    (
        "epoch",
        &[
            ("gpu_used", Section::Epochs, Quantity::Bytes),
            ("gpu_peak", Section::Epochs, Quantity::Bytes),
            ("cpu_used", Section::Epochs, Quantity::Bytes),
            ("cpu_peak", Section::Epochs, Quantity::Bytes),
        ],
    ),
];

/// Byte counts beyond `i64::MAX` (8 EiB) do not occur; saturate rather than wrap if one did.
fn signed(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Figures {
    /// Flattens one run's report into keyed figures.
    pub fn of(r: &Report) -> Figures {
        let mut f = Figures::default();
        let s = &r.summary;
        let headline = [
            s.peak_used_bytes,
            s.peak_acquired_bytes,
            s.total_allocations,
            s.device_allocations,
            s.out_of_memory,
            s.duration_ns,
        ];
        for ((key, _, q), v) in HEADLINE.iter().zip(headline) {
            f.put(key.to_string(), Section::Headline, *q, signed(v));
        }
        for row in &r.functions.functions {
            let scoped = [
                ("used", row.used_bytes),
                ("acquired", row.acquired_bytes),
                ("self_used", row.self_used_bytes),
                ("self_acquired", row.self_acquired_bytes),
                ("occurrence", row.occurrence),
            ];
            for (figure, v) in scoped {
                f.scoped("function", &row.name, figure, signed(v));
            }
        }
        for row in &r.timers.functions {
            f.scoped("function", &row.name, "time", signed(row.elapsed_ns));
        }
        for row in &r.timers.links {
            f.scoped("link", &row.name, "time", signed(row.elapsed_ns));
            f.scoped("link", &row.name, "occurrence", signed(row.occurrence));
        }
        let mut stack = String::new();
        for node in &r.lines.root.children {
            f.line(node, &mut stack);
        }
        for e in &r.epochs.epochs {
            let n = e.epoch.to_string();
            f.scoped("epoch", &n, "gpu_used", e.gpu_used_bytes);
            f.scoped("epoch", &n, "gpu_peak", e.gpu_peak_bytes);
            f.scoped("epoch", &n, "cpu_used", e.cpu_used_bytes);
            f.scoped("epoch", &n, "cpu_peak", e.cpu_peak_bytes);
        }
        f
    }

    fn put(&mut self, key: String, section: Section, quantity: Quantity, value: i64) {
        self.by_key.entry(key).or_insert(Figure {
            section,
            quantity,
            value,
        });
    }

    fn scoped(&mut self, scope: &str, name: &str, figure: &str, value: i64) {
        if let Some((section, quantity)) = figure_of(scope, figure) {
            self.put(format!("{scope}:{name}.{figure}"), section, quantity, value);
        }
    }

    /// A line node's key is its whole path from `_root`: the same frame under two callers is
    /// two rows, as in the tree the `lines` report prints.
    fn line(&mut self, node: &LineNode, stack: &mut String) {
        let len = stack.len();
        if !stack.is_empty() {
            stack.push(';');
        }
        let _ = write!(stack, "{}:{}:{}", node.file, node.line, node.function);
        self.scoped("line", stack, "used", signed(node.used_bytes));
        self.scoped("line", stack, "acquired", signed(node.acquired_bytes));
        for c in &node.children {
            self.line(c, stack);
        }
        stack.truncate(len);
    }
}

fn figure_of(scope: &str, figure: &str) -> Option<(Section, Quantity)> {
    SCOPES
        .iter()
        .find(|(s, _)| *s == scope)?
        .1
        .iter()
        .find(|(f, _, _)| *f == figure)
        .map(|&(_, s, q)| (s, q))
}

/// One key compared: `None` on a side that has no such key (added or removed).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    pub section: Section,
    pub key: String,
    #[serde(skip)]
    pub quantity: Quantity,
    pub base: Option<i64>,
    pub new: Option<i64>,
    /// `new - base`, a missing side counting as 0.
    pub delta: i64,
    /// The delta in percent of the base; `None` when the base is missing or 0 and the new
    /// value is not (an infinite change).
    pub delta_pct: Option<f64>,
}

impl Row {
    pub fn changed(&self) -> bool {
        self.base != self.new
    }

    fn base_or_zero(&self) -> i64 {
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
    /// The rule as the user wrote it.
    pub rule: String,
    pub key: String,
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
}

/// The median of a side's runs; a run without the key counts as 0. An even count takes the
/// mean of the middle two.
fn median(values: &mut [i64]) -> i64 {
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
    if !runs.iter().any(|r| r.by_key.contains_key(key)) {
        return None;
    }
    let mut v: Vec<i64> = runs
        .iter()
        .map(|r| r.by_key.get(key).map_or(0, |f| f.value))
        .collect();
    Some(median(&mut v))
}

fn percent(base: i64, new: i64) -> Option<f64> {
    let delta = new as f64 - base as f64;
    if base == 0 {
        return (new == 0).then_some(0.0);
    }
    Some(delta / (base as f64).abs() * 100.0)
}

fn headline_rank(key: &str) -> usize {
    HEADLINE
        .iter()
        .position(|(k, _, _)| *k == key)
        .unwrap_or(HEADLINE.len())
}

/// Display order: sections in order; the headline as listed; elsewhere bytes, then time, then
/// counts, each by the size of the change, largest first, then by key so that equal traces
/// print identically.
fn display_order(a: &Row, b: &Row) -> Ordering {
    a.section.cmp(&b.section).then_with(|| {
        if a.section == Section::Headline {
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
    let mut kinds: HashMap<&str, Figure> = HashMap::new();
    for run in base.iter().chain(new) {
        for (k, f) in &run.by_key {
            kinds.entry(k.as_str()).or_insert(*f);
        }
    }
    let mut rows: Vec<Row> = kinds
        .into_iter()
        .map(|(key, f)| {
            let (b, n) = (side(base, key), side(new, key));
            let (b0, n0) = (b.unwrap_or(0), n.unwrap_or(0));
            Row {
                section: f.section,
                key: key.to_string(),
                quantity: f.quantity,
                base: b,
                new: n,
                delta: n0.saturating_sub(b0),
                delta_pct: b.and_then(|_| percent(b0, n0)),
            }
        })
        .collect();
    rows.sort_by(display_order);

    let mut violations = Vec::new();
    let mut unmatched_rules = Vec::new();
    for rule in rules {
        let mut matched = false;
        for row in rows.iter().filter(|r| rule.matches(&r.key)) {
            matched = true;
            if let Some(value) = rule.crossed_by(row) {
                violations.push(Violation {
                    rule: rule.text.clone(),
                    key: row.key.clone(),
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
    }
}

/// A rule's threshold.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Threshold {
    /// Growth in percent of the base.
    Percent(f64),
    /// Growth in the metric's unit (bytes, ns, count).
    Amount(f64),
}

/// `METRIC > VALUE`: fails when the metric grew by more than VALUE (`>=`: by VALUE or more).
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// As written, trimmed: violations quote it.
    pub text: String,
    /// The key pattern, aliases resolved (`acquired` -> `peak_acquired`); `*` is a wildcard.
    pub metric: String,
    pub quantity: Quantity,
    pub inclusive: bool,
    pub threshold: Threshold,
}

/// What is wrong with a rule.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RuleProblem {
    #[error(
        "expected METRIC>VALUE, e.g. peak_used>+5%, acquired>+64MB, function:LinearFunction.used>+10%, time>+20%"
    )]
    NoOperator,
    #[error("only `>` and `>=` are supported: a rule fails the build when a figure grows")]
    Operator,
    #[error("the metric is empty")]
    EmptyMetric,
    #[error("the value is empty")]
    EmptyValue,
    #[error(
        "unknown metric `{0}`: expected peak_used, peak_acquired (or acquired), allocations, device_allocations, out_of_memory, time, or function:NAME.FIGURE, link:NAME.FIGURE, line:STACK.FIGURE, epoch:N.FIGURE"
    )]
    UnknownMetric(String),
    #[error("`{metric}` has no figure: write {scope}:NAME.FIGURE, FIGURE one of {expected}")]
    NoFigure {
        metric: String,
        scope: &'static str,
        expected: String,
    },
    #[error("unknown figure `{figure}` for {scope}: expected one of {expected}")]
    UnknownFigure {
        scope: &'static str,
        figure: String,
        expected: String,
    },
    #[error("`{0}` names no {1}: the name before the figure is empty")]
    EmptyName(String, &'static str),
    #[error("epoch `{0}` is not an epoch number (or `*`)")]
    BadEpoch(String),
    #[error(
        "`{0}` is not a value: expected a percentage (+5%), a size (+64MB), a duration (+100ms, 2s) or a plain number"
    )]
    BadValue(String),
    #[error("`{metric}` is {}, but `{value}` is {}", .quantity.name(), .given.name())]
    UnitMismatch {
        metric: String,
        quantity: Quantity,
        value: String,
        given: Quantity,
    },
}

/// A rule that could not be parsed, with the rule's text.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("bad rule `{rule}`: {problem}")]
pub struct RuleError {
    pub rule: String,
    pub problem: RuleProblem,
}

/// A rules file that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum RulesFileError {
    #[error("not a rules file: {0}")]
    Toml(#[from] toml::de::Error),
    #[error("rule {index} of `fail_on`: {source}")]
    Rule {
        index: usize,
        #[source]
        source: RuleError,
    },
}

/// The TOML a team keeps in its repository: `fail_on = ["peak_used > +5%", ...]`, the same
/// grammar as `--fail-on`. Unknown keys are refused, so that a misspelt `fail-on` does not
/// quietly check nothing.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RulesFile {
    #[serde(default)]
    fail_on: Vec<String>,
}

/// Parses a rules file's text.
pub fn parse_rules_file(text: &str) -> Result<Vec<Rule>, RulesFileError> {
    let file: RulesFile = toml::from_str(text)?;
    file.fail_on
        .iter()
        .enumerate()
        .map(|(i, r)| {
            r.parse().map_err(|source| RulesFileError::Rule {
                index: i + 1,
                source,
            })
        })
        .collect()
}

impl FromStr for Rule {
    type Err = RuleError;

    fn from_str(s: &str) -> Result<Rule, RuleError> {
        let text = s.trim();
        parse_rule(text).map_err(|problem| RuleError {
            rule: text.to_string(),
            problem,
        })
    }
}

fn parse_rule(text: &str) -> Result<Rule, RuleProblem> {
    // The last `>`: names may hold one (`<lambda>`, `Vec<u8>`), values never do.
    let Some(at) = text.rfind('>') else {
        return Err(if text.contains(['<', '=']) {
            RuleProblem::Operator
        } else {
            RuleProblem::NoOperator
        });
    };
    let (metric, value) = (text[..at].trim(), &text[at + 1..]);
    let (inclusive, value) = match value.strip_prefix('=') {
        Some(v) => (true, v.trim()),
        None => (false, value.trim()),
    };
    if metric.is_empty() {
        return Err(RuleProblem::EmptyMetric);
    }
    if value.is_empty() {
        return Err(RuleProblem::EmptyValue);
    }
    if metric.ends_with(['>', '<', '=', '!']) {
        return Err(RuleProblem::Operator);
    }
    let (metric, quantity) = parse_metric(metric)?;
    let (threshold, given) = parse_value(value)?;
    if let Some(given) = given {
        if given != quantity {
            return Err(RuleProblem::UnitMismatch {
                metric,
                quantity,
                value: value.to_string(),
                given,
            });
        }
    }
    Ok(Rule {
        text: text.to_string(),
        metric,
        quantity,
        inclusive,
        threshold,
    })
}

fn parse_metric(m: &str) -> Result<(String, Quantity), RuleProblem> {
    if let Some((key, _, q)) = HEADLINE
        .iter()
        .find(|(k, alias, _)| *k == m || *alias == Some(m))
    {
        return Ok((key.to_string(), *q));
    }
    let unknown = || RuleProblem::UnknownMetric(m.to_string());
    let (scope, rest) = m.split_once(':').ok_or_else(unknown)?;
    let (scope, figures) = SCOPES
        .iter()
        .find(|(s, _)| *s == scope)
        .ok_or_else(unknown)?;
    let expected = || {
        figures
            .iter()
            .map(|(f, _, _)| *f)
            .collect::<Vec<_>>()
            .join(", ")
    };
    // Figures hold no `.`, names may (`SGD.update`, file names): split at the last one.
    let (name, figure) = rest.rsplit_once('.').ok_or_else(|| RuleProblem::NoFigure {
        metric: m.to_string(),
        scope,
        expected: expected(),
    })?;
    let Some(&(_, _, quantity)) = figures.iter().find(|(f, _, _)| *f == figure) else {
        return Err(RuleProblem::UnknownFigure {
            scope,
            figure: figure.to_string(),
            expected: expected(),
        });
    };
    if name.is_empty() {
        return Err(RuleProblem::EmptyName(m.to_string(), scope));
    }
    if *scope == "epoch" && name != "*" && name.parse::<u32>().is_err() {
        return Err(RuleProblem::BadEpoch(name.to_string()));
    }
    Ok((format!("{scope}:{name}.{figure}"), quantity))
}

/// Units a value may carry, with their multipliers; byte units are case-insensitive, time
/// units are not (`MS` is no unit anyone writes, `ms` is).
const BYTE_SUFFIXES: [(&str, f64); 11] = [
    ("b", 1.0),
    ("kb", 1024.0),
    ("mb", 1048576.0),
    ("gb", 1073741824.0),
    ("tb", 1099511627776.0),
    ("pb", 1125899906842624.0),
    ("kib", 1024.0),
    ("mib", 1048576.0),
    ("gib", 1073741824.0),
    ("tib", 1099511627776.0),
    ("pib", 1125899906842624.0),
];

const TIME_SUFFIXES: [(&str, f64); 8] = [
    ("ns", 1.0),
    ("us", 1e3),
    ("µs", 1e3),
    ("ms", 1e6),
    ("s", 1e9),
    ("sec", 1e9),
    ("min", 60e9),
    ("h", 3600e9),
];

/// A value: its threshold and, when it has a unit, the quantity that unit measures.
fn parse_value(v: &str) -> Result<(Threshold, Option<Quantity>), RuleProblem> {
    let bad = || RuleProblem::BadValue(v.to_string());
    let (sign, body) = match v.as_bytes().first() {
        Some(b'+') => (1.0, &v[1..]),
        Some(b'-') => (-1.0, &v[1..]),
        _ => (1.0, v),
    };
    let split = body
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(body.len());
    let (number, suffix) = (&body[..split], body[split..].trim());
    if number.is_empty() || number.starts_with('.') || number.ends_with('.') {
        return Err(bad());
    }
    let x: f64 = number.parse().map_err(|_| bad())?;
    let x = sign * x;
    if suffix.is_empty() {
        return Ok((Threshold::Amount(x), None));
    }
    if suffix == "%" {
        return Ok((Threshold::Percent(x), None));
    }
    if let Some((_, m)) = TIME_SUFFIXES.iter().find(|(s, _)| *s == suffix) {
        return Ok((Threshold::Amount(x * m), Some(Quantity::Nanoseconds)));
    }
    let lower = suffix.to_ascii_lowercase();
    if let Some((_, m)) = BYTE_SUFFIXES.iter().find(|(s, _)| *s == lower) {
        return Ok((Threshold::Amount(x * m), Some(Quantity::Bytes)));
    }
    Err(bad())
}

/// `*` matches any run of characters (including none); everything else matches itself.
fn glob(pattern: &str, text: &str) -> bool {
    let (p, t) = (pattern.as_bytes(), text.as_bytes());
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, ti));
            pi += 1;
        } else if pi < p.len() && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

impl Rule {
    /// Whether the rule applies to the row with this key.
    pub fn matches(&self, key: &str) -> bool {
        if self.metric.contains('*') {
            glob(&self.metric, key)
        } else {
            self.metric == key
        }
    }

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

/// What to show of a diff: unchanged rows are hidden unless `all`; `top` caps each section
/// (the headline excepted). Rules are checked against every row whatever is shown.
#[derive(Debug, Clone, Copy, Default)]
pub struct ShowOptions {
    pub all: bool,
    pub top: Option<usize>,
}

/// One section's shown rows and how many more it had.
pub struct Shown<'a> {
    pub section: Section,
    pub rows: Vec<&'a Row>,
    pub more: usize,
}

impl Diff {
    /// The rows to show, by section, in display order. The headline is always shown whole:
    /// "peak used did not move" is an answer a reader looks for.
    pub fn shown(&self, opts: &ShowOptions) -> Vec<Shown<'_>> {
        Section::ALL
            .iter()
            .map(|&section| {
                let rows: Vec<&Row> = self
                    .rows
                    .iter()
                    .filter(|r| r.section == section)
                    .filter(|r| section == Section::Headline || opts.all || r.changed())
                    .collect();
                let cap = match (section, opts.top) {
                    (Section::Headline, _) | (_, None) => rows.len(),
                    (_, Some(n)) => n.min(rows.len()),
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

    /// The JSON document of SPEC 5.2: `{"rows":[...],"violations":[...]}`, rows as shown.
    pub fn json(&self, opts: &ShowOptions) -> DiffJson<'_> {
        DiffJson {
            rows: self.shown(opts).into_iter().flat_map(|s| s.rows).collect(),
            violations: &self.violations,
        }
    }
}

#[derive(Serialize)]
pub struct DiffJson<'a> {
    pub rows: Vec<&'a Row>,
    pub violations: &'a [Violation],
}

fn signed_text(v: i64, abs: impl Fn(u64) -> String) -> String {
    match v.cmp(&0) {
        Ordering::Less => format!("-{}", abs(v.unsigned_abs())),
        Ordering::Equal => abs(0),
        Ordering::Greater => format!("+{}", abs(v.unsigned_abs())),
    }
}

fn amount(q: Quantity, v: u64) -> String {
    match q {
        Quantity::Bytes => humanized(v),
        Quantity::Nanoseconds => time_auto(v),
        Quantity::Count => v.to_string(),
    }
}

fn value_text(q: Quantity, v: Option<i64>) -> String {
    match v {
        None => "-".into(),
        Some(v) if v < 0 => format!("-{}", amount(q, v.unsigned_abs())),
        Some(v) => amount(q, v.unsigned_abs()),
    }
}

fn delta_text(r: &Row) -> String {
    signed_text(r.delta, |v| amount(r.quantity, v))
}

fn change_text(r: &Row) -> String {
    match (r.base, r.new, r.delta_pct) {
        (None, _, _) => "added".into(),
        (_, None, _) => "removed".into(),
        (_, _, Some(p)) => format!("{p:+.2}%"),
        (_, _, None) => "from 0".into(),
    }
}

fn violation_text(d: &Diff, v: &Violation) -> String {
    let quantity = d
        .rows
        .iter()
        .find(|r| r.key == v.key)
        .map_or(Quantity::Count, |r| r.quantity);
    match v.value {
        Change::Percent(p) => format!("{p:+.2}%"),
        Change::FromZero => "grew from 0".into(),
        Change::Amount(a) => signed_text(a, |x| amount(quantity, x)),
    }
}

fn runs(n: usize) -> String {
    if n == 1 {
        "1 run".into()
    } else {
        format!("{n} runs (medians)")
    }
}

/// Left-aligned first column (keys), right-aligned numbers, two spaces apart.
fn columns(rows: &[[String; 5]]) -> String {
    let mut widths = [0usize; 5];
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    for r in rows {
        let mut line = format!("{:<w$}", r[0], w = widths[0]);
        for (c, w) in r.iter().zip(widths).skip(1) {
            let _ = write!(line, "  {c:>w$}");
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn cells(r: &Row) -> [String; 5] {
    [
        r.key.clone(),
        value_text(r.quantity, r.base),
        value_text(r.quantity, r.new),
        delta_text(r),
        change_text(r),
    ]
}

/// Plain text for a terminal or a CI log: sections, then the verdict last, where a log
/// reader's eye lands.
pub fn render_table(d: &Diff, opts: &ShowOptions) -> String {
    let mut out = format!(
        "poolsight diff: base {}, new {}\n",
        runs(d.base_runs),
        runs(d.new_runs)
    );
    for s in d.shown(opts) {
        out.push('\n');
        if s.rows.is_empty() {
            let _ = writeln!(out, "{}: no change", s.section);
            continue;
        }
        let mut rows = vec![[
            s.section.to_string(),
            "base".into(),
            "new".into(),
            "delta".into(),
            "change".into(),
        ]];
        rows.extend(s.rows.iter().map(|r| cells(r)));
        out.push_str(&columns(&rows));
        if s.more > 0 {
            let _ = writeln!(out, "... {} more changed rows (--top)", s.more);
        }
    }
    out.push('\n');
    for r in &d.unmatched_rules {
        let _ = writeln!(out, "warning: rule `{r}` matched no figure of either run");
    }
    if d.failed() {
        let _ = writeln!(
            out,
            "FAIL: {} violation(s) of {} rule(s):",
            d.violations.len(),
            d.rules_checked
        );
        for v in &d.violations {
            let _ = writeln!(out, "  {}  {}  {}", v.rule, v.key, violation_text(d, v));
        }
    } else {
        let _ = writeln!(out, "OK: no rule crossed ({} checked)", d.rules_checked);
    }
    out
}

/// Inline code for a markdown table cell: `|` would end the cell and a backtick the span.
fn code(s: &str) -> String {
    let s = s.replace('|', "\\|").replace(['\n', '\r'], " ");
    if s.contains('`') {
        format!("`` {s} ``")
    } else {
        format!("`{s}`")
    }
}

fn md_table(out: &mut String, head: &str, rows: &[&Row]) {
    let _ = writeln!(out, "| {head} | base | new | delta | change |");
    out.push_str("|:--|--:|--:|--:|--:|\n");
    for r in rows {
        let c = cells(r);
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} |",
            code(&c[0]),
            c[1],
            c[2],
            c[3],
            c[4]
        );
    }
}

/// Markdown to post as a pull-request comment: the verdict and violations first, the
/// headline table, then each changed section folded in a `<details>` block.
pub fn render_markdown(d: &Diff, opts: &ShowOptions) -> String {
    let mut out = String::from("### poolsight diff\n\n");
    if d.failed() {
        let _ = writeln!(
            out,
            "❌ **{} violation(s)** of {} rule(s) (base: {}, new: {})\n",
            d.violations.len(),
            d.rules_checked,
            runs(d.base_runs),
            runs(d.new_runs)
        );
        out.push_str("| rule | key | change |\n|:--|:--|--:|\n");
        for v in &d.violations {
            let _ = writeln!(
                out,
                "| {} | {} | {} |",
                code(&v.rule),
                code(&v.key),
                violation_text(d, v)
            );
        }
        out.push('\n');
    } else {
        let _ = writeln!(
            out,
            "✅ **No rule crossed** ({} checked; base: {}, new: {})\n",
            d.rules_checked,
            runs(d.base_runs),
            runs(d.new_runs)
        );
    }
    for r in &d.unmatched_rules {
        let _ = writeln!(out, "⚠️ rule {} matched no figure of either run\n", code(r));
    }
    for s in d.shown(opts) {
        if s.section == Section::Headline {
            md_table(&mut out, "headline", &s.rows);
            out.push('\n');
            continue;
        }
        if s.rows.is_empty() {
            continue;
        }
        let _ = writeln!(
            out,
            "<details><summary>{}: {} row(s)</summary>\n",
            s.section,
            s.rows.len() + s.more
        );
        md_table(&mut out, s.section.as_str(), &s.rows);
        if s.more > 0 {
            let _ = writeln!(out, "\n… and {} more", s.more);
        }
        out.push_str("\n</details>\n\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(s: &str) -> Rule {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn problem(s: &str) -> RuleProblem {
        match s.parse::<Rule>() {
            Ok(r) => panic!("{s} parsed as {r:?}"),
            Err(e) => e.problem,
        }
    }

    fn run(figs: &[(&str, i64)]) -> Figures {
        let mut f = Figures::default();
        for &(k, v) in figs {
            let (section, quantity) =
                if let Some((_, _, q)) = HEADLINE.iter().find(|(h, _, _)| *h == k) {
                    (Section::Headline, *q)
                } else {
                    let (scope, rest) = k.split_once(':').expect("scoped");
                    let (_, fig) = rest.rsplit_once('.').expect("figure");
                    figure_of(scope, fig).expect("known figure")
                };
            f.put(k.into(), section, quantity, v);
        }
        f
    }

    #[test]
    fn rules_parse_in_every_documented_form() {
        let r = rule("peak_used>+5%");
        assert_eq!(r.metric, "peak_used");
        assert_eq!(r.threshold, Threshold::Percent(5.0));
        assert!(!r.inclusive);
        let r = rule(" acquired >= 64MB ");
        assert_eq!(r.text, "acquired >= 64MB");
        assert_eq!(r.metric, "peak_acquired");
        assert_eq!(r.threshold, Threshold::Amount(64.0 * 1048576.0));
        assert!(r.inclusive);
        let r = rule("function:LinearFunction.used>+10%");
        assert_eq!(r.metric, "function:LinearFunction.used");
        assert_eq!(r.quantity, Quantity::Bytes);
        assert_eq!(rule("time>+20%").quantity, Quantity::Nanoseconds);
        assert_eq!(rule("time>100ms").threshold, Threshold::Amount(1e8));
        assert_eq!(rule("time>2s").threshold, Threshold::Amount(2e9));
        assert_eq!(rule("wall_time>1.5s").threshold, Threshold::Amount(1.5e9));
        assert_eq!(rule("allocations>100").threshold, Threshold::Amount(100.0));
        assert_eq!(
            rule("peak_used>1gib").threshold,
            Threshold::Amount(1073741824.0)
        );
        assert_eq!(rule("link:Linear.time>+1ms").metric, "link:Linear.time");
        assert_eq!(rule("epoch:2.gpu_peak>+1MB").metric, "epoch:2.gpu_peak");
        assert_eq!(rule("epoch:*.gpu_used>0").metric, "epoch:*.gpu_used");
        // Names keep their dots, colons and angle brackets.
        assert_eq!(
            rule("function:SGD.update.used>0").metric,
            "function:SGD.update.used"
        );
        assert_eq!(
            rule("line:a.py:3:<module>;b.py:9:f.used>+1KB").metric,
            "line:a.py:3:<module>;b.py:9:f.used"
        );
        assert_eq!(
            rule("function:<lambda>.used>5%").metric,
            "function:<lambda>.used"
        );
    }

    #[test]
    fn malformed_rules_say_what_is_wrong() {
        assert_eq!(problem("peak_used+5%"), RuleProblem::NoOperator);
        assert_eq!(problem("peak_used<5%"), RuleProblem::Operator);
        assert_eq!(problem("peak_used>>5%"), RuleProblem::Operator);
        assert_eq!(problem(">5%"), RuleProblem::EmptyMetric);
        assert_eq!(problem("peak_used>"), RuleProblem::EmptyValue);
        assert_eq!(
            problem("peak_usd>5%"),
            RuleProblem::UnknownMetric("peak_usd".into())
        );
        assert!(matches!(
            problem("function:Linear>5%"),
            RuleProblem::NoFigure { .. }
        ));
        assert!(matches!(
            problem("function:Linear.bytes>5%"),
            RuleProblem::UnknownFigure { .. }
        ));
        assert!(matches!(
            problem("link:.time>5%"),
            RuleProblem::EmptyName(..)
        ));
        assert_eq!(
            problem("epoch:x.gpu_used>0"),
            RuleProblem::BadEpoch("x".into())
        );
        for v in [
            "5 apples", "%", "+", ".5%", "5.%", "1e9", "inf", "5%%", "64 XB",
        ] {
            assert_eq!(
                problem(&format!("peak_used>{v}")),
                RuleProblem::BadValue(v.into()),
                "{v}"
            );
        }
        assert!(matches!(
            problem("peak_used>100ms"),
            RuleProblem::UnitMismatch { .. }
        ));
        assert!(matches!(
            problem("time>64MB"),
            RuleProblem::UnitMismatch { .. }
        ));
        let e = "peak_usd>5%".parse::<Rule>().expect_err("unknown metric");
        assert!(e
            .to_string()
            .starts_with("bad rule `peak_usd>5%`: unknown metric"));
    }

    #[test]
    fn wildcards_match_any_run_of_characters() {
        assert!(glob("function:*.used", "function:LinearFunction.used"));
        assert!(!glob(
            "function:*.used",
            "function:LinearFunction.self_used"
        ));
        assert!(glob("*", ""));
        assert!(glob("a*b*c", "aXbYbZc"));
        assert!(!glob("a*b*c", "aXbYbZ"));
        assert!(glob(
            "line:*:LinearFunction.used",
            "line:x.rs:1:MLP;y.rs:2:LinearFunction.used"
        ));
        assert!(rule("function:*.used>5%").matches("function:ReLU.used"));
        assert!(!rule("function:ReLU.used>5%").matches("function:ReLU2.used"));
    }

    #[test]
    fn identical_runs_cross_no_rule_and_show_only_the_headline() {
        let a = run(&[("peak_used", 1000), ("function:F.used", 500), ("time", 10)]);
        let rules = [
            rule("peak_used>+0%"),
            rule("function:*.used>0"),
            rule("time>+0%"),
        ];
        let d = compare(std::slice::from_ref(&a), std::slice::from_ref(&a), &rules);
        assert!(!d.failed(), "{:?}", d.violations);
        assert!(d.unmatched_rules.is_empty());
        let shown = d.json(&ShowOptions::default());
        assert!(shown.rows.iter().all(|r| r.section == Section::Headline));
        assert_eq!(shown.rows.len(), 2);
        let all = d.json(&ShowOptions {
            all: true,
            top: None,
        });
        assert_eq!(all.rows.len(), 3);
        assert_eq!(all.rows[2].delta_pct, Some(0.0));
    }

    #[test]
    fn growth_past_a_rule_is_a_violation_with_its_value() {
        let base = run(&[("peak_used", 1000), ("peak_acquired", 2048)]);
        let new = run(&[("peak_used", 1100), ("peak_acquired", 2048 + 65 * 1048576)]);
        let rules = [
            rule("peak_used>+5%"),
            rule("peak_used>+10%"),
            rule("peak_used>=+10%"),
            rule("acquired>+64MB"),
        ];
        let d = compare(&[base], &[new], &rules);
        let got: Vec<(&str, Change)> = d
            .violations
            .iter()
            .map(|v| (v.rule.as_str(), v.value))
            .collect();
        assert_eq!(
            got,
            [
                ("peak_used>+5%", Change::Percent(10.0)),
                ("peak_used>=+10%", Change::Percent(10.0)),
                ("acquired>+64MB", Change::Amount(65 * 1048576)),
            ]
        );
    }

    #[test]
    fn added_and_removed_keys_and_growth_from_zero() {
        let base = run(&[("function:Old.used", 4096), ("function:Zero.used", 0)]);
        let new = run(&[("function:New.used", 4096), ("function:Zero.used", 1)]);
        let d = compare(&[base], &[new], &[rule("function:*.used>+1000%")]);
        let row = |k: &str| d.rows.iter().find(|r| r.key == k).expect(k);
        let added = row("function:New.used");
        assert_eq!(
            (added.base, added.new, added.delta),
            (None, Some(4096), 4096)
        );
        assert_eq!(
            (change_text(added), added.delta_pct),
            ("added".into(), None)
        );
        let removed = row("function:Old.used");
        assert_eq!(
            (removed.base, removed.new, removed.delta),
            (Some(4096), None, -4096)
        );
        assert_eq!(change_text(removed), "removed");
        assert_eq!(change_text(row("function:Zero.used")), "from 0");
        // Percent rules: growth from nothing is infinite; a removal is no growth.
        let keys: Vec<(&str, Change)> = d
            .violations
            .iter()
            .map(|v| (v.key.as_str(), v.value))
            .collect();
        assert_eq!(
            keys,
            [
                ("function:New.used", Change::FromZero),
                ("function:Zero.used", Change::FromZero)
            ]
        );
        let json = serde_json::to_value(d.json(&ShowOptions::default())).expect("json");
        assert_eq!(json["violations"][0]["value"], serde_json::Value::Null);
    }

    #[test]
    fn sides_take_medians_so_one_slow_run_moves_nothing() {
        let t = |ns| run(&[("time", ns)]);
        let base = [t(100), t(101), t(99)];
        let new = [t(100), t(400), t(102)];
        let d = compare(&base, &new, &[rule("time>+20%")]);
        assert!(!d.failed());
        assert_eq!((d.rows[0].base, d.rows[0].new), (Some(100), Some(102)));
        assert_eq!(median(&mut [4, 1, 3, 2]), 2);
        assert_eq!(median(&mut [-3, -2]), -3);
        // A run without the key counts as 0.
        let d = compare(
            &[run(&[("function:F.used", 8)]), run(&[])],
            &[run(&[])],
            &[],
        );
        assert_eq!((d.rows[0].base, d.rows[0].new), (Some(4), None));
    }

    #[test]
    fn rows_are_ordered_by_the_size_of_the_change() {
        let base = run(&[
            ("time", 5),
            ("peak_used", 1),
            ("function:A.used", 100),
            ("function:B.used", 100),
            ("function:B.occurrence", 1),
            ("epoch:1.gpu_used", 10),
        ]);
        let new = run(&[
            ("time", 5),
            ("peak_used", 1),
            ("function:A.used", 110),
            ("function:B.used", 50),
            ("function:B.occurrence", 9000),
            ("epoch:1.gpu_used", -10),
        ]);
        let d = compare(&[base], &[new], &[]);
        let keys: Vec<&str> = d.rows.iter().map(|r| r.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "peak_used",
                "time",
                "function:B.used",
                "function:A.used",
                "function:B.occurrence",
                "epoch:1.gpu_used"
            ]
        );
        let epoch = d.rows.last().expect("epoch row");
        assert_eq!(epoch.delta_pct, Some(-200.0));
        assert_eq!(value_text(Quantity::Bytes, epoch.new), "-10.00B");
        let shown = d.shown(&ShowOptions {
            all: false,
            top: Some(1),
        });
        assert_eq!(shown[1].rows.len(), 1);
        assert_eq!(shown[1].more, 2);
    }

    #[test]
    fn unmatched_rules_are_reported() {
        let a = run(&[("peak_used", 1)]);
        let d = compare(
            std::slice::from_ref(&a),
            std::slice::from_ref(&a),
            &[rule("function:Typo.used>1%")],
        );
        assert_eq!(d.unmatched_rules, ["function:Typo.used>1%"]);
    }

    #[test]
    fn rules_files_use_the_same_grammar() {
        let rules =
            parse_rules_file("# team limits\nfail_on = [\"peak_used > +5%\", \"time>+20%\"]\n")
                .expect("rules file");
        assert_eq!(rules.len(), 2);
        assert!(matches!(
            parse_rules_file("fail-on = []"),
            Err(RulesFileError::Toml(_))
        ));
        let e = parse_rules_file("fail_on = [\"time>+20%\", \"peak>1\"]").expect_err("bad rule");
        assert!(
            e.to_string()
                .starts_with("rule 2 of `fail_on`: bad rule `peak>1`"),
            "{e}"
        );
        assert_eq!(parse_rules_file("").expect("empty file").len(), 0);
    }

    #[test]
    fn markdown_escapes_keys_and_leads_with_the_verdict() {
        let base = run(&[("peak_used", 100), ("function:a|b.used", 1)]);
        let new = run(&[("peak_used", 200), ("function:a|b.used", 2)]);
        let d = compare(&[base], &[new], &[rule("peak_used>+5%")]);
        let md = render_markdown(&d, &ShowOptions::default());
        assert!(md.contains("❌ **1 violation(s)**"), "{md}");
        assert!(md.contains("`function:a\\|b.used`"), "{md}");
        assert!(md.find("| rule |") < md.find("| headline |"));
        let table = render_table(&d, &ShowOptions::default());
        assert!(
            table.ends_with("  peak_used>+5%  peak_used  +100.00%\n"),
            "{table}"
        );
        assert_eq!(code("a`b"), "`` a`b ``");
    }
}
