//! `timers`: Chainer's link `TimerHook` and function `TimerHook` tables.
//!
//! A row sums the elapsed time of every call of that name, nested calls included (Chainer
//! warns that rows overlap); the totals count only outermost calls, a call being outermost
//! when no scope of the same kind (link, or function) encloses it, as Chainer's hook counts
//! depth. Rows are in first-seen order, a call being seen when it returns.

use std::collections::HashMap;
use std::str::FromStr;

use serde::Serialize;

use crate::read::names::FrameKind;

use super::columns::html_rows;
use super::{
    Cell, Columns, DiffKey, Figures, HtmlColumn, HtmlTable, Quantity, ReportOptions, Table,
};
use crate::replay::{signed, Profile, Seen};
use crate::tables::csv::to_csv;
use crate::tables::render::{right_aligned, time_in, time_unit_of, TIME_UNITS};

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TimerRow {
    pub name: String,
    pub elapsed_ns: u64,
    pub occurrence: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Timers {
    pub links: Vec<TimerRow>,
    pub functions: Vec<TimerRow>,
    /// Outermost link calls only (Chainer's `total_time()`).
    pub links_total_ns: u64,
    pub functions_total_ns: u64,
}

pub fn timers(p: &Profile) -> Timers {
    let (links, links_total_ns) = table(p, FrameKind::Link);
    let (functions, functions_total_ns) = table(p, FrameKind::Function);
    Timers {
        links,
        functions,
        links_total_ns,
        functions_total_ns,
    }
}

fn table(p: &Profile, kind: FrameKind) -> (Vec<TimerRow>, u64) {
    let tree = &p.tree;
    let mut rows: HashMap<&str, (TimerRow, Seen)> = HashMap::new();
    // Whether a node has an enclosing scope of `kind` (parents precede children).
    let mut inside = vec![false; tree.nodes.len()];
    let mut total = 0u64;
    for (i, n) in tree.nodes.iter().enumerate().skip(1) {
        let is = n.frame.kind == kind;
        inside[i] = inside[n.parent] || (n.parent != 0 && tree.nodes[n.parent].frame.kind == kind);
        if !is || n.agg.calls == 0 {
            continue;
        }
        if !inside[i] {
            total = total.saturating_add(n.agg.time_ns);
        }
        let e = rows.entry(&n.frame.name).or_insert_with(|| {
            (
                TimerRow {
                    name: n.frame.name.to_string(),
                    elapsed_ns: 0,
                    occurrence: 0,
                },
                n.agg.first_exit,
            )
        });
        e.0.elapsed_ns = e.0.elapsed_ns.saturating_add(n.agg.time_ns);
        e.0.occurrence += n.agg.calls;
        e.1 = e.1.min(n.agg.first_exit);
    }
    let mut rows: Vec<_> = rows.into_values().collect();
    rows.sort_by(|a, b| (a.1, &a.0.name).cmp(&(b.1, &b.0.name)));
    (rows.into_iter().map(|r| r.0).collect(), total)
}

/// `--unit` of the timer tables, as Chainer's `TimerHook.print_report(unit=...)`
/// (chainer/function_hooks/timer.py, chainer/link_hooks/timer.py).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TimeUnit {
    /// One unit for the whole table, chosen from its largest elapsed time (Chainer's default).
    #[default]
    Auto,
    /// One unit per row, from that row's elapsed time.
    AutoForeach,
    /// A fixed unit (index into `TIME_UNITS`).
    Fixed(usize),
}

impl FromStr for TimeUnit {
    type Err = String;
    fn from_str(s: &str) -> Result<TimeUnit, String> {
        match s {
            "auto" => return Ok(TimeUnit::Auto),
            "auto_foreach" => return Ok(TimeUnit::AutoForeach),
            _ => {}
        }
        TIME_UNITS
            .iter()
            .position(|(n, _)| *n == s)
            .map(TimeUnit::Fixed)
            .ok_or_else(|| {
                format!("unknown time unit {s:?}: expected auto, auto_foreach, sec, ms, us or ns")
            })
    }
}

