//! `poolsight.whatif()`: what `poolsight whatif` finds, as the JSON-shaped dict its
//! `--format json` prints (the one implementation: `poolsight::cli::whatif::find`).

use std::path::PathBuf;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use poolsight::analyzer::whatif::{Allocator, Options, Settings};
use poolsight::cli::whatif::{find, parse_bytes};
use poolsight::cli::Reading;

use crate::PoolsightError;

/// Replays the traces or PyTorch files in `paths` through a model of an allocator: JSON text
/// of `poolsight whatif --format json` (the Python side parses it). `capacity` is bytes or a
/// size with a unit (`"16GiB"`); `settings` are `PYTORCH_CUDA_ALLOC_CONF` strings.
#[pyfunction]
#[pyo3(signature = (paths, settings, capacity, min_capacity, check, allocator, frames))]
#[allow(clippy::too_many_arguments)]
fn whatif_json(
    py: Python<'_>,
    paths: Vec<PathBuf>,
    settings: Vec<String>,
    capacity: Option<String>,
    min_capacity: bool,
    check: bool,
    allocator: &str,
    frames: Option<&str>,
) -> PyResult<String> {
    let alternatives = settings
        .iter()
        .map(|s| Settings::parse(s).map_err(|e| PyValueError::new_err(format!("{s:?}: {e}"))))
        .collect::<PyResult<Vec<_>>>()?;
    let capacity = capacity
        .map(|c| parse_bytes(&c).map_err(PyValueError::new_err))
        .transpose()?;
    let opts = Options {
        allocator: allocator
            .parse::<Allocator>()
            .map_err(PyValueError::new_err)?,
        alternatives,
        capacity,
        min_capacity,
    };
    let frames = frames
        .map(|f| f.parse().map_err(PyValueError::new_err))
        .transpose()?;
    let found = py
        .detach(|| find(&paths, &opts, check, &Reading { frames }))
        .map_err(|e| PoolsightError::new_err(format!("{e:#}")))?;
    Ok(found.json().to_string())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(whatif_json, m)?)?;
    m.add_function(wrap_pyfunction!(predict_report, m)?)
}

/// `poolsight predict`'s reading of a prediction's trace (`poolsight::cli::predict`): the
/// text it prints (or its JSON with `json`) and whether the run fits.
#[pyfunction]
#[pyo3(signature = (trace, settings, capacity, json))]
fn predict_report(
    py: Python<'_>,
    trace: PathBuf,
    settings: &str,
    capacity: Option<u64>,
    json: bool,
) -> PyResult<(String, bool)> {
    let found = py
        .detach(|| {
            poolsight::cli::predict::summarize(
                &trace,
                settings,
                capacity,
                &Reading { frames: None },
            )
        })
        .map_err(|e| PoolsightError::new_err(format!("{e:#}")))?;
    let text = if json {
        poolsight::cli::predict::json(&found)
    } else {
        poolsight::cli::predict::render(&found)
    };
    Ok((text, found.fits))
}
