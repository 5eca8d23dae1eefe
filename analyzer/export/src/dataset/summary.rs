//! The summary tables of one trace: the report tables as data, one Parquet table each, with
//! the columns each table gives itself ([`poolsight_analyzer::tables::Table::columns`]),
//! translated here into Arrow arrays. The figures are computed once, by the tables, and only
//! laid out in columns there.

use std::sync::Arc;

use arrow_array::{ArrayRef, BooleanArray, Int64Array, RecordBatch, StringArray};
use arrow_schema::{ArrowError, Field, Schema};

use super::ExportError;
use poolsight_analyzer::replay::Profile;
use poolsight_analyzer::tables::columns::Values;
use poolsight_analyzer::tables::{Columns, Report, ReportOptions};

/// The summary tables of a one-trace profile, as (table name, batch), in the list's order.
pub fn batches(p: &Profile) -> Result<Vec<(&'static str, RecordBatch)>, ExportError> {
    let report = Report::compute(p, &ReportOptions::default());
    let mut out = Vec::new();
    for t in report.tables() {
        if let Some(c) = t.columns() {
            out.push((
                t.name(),
                batch(c).map_err(|e| ExportError::Arrow(e.to_string()))?,
            ));
        }
    }
    Ok(out)
}

/// A table's columns as one record batch: integers as `Int64` (nullable where a row may lack
/// the figure), text as `Utf8`, flags as `Boolean`; the schema follows the arrays.
pub fn batch(columns: Columns) -> Result<RecordBatch, ArrowError> {
    let (fields, arrays): (Vec<Field>, Vec<ArrayRef>) = columns
        .0
        .into_iter()
        .map(|(name, values)| {
            let a: ArrayRef = match values {
                Values::Ints(v) => Arc::new(Int64Array::from(v)),
                Values::OptInts(v) => Arc::new(Int64Array::from(v)),
                Values::Strs(v) => Arc::new(StringArray::from(v)),
                Values::Bools(v) => Arc::new(BooleanArray::from(v)),
            };
            let field = Field::new(name, a.data_type().clone(), a.null_count() > 0);
            (field, a)
        })
        .unzip();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays)
}
