//! The rule grammar of `--fail-on` and rules files: `METRIC > VALUE` or `METRIC >= VALUE`,
//! parsed into a [`Rule`] that says whether a compared row crossed it.

use std::str::FromStr;

use serde::Deserialize;

use crate::tables::{diff_keys, Quantity};

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
        "unknown metric `{0}`: expected peak_used, peak_acquired (or acquired), allocations, device_allocations, out_of_memory, time, peak.category.NAME, peak.line.LINE, or function:NAME.FIGURE, link:NAME.FIGURE, line:STACK.FIGURE, epoch:N.FIGURE, category:NAME.FIGURE, module:PATH.FIGURE, whatif:DEVICE.FIGURE"
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
    #[error("`{0}` names nothing: write {1}.NAME, NAME as the diff shows it (`*` matches any)")]
    NothingNamed(String, &'static str),
    #[error("epoch `{0}` is not an epoch number, `fit:number` (a later fit's epoch) or `*`")]
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
    let keys = diff_keys();
    if let Some((_, k)) = keys
        .iter()
        .find(|(_, k)| k.scope.is_empty() && (k.figure == m || k.alias == Some(m)))
    {
        return Ok((k.figure.to_string(), k.quantity));
    }
    // `peak.line.NAME`: the name last, and any text (a line holds dots and colons).
    if let Some((_, k)) = keys.iter().find(|(_, k)| {
        k.is_named()
            && m.strip_prefix(k.scope)
                .is_some_and(|rest| rest.starts_with('.'))
    }) {
        if m.len() == k.scope.len() + 1 {
            return Err(RuleProblem::NothingNamed(m.to_string(), k.scope));
        }
        return Ok((m.to_string(), k.quantity));
    }
    let unknown = || RuleProblem::UnknownMetric(m.to_string());
    let (scope, rest) = m.split_once(':').ok_or_else(unknown)?;
    let figures: Vec<_> = keys
        .iter()
        .map(|(_, k)| k)
        .filter(|k| !k.scope.is_empty() && !k.is_named() && k.scope == scope)
        .collect();
    let scope = figures.first().map(|k| k.scope).ok_or_else(unknown)?;
    let expected = || {
        figures
            .iter()
            .map(|k| k.figure)
            .collect::<Vec<_>>()
            .join(", ")
    };
    // Figures hold no `.`, names may (`SGD.update`, file names): split at the last one.
    let (name, figure) = rest.rsplit_once('.').ok_or_else(|| RuleProblem::NoFigure {
        metric: m.to_string(),
        scope,
        expected: expected(),
    })?;
    let Some(quantity) = figures
        .iter()
        .find(|k| k.figure == figure)
        .map(|k| k.quantity)
    else {
        return Err(RuleProblem::UnknownFigure {
            scope,
            figure: figure.to_string(),
            expected: expected(),
        });
    };
    if name.is_empty() {
        return Err(RuleProblem::EmptyName(m.to_string(), scope));
    }
    if scope == "epoch" && name != "*" && !is_epoch_key(name) {
        return Err(RuleProblem::BadEpoch(name.to_string()));
    }
    Ok((format!("{scope}:{name}.{figure}"), quantity))
}

/// An epoch's key: its number, or `fit:number` for the epochs of a later fit.
fn is_epoch_key(name: &str) -> bool {
    let epoch = name.rsplit_once(':').map_or(name, |(fit, epoch)| {
        if fit.parse::<u32>().is_ok() {
            epoch
        } else {
            ""
        }
    });
    epoch.parse::<u32>().is_ok()
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
pub(super) fn glob(pattern: &str, text: &str) -> bool {
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
}
