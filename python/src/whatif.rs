//! `poolsight.whatif()`: what `poolsight whatif` finds, as the dict its `--format json` prints
//! (the one implementation: `poolsight::analyzer::whatif::find`), and what a prediction says
//! (`poolsight::analyzer::predict`); both made into Python objects directly.

use std::path::PathBuf;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use poolsight::analyzer::load::{FrameFilter, LoadOptions, LoadWarning};
use poolsight::analyzer::predict;
use poolsight::analyzer::units::parse_bytes;
use poolsight::analyzer::whatif::{find, Allocator, Options, Settings};
use poolsight::import::PyTorchFiles;

use crate::PoolsightError;

/// How the Python module loads files: PyTorch's converted, stacks as `frames` says.
pub(crate) fn loading(frames: Option<FrameFilter>) -> LoadOptions<'static> {
    const FILES: PyTorchFiles<'static> = PyTorchFiles { progress: None };
    LoadOptions {
        frames,
        resolver: Some(&FILES),
    }
}

/// A damaged part of a file, on stderr as the CLI prints it.
fn warn(w: &LoadWarning) {
    eprintln!("poolsight: warning: {}", w.one_line());
}

/// Replays the traces or PyTorch files in `paths` through a model of an allocator: what
/// `poolsight whatif --format json` prints, as Python objects. `capacity` is bytes or a
/// size with a unit (`"16GiB"`); `settings` are `PYTORCH_CUDA_ALLOC_CONF` strings.
#[pyfunction]
#[pyo3(signature = (paths, settings, capacity, min_capacity, check, allocator, frames))]
#[allow(clippy::too_many_arguments)]
fn whatif_found<'py>(
    py: Python<'py>,
    paths: Vec<PathBuf>,
    settings: Vec<String>,
    capacity: Option<String>,
    min_capacity: bool,
    check: bool,
    allocator: &str,
    frames: Option<&str>,
) -> PyResult<Bound<'py, PyAny>> {
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
        .detach(|| find(&paths, &opts, check, &loading(frames), &mut warn))
        .map_err(|e| PoolsightError::new_err(e.to_string()))?;
    Ok(pythonize::pythonize(py, &found.json())?)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(whatif_found, m)?)?;
    m.add_function(wrap_pyfunction!(predict_report, m)?)
}

/// `poolsight predict`'s reading of a prediction's trace (`poolsight::analyzer::predict`):
/// the text it prints, or with `json` the document its `--format json` writes (as Python
/// objects, in the document's order), and whether the run fits.
#[pyfunction]
#[pyo3(signature = (trace, settings, capacity, json))]
fn predict_report<'py>(
    py: Python<'py>,
    trace: PathBuf,
    settings: &str,
    capacity: Option<u64>,
    json: bool,
) -> PyResult<(Bound<'py, PyAny>, bool)> {
    let found = py
        .detach(|| predict::summarize(&trace, settings, capacity, &loading(None), &mut warn))
        .map_err(|e| PoolsightError::new_err(e.to_string()))?;
    let shown = if json {
        pythonize::pythonize(py, &found)?
    } else {
        predict::render(&found).into_pyobject(py)?.into_any()
    };
    Ok((shown, found.fits))
}