/// Which of the two tables to print.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Which {
    #[default]
    Both,
    Links,
    Functions,
}

/// The tables `which` names, as JSON: `timers --links` writes the links and their total only,
/// `--functions` the functions and theirs (the other table's keys are left out, not written
/// empty); both, the same keys as [`Timers`].
pub struct Shown<'a> {
    pub timers: &'a Timers,
    pub which: Which,
}

impl Serialize for Shown<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let t = self.timers;
        if self.which == Which::Both {
            return t.serialize(s);
        }
        let mut m = s.serialize_map(Some(2))?;
        if self.which == Which::Links {
            m.serialize_entry("links", &t.links)?;
            m.serialize_entry("links_total_ns", &t.links_total_ns)?;
        } else {
            m.serialize_entry("functions", &t.functions)?;
            m.serialize_entry("functions_total_ns", &t.functions_total_ns)?;
        }
        m.end()
    }
}

pub fn render_table(t: &Timers, which: Which, unit: TimeUnit) -> String {
    let mut parts = Vec::new();
    if which != Which::Functions {
        parts.push(one_table("LinkName", &t.links, unit, "link"));
    }
    if which != Which::Links {
        parts.push(one_table("FunctionName", &t.functions, unit, "function"));
    }
    parts.join("\n")
}

fn one_table(title: &str, rows: &[TimerRow], unit: TimeUnit, what: &str) -> String {
    if rows.is_empty() {
        return format!("no {what} scopes in this trace\n");
    }
    let mut table = vec![vec![
        title.to_string(),
        "ElapsedTime".into(),
        "Occurrence".into(),
    ]];
    // `print_report`: with 'auto', `_choose_unit(max(elapsed_time))` once for the table.
    let table_unit = rows
        .iter()
        .map(|r| r.elapsed_ns)
        .max()
        .map_or(TIME_UNITS.len() - 1, time_unit_of);
    for r in rows {
        let t = match unit {
            TimeUnit::Auto => time_in(r.elapsed_ns, table_unit),
            TimeUnit::AutoForeach => time_in(r.elapsed_ns, time_unit_of(r.elapsed_ns)),
            TimeUnit::Fixed(u) => time_in(r.elapsed_ns, u),
        };
        table.push(vec![r.name.clone(), t, r.occurrence.to_string()]);
    }
    right_aligned(&table)
}

/// A CSV row: both tables in one, told apart by `kind`.
#[derive(Default, Serialize)]
struct CsvRow<'a> {
    kind: &'a str,
    name: &'a str,
    elapsed_ns: u64,
    occurrence: u64,
}

pub fn render_csv(t: &Timers) -> String {
    render_csv_of(t, Which::Both)
}

/// The CSV rows of the tables `which` names (`timers --links` or `--functions`).
pub fn render_csv_of(t: &Timers, which: Which) -> String {
    let tables = [("link", &t.links), ("function", &t.functions)];
    let rows: Vec<CsvRow> = tables
        .iter()
        .filter(|(kind, _)| match which {
            Which::Both => true,
            Which::Links => *kind == "link",
            Which::Functions => *kind == "function",
        })
        .flat_map(|(kind, list)| {
            list.iter().map(move |r| CsvRow {
                kind,
                name: &r.name,
                elapsed_ns: r.elapsed_ns,
                occurrence: r.occurrence,
            })
        })
        .collect();
    to_csv(&rows)
}

