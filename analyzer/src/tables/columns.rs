//! What a table needs to show itself outside the terminal: its rows as columns for the
//! Parquet dataset ([`Columns`]), and as sortable tables for the HTML report ([`HtmlTable`]).

use std::sync::Arc;

use arrow_array::{ArrayRef, BooleanArray, Int64Array, RecordBatch, StringArray};
use arrow_schema::{ArrowError, Field, Schema};
use serde::Serialize;

/// A count or size for a Parquet column: engines read signed 64-bit integers everywhere (Spark
/// has no unsigned type), and no real figure comes near 2^63; a damaged trace's saturates.
pub fn i64_of(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Named columns of one table, in order; [`Columns::batch`] makes the Parquet record batch.
#[derive(Default)]
pub struct Columns(Vec<(&'static str, ArrayRef)>);

impl Columns {
    /// A column numbering the rows 0, 1, 2, ...: the table's printed order.
    pub fn numbered(mut self, name: &'static str, rows: usize) -> Columns {
        self.0
            .push((name, Arc::new(Int64Array::from_iter_values(0..rows as i64))));
        self
    }

    pub fn ints<T>(mut self, name: &'static str, rows: &[T], f: impl Fn(&T) -> i64) -> Columns {
        self.0.push((
            name,
            Arc::new(Int64Array::from_iter_values(rows.iter().map(f))),
        ));
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
            .push((name, Arc::new(rows.iter().map(f).collect::<Int64Array>())));
        self
    }

    /// Counts and sizes ([`i64_of`]).
    pub fn counts<T>(self, name: &'static str, rows: &[T], f: impl Fn(&T) -> u64) -> Columns {
        self.ints(name, rows, |r| i64_of(f(r)))
    }

    pub fn strs<T>(mut self, name: &'static str, rows: &[T], f: impl Fn(&T) -> &str) -> Columns {
        self.0.push((
            name,
            Arc::new(StringArray::from_iter_values(rows.iter().map(f))),
        ));
        self
    }

    pub fn bools<T>(mut self, name: &'static str, rows: &[T], f: impl Fn(&T) -> bool) -> Columns {
        let a = BooleanArray::from_iter(rows.iter().map(|r| Some(f(r))));
        self.0.push((name, Arc::new(a)));
        self
    }

    /// The batch; the schema follows the arrays' types.
    pub fn batch(self) -> Result<RecordBatch, ArrowError> {
        let fields: Vec<Field> = self
            .0
            .iter()
            .map(|(name, a)| Field::new(*name, a.data_type().clone(), a.null_count() > 0))
            .collect();
        let arrays = self.0.into_iter().map(|(_, a)| a).collect();
        RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays)
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
