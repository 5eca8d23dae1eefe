//! What `whatif` finds for the files a user named, as every front end asks it (the CLI's
//! `whatif`, `poolsight.whatif()`, `predict`): each file opened once through the loading step
//! (a PyTorch snapshot converted by the caller's resolver, its recorded settings and segments
//! carried in the converted trace), then replayed, or checked, device by device.

use std::path::{Path, PathBuf};

use super::WhatifError;
use super::{check, checks_json, json, whatif, Allocator, Check, Options, Recorded, Report};
use crate::load::{Inputs, LoadError, LoadOptions, LoadWarning};
use crate::read::Trace;

/// Why the files could not be replayed.
#[derive(Debug, thiserror::Error)]
pub enum FindError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Whatif(#[from] WhatifError),
}

/// Opens `named` for a replay: a trace as it is (PyTorch's default settings), a file the
/// resolver converts converted once, what it recorded of its allocator read from the same
/// trace ([`Recorded::of_trace`]); its stacks shown as `load.frames` says. What was wrong with
/// parts of it goes to `warn`, naming the file as the user did.
pub fn open(
    named: &Path,
    load: &LoadOptions,
    warn: &mut dyn FnMut(&LoadWarning),
) -> Result<(Trace, Recorded), LoadError> {
    let inputs = Inputs::resolve(std::slice::from_ref(&named), load)?;
    let input = inputs.iter().next().expect("one input per path");
    let trace = input.open(false)?;
    for w in &trace.warnings {
        warn(&LoadWarning {
            path: named.to_path_buf(),
            warning: w.clone(),
        });
    }
    let recorded = Recorded::of_trace(&trace);
    Ok((trace, recorded))
}

/// What `whatif` found for some files: the replays' reports, or with `check` the checks.
pub enum Found {
    Reports(Vec<Report>),
    Checks(Vec<Check>),
}

impl Found {
    /// The JSON document `whatif --format json` prints.
    pub fn json(&self) -> serde_json::Value {
        match self {
            Found::Reports(r) => json(r),
            Found::Checks(c) => checks_json(c),
        }
    }
}

/// Each file opened once ([`open`]), on its own, and replayed (or with `check`, checked)
/// device by device.
pub fn find(
    paths: &[PathBuf],
    opts: &Options,
    check_model: bool,
    load: &LoadOptions,
    warn: &mut dyn FnMut(&LoadWarning),
) -> Result<Found, FindError> {
    if check_model && opts.allocator != Allocator::Pytorch {
        return Err(WhatifError::CupyCheck.into());
    }
    let (mut reports, mut checks) = (Vec::new(), Vec::new());
    for named in paths {
        let (trace, recorded) = open(named, load, warn)?;
        let name = named.display().to_string();
        if check_model {
            checks.extend(check(&trace, &name, &recorded, opts.capacity));
        } else {
            reports.extend(whatif(&trace, &name, &recorded, opts)?);
        }
    }
    Ok(if check_model {
        Found::Checks(checks)
    } else {
        Found::Reports(reports)
    })
}
