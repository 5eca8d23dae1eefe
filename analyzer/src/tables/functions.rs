//! `functions`: Chainer's `CupyMemoryProfileHook` table.
//!
//! Chainer measures, for each function call, the pool's malloc and device-alloc totals before
//! and after it: a call's used bytes include its nested calls, and a function nested in itself
//! counts the inner call's bytes twice (once per call). Here a malloc counts for every function
//! frame on its stack, which is the same sum. Chainer's `CupyMemoryCumulativeHook` adds
//! `mem_size` to used bytes in `malloc_preprocess` and to acquired bytes in `alloc_preprocess`
//! (chainer/function_hooks/cupy_memory_profile.py), before the request succeeds or fails, so a
//! request that ran out of memory counts, and every device try of the pool's retries counts
//! as acquired; `failed_*` keys say how much of each figure failed. The exclusive (`self_*`)
//! columns count each malloc once, for its innermost function.
//!
//! Rows are in first-seen order: Chainer appends a call to its history when the call returns,
//! so a function's row comes at its first return.

use std::collections::HashMap;
use std::str::FromStr;

use serde::Serialize;

use crate::read::names::FrameKind;

use super::columns::html_rows;
use super::{
    Cell, Columns, DiffKey, Figures, HtmlColumn, HtmlTable, Quantity, ReportOptions, Table,
};
use crate::replay::{signed, Profile, Raised, Seen, NEVER};
use crate::tables::csv::to_csv;
use crate::tables::render::{bytes_in, choose_byte_unit, right_aligned, BYTE_UNITS};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct FunctionRow {
    pub name: String,
    pub used_bytes: u64,
    pub acquired_bytes: u64,
    pub occurrence: u64,
    pub self_used_bytes: u64,
    pub self_acquired_bytes: u64,
    /// Of `used_bytes`: requests that failed (out of memory), which Chainer counts as used.
    pub failed_used_bytes: u64,
    /// Of `acquired_bytes`: device allocation attempts that failed, each retry included.
    pub failed_acquired_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Functions {
    pub functions: Vec<FunctionRow>,
}

/// One function's row while the tree is walked.
struct Acc {
    row: FunctionRow,
    first_exit: Seen,
    first_mem: Seen,
    /// What its calls that raised allocated: left out of the row at the end.
    raised: Raised,
    /// Exclusive bytes of raising calls of functions inside it: added at the end.
    inherited: (u64, u64),
}

pub fn functions(p: &Profile) -> Functions {
    let tree = &p.tree;
    let mut rows: HashMap<&str, Acc> = HashMap::new();
    // Innermost enclosing function of each node (in DFS order parents come first).
    let mut innermost: Vec<Option<usize>> = vec![None; tree.nodes.len()];
    for (i, n) in tree.nodes.iter().enumerate().skip(1) {
        let is_fn = n.frame.kind == FrameKind::Function;
        innermost[i] = if is_fn { Some(i) } else { innermost[n.parent] };
        if is_fn {
            let e = rows.entry(&n.frame.name).or_insert_with(|| Acc {
                row: FunctionRow {
                    name: n.frame.name.to_string(),
                    ..FunctionRow::default()
                },
                first_exit: NEVER,
                first_mem: NEVER,
                raised: Raised::default(),
                inherited: (0, 0),
            });
            let row = &mut e.row;
            row.used_bytes = row.used_bytes.saturating_add(n.total.used_bytes);
            row.acquired_bytes = row.acquired_bytes.saturating_add(n.total.acquired_bytes);
            row.failed_used_bytes = row
                .failed_used_bytes
                .saturating_add(n.total.failed_used_bytes);
            row.failed_acquired_bytes = row
                .failed_acquired_bytes
                .saturating_add(n.total.failed_acquired_bytes);
            row.occurrence += n.agg.calls;
            e.first_exit = e.first_exit.min(n.agg.first_exit);
            e.first_mem = e.first_mem.min(n.total.first_mem);
            // Calls that raised are not calls: what they allocated leaves this row (it stays
            // in the rows of the calls around them), and their exclusive bytes go to the
            // innermost function around them, as if the raising call had never been hooked.
            let r = n.agg.raised;
            e.raised.add(&r);
            if let Some(outer) = innermost[n.parent] {
                let name: &str = &tree.nodes[outer].frame.name;
                if let Some(o) = rows.get_mut(name) {
                    o.inherited.0 = o.inherited.0.saturating_add(r.self_used_bytes);
                    o.inherited.1 = o.inherited.1.saturating_add(r.self_acquired_bytes);
                }
            }
        }
        if let Some(f) = innermost[i] {
            let name: &str = &tree.nodes[f].frame.name;
            if let Some(e) = rows.get_mut(name) {
                e.row.self_used_bytes = e.row.self_used_bytes.saturating_add(n.agg.used_bytes);
                e.row.self_acquired_bytes = e
                    .row
                    .self_acquired_bytes
                    .saturating_add(n.agg.acquired_bytes);
            }
        }
    }
    // A function none of whose calls returned has no row: Chainer appends a call to its
    // history when it returns (a trace cut inside a call, or a call that raised).
    let mut rows: Vec<Acc> = rows
        .into_values()
        .filter(|a| a.row.occurrence > 0)
        .map(|mut a| {
            let (r, row) = (&a.raised, &mut a.row);
            row.used_bytes = row.used_bytes.saturating_sub(r.used_bytes);
            row.acquired_bytes = row.acquired_bytes.saturating_sub(r.acquired_bytes);
            row.failed_used_bytes = row.failed_used_bytes.saturating_sub(r.failed_used_bytes);
            row.failed_acquired_bytes = row
                .failed_acquired_bytes
                .saturating_sub(r.failed_acquired_bytes);
            row.self_used_bytes = (row.self_used_bytes.saturating_sub(r.self_used_bytes))
                .saturating_add(a.inherited.0);
            row.self_acquired_bytes = (row
                .self_acquired_bytes
                .saturating_sub(r.self_acquired_bytes))
            .saturating_add(a.inherited.1);
            a
        })
        .collect();
    rows.sort_by(|a, b| {
        (a.first_exit, a.first_mem, &a.row.name).cmp(&(b.first_exit, b.first_mem, &b.row.name))
    });
    Functions {
        functions: rows.into_iter().map(|a| a.row).collect(),
    }
}

/// `--unit`: Chainer's `print_report(unit=...)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Unit {
    /// One unit per column, from the column's largest value.
    #[default]
    Auto,
    /// One unit per cell.
    AutoForeach,
    /// A fixed unit (index into `BYTE_UNITS`).
    Fixed(usize),
}

