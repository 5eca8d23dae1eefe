//! One run's figures: every report flattened into one number per stable key (the keys are in
//! the module documentation of `diff`).

use std::collections::HashMap;
use std::fmt::{self, Write as _};

use serde::Serialize;

use crate::replay::signed;
use crate::tables::lines::LineNode;
use crate::tables::report::Report;

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
    pub(super) fn name(self) -> &'static str {
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
pub(super) const HEADLINE: [(&str, Option<&str>, Quantity); 6] = [
    ("peak_used", None, Quantity::Bytes),
    ("peak_acquired", Some("acquired"), Quantity::Bytes),
    ("allocations", None, Quantity::Count),
    ("device_allocations", None, Quantity::Count),
    ("out_of_memory", None, Quantity::Count),
    ("time", Some("wall_time"), Quantity::Nanoseconds),
];

/// A scope's figures: name, section, quantity.
pub(super) type ScopeFigures = &'static [(&'static str, Section, Quantity)];

/// Scoped keys: `scope:NAME.figure`, with each figure's section and quantity.
pub(super) const SCOPES: [(&str, ScopeFigures); 4] = [
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
            // The epochs of a later fit (fastai's fine_tune repeats numbers) as "fit:epoch".
            let n = if e.fit == 0 {
                e.epoch.to_string()
            } else {
                format!("{}:{}", e.fit, e.epoch)
            };
            f.scoped("epoch", &n, "gpu_used", e.gpu_used_bytes);
            f.scoped("epoch", &n, "gpu_peak", e.gpu_peak_bytes);
            f.scoped("epoch", &n, "cpu_used", e.cpu_used_bytes);
            f.scoped("epoch", &n, "cpu_peak", e.cpu_peak_bytes);
        }
        f
    }

    pub(super) fn put(&mut self, key: String, section: Section, quantity: Quantity, value: i64) {
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

pub(super) fn figure_of(scope: &str, figure: &str) -> Option<(Section, Quantity)> {
    SCOPES
        .iter()
        .find(|(s, _)| *s == scope)?
        .1
        .iter()
        .find(|(f, _, _)| *f == figure)
        .map(|&(_, s, q)| (s, q))
}
