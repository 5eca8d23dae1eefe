//! What a table needs to show itself outside the terminal, as plain data that the other
//! outputs translate: its rows as named, typed columns for the Parquet dataset ([`Columns`],
//! which `poolsight-export` turns into Arrow arrays), and as sortable tables for the HTML report
//! ([`HtmlTable`], which `poolsight-views` draws). No table links either library.

use serde::Serialize;

/// A count or size for a dataset column: engines read signed 64-bit integers everywhere (Spark
/// has no unsigned type), and no real figure comes near 2^63; a damaged trace's saturates.
pub fn i64_of(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// One column's cells, typed as the dataset stores them.
#[derive(Debug, Clone, PartialEq)]
pub enum Values {
    Ints(Vec<i64>),
    /// Figures a row may lack (null cells).
    OptInts(Vec<Option<i64>>),
    Strs(Vec<String>),
    Bools(Vec<bool>),
}

impl Values {
    pub fn len(&self) -> usize {
        match self {
            Values::Ints(v) => v.len(),
            Values::OptInts(v) => v.len(),
            Values::Strs(v) => v.len(),
            Values::Bools(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Named columns of one table, in order, all of one length: the table's rows in the dataset.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Columns(pub Vec<(&'static str, Values)>);

impl Columns {
    /// A column numbering the rows 0, 1, 2, ...: the table's printed order.
    pub fn numbered(mut self, name: &'static str, rows: usize) -> Columns {
        self.0
            .push((name, Values::Ints((0..rows as i64).collect())));
        self
    }

    pub fn ints<T>(mut self, name: &'static str, rows: &[T], f: impl Fn(&T) -> i64) -> Columns {
        self.0
            .push((name, Values::Ints(rows.iter().map(f).collect())));
        self
    }

    /// Figures a row may lack (null cells).
    pub fn opt_ints<T>(
        mut self,
        name: &'static str,
        rows: &[T],
        f: impl Fn(&T) -> Option<i64>,
    ) -> Columns {
        self.0
            .push((name, Values::OptInts(rows.iter().map(f).collect())));
        self
    }

    /// Counts and sizes ([`i64_of`]).
    pub fn counts<T>(self, name: &'static str, rows: &[T], f: impl Fn(&T) -> u64) -> Columns {
        self.ints(name, rows, |r| i64_of(f(r)))
    }

    pub fn strs<T>(mut self, name: &'static str, rows: &[T], f: impl Fn(&T) -> &str) -> Columns {
        let v = rows.iter().map(|r| f(r).to_owned()).collect();
        self.0.push((name, Values::Strs(v)));
        self
    }

    pub fn bools<T>(mut self, name: &'static str, rows: &[T], f: impl Fn(&T) -> bool) -> Columns {
        self.0
            .push((name, Values::Bools(rows.iter().map(f).collect())));
        self
    }
}

/// One sortable table of the HTML report: the page's script draws it from this, whatever the
/// table (its columns say how each cell prints).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HtmlTable {
    /// The `id` of the `<table>` element.
    pub id: &'static str,
    pub title: &'static str,
    /// Where the table comes from, printed small beside the title (may be empty).
    pub note: &'static str,
    pub columns: Vec<HtmlColumn>,
    /// One object per row, holding at least every column's key.
    pub rows: Vec<serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HtmlColumn {
    pub key: &'static str,
    pub label: &'static str,
    pub cell: Cell,
}

/// How a column's cells print and sort.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cell {
    /// A name, sorted as text.
    Text,
    /// A calling context, sorted as text, in a monospace cell.
    Stack,
    /// Bytes, with the seed tables' units.
    Bytes,
    /// A count, with thousands separators.
    Count,
    /// Nanoseconds, in the largest unit that reads well.
    Duration,
    /// A number as it is.
    Plain,
}

impl HtmlColumn {
    pub const fn new(key: &'static str, label: &'static str, cell: Cell) -> HtmlColumn {
        HtmlColumn { key, label, cell }
    }
}

/// Rows as the objects [`HtmlTable::rows`] holds.
pub fn html_rows<T: Serialize>(rows: &[T]) -> Vec<serde_json::Value> {
    rows.iter()
        .map(|r| serde_json::to_value(r).unwrap_or(serde_json::Value::Null))
        .collect()
}