impl FromStr for Unit {
    type Err = String;
    fn from_str(s: &str) -> Result<Unit, String> {
        match s {
            "auto" => Ok(Unit::Auto),
            "auto_foreach" => Ok(Unit::AutoForeach),
            _ => BYTE_UNITS
                .iter()
                .position(|u| *u == s)
                .map(Unit::Fixed)
                .ok_or_else(|| {
                    format!(
                        "unknown unit {s:?}: expected auto, auto_foreach or one of {}",
                        BYTE_UNITS.join(", ")
                    )
                }),
        }
    }
}

/// The table, exactly as Chainer prints it; `with_self` adds the exclusive columns.
pub fn render_table(f: &Functions, unit: Unit, with_self: bool) -> String {
    if f.functions.is_empty() {
        return "no function scopes in this trace\n".into();
    }
    let mut header = vec!["FunctionName", "UsedBytes", "AcquiredBytes", "Occurrence"];
    if with_self {
        header.extend(["SelfUsedBytes", "SelfAcquiredBytes"]);
    }
    let mut rows = vec![header.iter().map(|s| s.to_string()).collect::<Vec<_>>()];
    let cols = |r: &FunctionRow| {
        [
            r.used_bytes,
            r.acquired_bytes,
            r.self_used_bytes,
            r.self_acquired_bytes,
        ]
    };
    let column_units: Vec<(usize, f64)> = (0..4)
        .map(|c| {
            let max = f.functions.iter().map(|r| cols(r)[c]).max().unwrap_or(0);
            match unit {
                Unit::Fixed(u) => (u, 1024f64.powi(u as i32)),
                _ => choose_byte_unit(max as f64),
            }
        })
        .collect();
    for r in &f.functions {
        let cell = |c: usize| {
            let v = cols(r)[c] as f64;
            let u = match unit {
                Unit::AutoForeach => choose_byte_unit(v),
                _ => column_units[c],
            };
            bytes_in(v, u)
        };
        let mut row = vec![r.name.clone(), cell(0), cell(1), r.occurrence.to_string()];
        if with_self {
            row.extend([cell(2), cell(3)]);
        }
        rows.push(row);
    }
    right_aligned(&rows)
}

pub fn render_csv(f: &Functions) -> String {
    to_csv(&f.functions)
}

