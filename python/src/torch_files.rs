//! PyTorch's own memory files into traces, for `poolsight.torch.from_profile` and
//! `record_history`: the one conversion `poolsight import` runs (`poolsight-import`).

use std::path::PathBuf;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use poolsight::import::kineto::Category;
use poolsight::import::{convert_file, Kind, Options};

use crate::PoolsightError;

/// Converts the snapshot pickle or profiler JSON at `input` into a trace at `output`;
/// `categories` are (address, time in µs on the profiler's clock, category) of allocations,
/// given to a profiler trace's mallocs as label frames. Returns what was converted.
#[pyfunction]
#[pyo3(signature = (input, output, frames="viewer", rank=None, overwrite=false, categories=None))]
fn import_file<'py>(
    py: Python<'py>,
    input: PathBuf,
    output: PathBuf,
    frames: &str,
    rank: Option<u32>,
    overwrite: bool,
    categories: Option<Vec<(u64, f64, String)>>,
) -> PyResult<Bound<'py, PyDict>> {
    let opts = Options {
        frames: frames.parse().map_err(PyValueError::new_err)?,
        rank,
        world_size: None,
        overwrite,
        categories: categories
            .unwrap_or_default()
            .into_iter()
            .map(|(addr, ts_us, category)| Category {
                addr,
                ts_us,
                category,
            })
            .collect(),
    };
    let c = py
        .detach(|| convert_file(&input, &output, &opts, None))
        .map_err(|e| PoolsightError::new_err(format!("{}: {e}", input.display())))?;
    let d = PyDict::new(py);
    d.set_item(
        "kind",
        match c.kind {
            Kind::Profile => "torch-profiler",
            _ => "pytorch-snapshot",
        },
    )?;
    d.set_item("entries", c.entries)?;
    d.set_item("events", c.events)?;
    d.set_item("bytes", c.output_bytes)?;
    d.set_item("mid_run", c.overflowed)?;
    d.set_item("unmapped", c.unmapped)?;
    Ok(d)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(import_file, m)?)
}
