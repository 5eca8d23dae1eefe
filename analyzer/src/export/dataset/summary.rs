//! The summary tables of one trace: the seed reports as data, one row per function, line,
//! timer (link or function) and epoch. The rows are the report modules' own row structs
//! ([`FunctionRow`], [`LineNode`], [`TimerRow`], [`EpochRow`]): the figures are computed once,
//! by the reports, and only laid out in columns here.

use std::sync::Arc;

use arrow_array::{ArrayRef, BooleanArray, Int64Array, RecordBatch, StringArray};
use arrow_schema::{Field, Schema};

use super::events::i64_of;
use super::ExportError;
use crate::replay::Profile;
use crate::tables::epochs::{self, EpochRow};
use crate::tables::functions::{self, FunctionRow};
use crate::tables::lines::{self, LineNode};
use crate::tables::timers::{self, TimerRow};

/// The summary tables of a one-trace profile, as (table name, batch).
pub fn batches(p: &Profile) -> Result<Vec<(&'static str, RecordBatch)>, ExportError> {
    Ok(vec![
        (
            "functions",
            function_batch(&functions::functions(p).functions)?,
        ),
        ("lines", line_batch(&lines::lines(p, 0))?),
        ("timers", timer_batch(&timers::timers(p))?),
        ("epochs", epoch_batch(&epochs::epochs(p).epochs)?),
    ])
}

/// A batch from named columns; the schema follows the arrays' types.
fn batch(columns: Vec<(&str, ArrayRef)>) -> Result<RecordBatch, ExportError> {
    let fields: Vec<Field> = columns
        .iter()
        .map(|(name, a)| Field::new(*name, a.data_type().clone(), a.null_count() > 0))
        .collect();
    let arrays = columns.into_iter().map(|(_, a)| a).collect();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays)
        .map_err(|e| ExportError::Arrow(e.to_string()))
}

fn ints<T>(rows: &[T], f: impl Fn(&T) -> i64) -> ArrayRef {
    Arc::new(Int64Array::from_iter_values(rows.iter().map(f)))
}

fn strs<T>(rows: &[T], f: impl Fn(&T) -> &str) -> ArrayRef {
    Arc::new(StringArray::from_iter_values(rows.iter().map(f)))
}

/// `functions`: Chainer's table, rows in the report's order (`row`).
fn function_batch(rows: &[FunctionRow]) -> Result<RecordBatch, ExportError> {
    batch(vec![
        ("row", ints(rows, |_| 0)),
        ("name", strs(rows, |r| &r.name)),
        ("used_bytes", ints(rows, |r| i64_of(r.used_bytes))),
        ("acquired_bytes", ints(rows, |r| i64_of(r.acquired_bytes))),
        ("occurrence", ints(rows, |r| i64_of(r.occurrence))),
        ("self_used_bytes", ints(rows, |r| i64_of(r.self_used_bytes))),
        (
            "self_acquired_bytes",
            ints(rows, |r| i64_of(r.self_acquired_bytes)),
        ),
        (
            "failed_used_bytes",
            ints(rows, |r| i64_of(r.failed_used_bytes)),
        ),
        (
            "failed_acquired_bytes",
            ints(rows, |r| i64_of(r.failed_acquired_bytes)),
        ),
    ])
    .and_then(numbered)
}

/// Replaces the `row` column (first) with 0, 1, 2, ...: the report's row order.
fn numbered(b: RecordBatch) -> Result<RecordBatch, ExportError> {
    let mut columns = b.columns().to_vec();
    columns[0] = Arc::new(Int64Array::from_iter_values(0..b.num_rows() as i64));
    RecordBatch::try_new(b.schema(), columns).map_err(|e| ExportError::Arrow(e.to_string()))
}

/// One line-tree node, flattened: its id is its place in depth-first order (the tree's
/// printed order), `parent` the id of its parent (`_root` is node 0, parent -1).
struct FlatLine<'a> {
    parent: i64,
    depth: i64,
    file: &'a str,
    line: u32,
    function: &'a str,
    used_bytes: u64,
    acquired_bytes: u64,
    failed_used_bytes: u64,
    failed_acquired_bytes: u64,
}