impl Table for Functions {
    const NAME: &'static str = "functions";
    const FIGURES: &'static [DiffKey] = &[
        DiffKey::scoped("function", "used", Quantity::Bytes),
        DiffKey::scoped("function", "acquired", Quantity::Bytes),
        DiffKey::scoped("function", "self_used", Quantity::Bytes),
        DiffKey::scoped("function", "self_acquired", Quantity::Bytes),
        DiffKey::scoped("function", "occurrence", Quantity::Count),
    ];

    fn compute(p: &Profile, _: &ReportOptions) -> Functions {
        functions(p)
    }

    fn render_table(&self, opts: &ReportOptions) -> String {
        render_table(self, opts.unit, opts.with_self)
    }

    fn render_csv(&self) -> String {
        render_csv(self)
    }

    fn figures(&self, out: &mut Figures) {
        for row in &self.functions {
            let scoped = [
                ("used", row.used_bytes),
                ("acquired", row.acquired_bytes),
                ("self_used", row.self_used_bytes),
                ("self_acquired", row.self_acquired_bytes),
                ("occurrence", row.occurrence),
            ];
            for (figure, v) in scoped {
                out.scoped::<Self>("function", &row.name, figure, signed(v));
            }
        }
    }

    /// Chainer's table, rows in the report's order (`row`).
    fn columns(&self) -> Option<Columns> {
        let rows = &self.functions;
        Columns::default()
            .numbered("row", rows.len())
            .strs("name", rows, |r| &r.name)
            .counts("used_bytes", rows, |r| r.used_bytes)
            .counts("acquired_bytes", rows, |r| r.acquired_bytes)
            .counts("occurrence", rows, |r| r.occurrence)
            .counts("self_used_bytes", rows, |r| r.self_used_bytes)
            .counts("self_acquired_bytes", rows, |r| r.self_acquired_bytes)
            .counts("failed_used_bytes", rows, |r| r.failed_used_bytes)
            .counts("failed_acquired_bytes", rows, |r| r.failed_acquired_bytes)
            .into()
    }

    fn html(&self) -> Vec<HtmlTable> {
        vec![HtmlTable {
            id: "functions-table",
            title: "functions",
            note: "Chainer CupyMemoryProfileHook",
            columns: vec![
                HtmlColumn::new("name", "FunctionName", Cell::Text),
                HtmlColumn::new("used_bytes", "UsedBytes", Cell::Bytes),
                HtmlColumn::new("acquired_bytes", "AcquiredBytes", Cell::Bytes),
                HtmlColumn::new("occurrence", "Occurrence", Cell::Count),
                HtmlColumn::new("self_used_bytes", "SelfUsedBytes", Cell::Bytes),
                HtmlColumn::new("self_acquired_bytes", "SelfAcquiredBytes", Cell::Bytes),
            ],
            rows: html_rows(&self.functions),
        }]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, used: u64, acquired: u64, occurrence: u64) -> FunctionRow {
        FunctionRow {
            name: name.into(),
            used_bytes: used,
            acquired_bytes: acquired,
            occurrence,
            self_used_bytes: used,
            self_acquired_bytes: acquired,
            failed_used_bytes: 0,
            failed_acquired_bytes: 0,
        }
    }

    /// Chainer's documented example, from the byte counts it implies.
    #[test]
    fn chainer_example() {
        let gb = |x: f64| (x * (1u64 << 30) as f64) as u64;
        let mb = |x: f64| (x * (1u64 << 20) as f64) as u64;
        let f = Functions {
            functions: vec![
                row("LinearFunction", gb(5.16), mb(179.98), 3900),
                row("ReLU", gb(0.99), mb(458.97), 2600),
                row("SoftmaxCrossEntropy", gb(0.01), mb(5.08), 1300),
                row("Accuracy", gb(0.001), mb(0.35), 700),
            ],
        };
        let expected = "       FunctionName  UsedBytes  AcquiredBytes  Occurrence
     LinearFunction     5.16GB       179.98MB        3900
               ReLU     0.99GB       458.97MB        2600
SoftmaxCrossEntropy     0.01GB         5.08MB        1300
           Accuracy     0.00GB         0.35MB         700
";
        assert_eq!(render_table(&f, Unit::Auto, false), expected);
    }

    #[test]
    fn units() {
        let f = Functions {
            functions: vec![row("A", 3 << 20, 512, 1), row("B", 1536, 0, 2)],
        };
        let t = render_table(&f, Unit::AutoForeach, false);
        assert!(t.contains("3.00MB") && t.contains("512.00B") && t.contains("1.50KB"));
        let t = render_table(&f, Unit::Fixed(1), true);
        assert!(t.contains("3072.00KB") && t.contains("SelfAcquiredBytes"));
        assert_eq!("ZB".parse::<Unit>(), Ok(Unit::Fixed(7)));
        assert!("YB".parse::<Unit>().is_err());
        assert_eq!("KB".parse::<Unit>(), Ok(Unit::Fixed(1)));
    }
}
