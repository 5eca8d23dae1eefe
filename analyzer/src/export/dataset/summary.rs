//! The summary tables of one trace: the report tables as data, one Parquet table each, with
//! the columns each table gives itself ([`crate::tables::Table::batch`]). The figures are
//! computed once, by the tables, and only laid out in columns there.

use arrow_array::RecordBatch;

use super::ExportError;
use crate::replay::Profile;
use crate::tables::{Report, ReportOptions};

/// The summary tables of a one-trace profile, as (table name, batch), in the list's order.
pub fn batches(p: &Profile) -> Result<Vec<(&'static str, RecordBatch)>, ExportError> {
    let report = Report::compute(p, &ReportOptions::default());
    let mut out = Vec::new();
    for t in report.tables() {
        if let Some(b) = t.batch().map_err(|e| ExportError::Arrow(e.to_string()))? {
            out.push((t.name(), b));
        }
    }
    Ok(out)
}