/// `lines`: CuPy's tree, one row per node in printed order, the whole depth.
fn line_batch(l: &lines::Lines) -> Result<RecordBatch, ExportError> {
    let r = &l.root;
    let mut rows = vec![FlatLine {
        parent: -1,
        depth: 0,
        file: "",
        line: 0,
        function: &r.name,
        used_bytes: r.used_bytes,
        acquired_bytes: r.acquired_bytes,
        failed_used_bytes: r.failed_used_bytes,
        failed_acquired_bytes: r.failed_acquired_bytes,
    }];
    flatten(&r.children, 0, 1, &mut rows);
    batch(vec![
        ("node", ints(&rows, |_| 0)),
        ("parent", ints(&rows, |r| r.parent)),
        ("depth", ints(&rows, |r| r.depth)),
        ("file", strs(&rows, |r| r.file)),
        ("line", ints(&rows, |r| i64::from(r.line))),
        ("function", strs(&rows, |r| r.function)),
        ("used_bytes", ints(&rows, |r| i64_of(r.used_bytes))),
        ("acquired_bytes", ints(&rows, |r| i64_of(r.acquired_bytes))),
        (
            "failed_used_bytes",
            ints(&rows, |r| i64_of(r.failed_used_bytes)),
        ),
        (
            "failed_acquired_bytes",
            ints(&rows, |r| i64_of(r.failed_acquired_bytes)),
        ),
    ])
    .and_then(numbered)
}

fn flatten<'a>(nodes: &'a [LineNode], parent: i64, depth: i64, out: &mut Vec<FlatLine<'a>>) {
    for n in nodes {
        let id = out.len() as i64;
        out.push(FlatLine {
            parent,
            depth,
            file: &n.file,
            line: n.line,
            function: &n.function,
            used_bytes: n.used_bytes,
            acquired_bytes: n.acquired_bytes,
            failed_used_bytes: n.failed_used_bytes,
            failed_acquired_bytes: n.failed_acquired_bytes,
        });
        flatten(&n.children, id, depth + 1, out);
    }
}

/// `timers`: Chainer's link and function `TimerHook` rows, `kind` link or function.
fn timer_batch(t: &timers::Timers) -> Result<RecordBatch, ExportError> {
    let rows: Vec<(&str, &TimerRow)> = t
        .links
        .iter()
        .map(|r| ("link", r))
        .chain(t.functions.iter().map(|r| ("function", r)))
        .collect();
    batch(vec![
        ("row", ints(&rows, |_| 0)),
        ("kind", strs(&rows, |r| r.0)),
        ("name", strs(&rows, |r| &r.1.name)),
        ("elapsed_ns", ints(&rows, |r| i64_of(r.1.elapsed_ns))),
        ("occurrence", ints(&rows, |r| i64_of(r.1.occurrence))),
    ])
    .and_then(numbered)
}

/// `epochs`: fastai's `PeakMemMetric` columns and the exact bytes, as the `epochs` JSON.
fn epoch_batch(rows: &[EpochRow]) -> Result<RecordBatch, ExportError> {
    batch(vec![
        ("epoch", ints(rows, |r| i64::from(r.epoch))),
        ("cpu_used_mb", ints(rows, |r| r.cpu_used_mb)),
        ("cpu_peak_mb", ints(rows, |r| r.cpu_peak_mb)),
        ("gpu_used_mb", ints(rows, |r| r.gpu_used_mb)),
        ("gpu_peak_mb", ints(rows, |r| r.gpu_peak_mb)),
        ("gpu_used_bytes", ints(rows, |r| r.gpu_used_bytes)),
        ("gpu_peak_bytes", ints(rows, |r| r.gpu_peak_bytes)),
        ("cpu_used_bytes", ints(rows, |r| r.cpu_used_bytes)),
        ("cpu_peak_bytes", ints(rows, |r| r.cpu_peak_bytes)),
        ("live_used_bytes", ints(rows, |r| r.live_used_bytes)),
        ("live_peak_bytes", ints(rows, |r| r.live_peak_bytes)),
        (
            "complete",
            Arc::new(BooleanArray::from_iter(
                rows.iter().map(|r| Some(r.complete)),
            )),
        ),
        ("fit", ints(rows, |r| i64::from(r.fit))),
    ])
}