impl Table for Timers {
    const NAME: &'static str = "timers";
    const FIGURES: &'static [DiffKey] = &[
        DiffKey::scoped("function", "time", Quantity::Nanoseconds),
        DiffKey::scoped("link", "time", Quantity::Nanoseconds),
        DiffKey::scoped("link", "occurrence", Quantity::Count),
    ];

    fn compute(p: &Profile, _: &ReportOptions) -> Timers {
        timers(p)
    }

    fn render_table(&self, opts: &ReportOptions) -> String {
        render_table(self, opts.timers, opts.time_unit)
    }

    fn render_csv(&self) -> String {
        render_csv(self)
    }

    fn figures(&self, out: &mut Figures) {
        for row in &self.functions {
            out.scoped::<Self>("function", &row.name, "time", signed(row.elapsed_ns));
        }
        for row in &self.links {
            out.scoped::<Self>("link", &row.name, "time", signed(row.elapsed_ns));
            out.scoped::<Self>("link", &row.name, "occurrence", signed(row.occurrence));
        }
    }

    /// Chainer's link and function `TimerHook` rows, `kind` link or function.
    fn columns(&self) -> Option<Columns> {
        let rows: Vec<(&str, &TimerRow)> = self
            .links
            .iter()
            .map(|r| ("link", r))
            .chain(self.functions.iter().map(|r| ("function", r)))
            .collect();
        Columns::default()
            .numbered("row", rows.len())
            .strs("kind", &rows, |r| r.0)
            .strs("name", &rows, |r| &r.1.name)
            .counts("elapsed_ns", &rows, |r| r.1.elapsed_ns)
            .counts("occurrence", &rows, |r| r.1.occurrence)
            .into()
    }

    fn html(&self) -> Vec<HtmlTable> {
        let columns = |name| {
            vec![
                HtmlColumn::new("name", name, Cell::Text),
                HtmlColumn::new("elapsed_ns", "ElapsedTime", Cell::Duration),
                HtmlColumn::new("occurrence", "Occurrence", Cell::Count),
            ]
        };
        vec![
            HtmlTable {
                id: "links-table",
                title: "timers: links",
                note: "Chainer TimerHook",
                columns: columns("LinkName"),
                rows: html_rows(&self.links),
            },
            HtmlTable {
                id: "timer-functions-table",
                title: "timers: functions",
                note: "",
                columns: columns("FunctionName"),
                rows: html_rows(&self.functions),
            },
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chainer_example() {
        let row = |name: &str, ms: u64, n| TimerRow {
            name: name.into(),
            elapsed_ns: ms * 10_000_000,
            occurrence: n,
        };
        let t = Timers {
            links: vec![
                row("Linear", 4142, 2100),
                row("MLP", 4209, 700),
                row("Classifier", 4239, 700),
            ],
            functions: vec![],
            links_total_ns: 0,
            functions_total_ns: 0,
        };
        let expected = "  LinkName  ElapsedTime  Occurrence
    Linear     41.42sec        2100
       MLP     42.09sec         700
Classifier     42.39sec         700
";
        assert_eq!(render_table(&t, Which::Links, TimeUnit::Auto), expected);
        assert_eq!(
            render_table(&t, Which::Functions, TimeUnit::Auto),
            "no function scopes in this trace\n"
        );
        assert!(render_table(&t, Which::Links, "ms".parse().unwrap()).contains("41420.00ms"));
    }

    /// chainer/function_hooks/timer.py `TimerHook.print_report`: 'auto' chooses one unit from
    /// the largest elapsed time (2.5 s -> sec for every row, 3 us reads 0.00sec);
    /// 'auto_foreach' chooses per row (first of sec/ms/us where >= 1, else ns).
    #[test]
    fn auto_is_one_unit_per_table_auto_foreach_per_row() {
        let row = |name: &str, ns: u64| TimerRow {
            name: name.into(),
            elapsed_ns: ns,
            occurrence: 1,
        };
        let t = Timers {
            links: vec![],
            functions: vec![
                row("Slow", 2_500_000_000),
                row("Mid", 1_500_000),
                row("Fast", 3_000),
                row("Tiny", 40),
            ],
            links_total_ns: 0,
            functions_total_ns: 0,
        };
        let auto = "FunctionName  ElapsedTime  Occurrence
        Slow      2.50sec           1
         Mid      0.00sec           1
        Fast      0.00sec           1
        Tiny      0.00sec           1
";
        assert_eq!(render_table(&t, Which::Functions, TimeUnit::Auto), auto);
        let each = "FunctionName  ElapsedTime  Occurrence
        Slow      2.50sec           1
         Mid       1.50ms           1
        Fast       3.00us           1
        Tiny      40.00ns           1
";
        assert_eq!(
            render_table(&t, Which::Functions, "auto_foreach".parse().unwrap()),
            each
        );
    }
}
