//! The files a user named, each made readable as a trace: a poolsight trace as it is, a file of
//! another tool (a PyTorch snapshot or profiler trace) converted by a [`Resolver`] the caller
//! provides. The analyzer reads traces only and never links a converter: the CLI and the
//! Python module pass one built on `poolsight-import`.
//!
//! An [`Input`] keeps the path as the user named it from the start, so that reports, warnings
//! and errors name the snapshot and never the trace it was converted into, and holds the
//! converted trace on disk for as long as it lives.

use std::any::Any;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use poolsight_frames::FrameFilter;

use super::{frames, LoadError, LoadOptions};
use crate::read::{ReadError, Trace};

pub use crate::read::resolve::{ConvertError, Converted, Resolver};

/// One file of a job, readable as a trace.
pub struct Input {
    /// The path as the user named it: what reports, warnings and errors call it.
    pub named: PathBuf,
    /// The trace file read for it: `named` itself, or the trace it was converted into.
    pub trace: PathBuf,
    /// Which frames of its stacks to show (`None`: the trace's default).
    frames: Option<FrameFilter>,
    /// What keeps a converted trace on disk.
    _converted: Option<Arc<dyn Any + Send + Sync>>,
}

impl Input {
    /// Opens the trace, called by its [`Input::named`] path, its stacks shown as the
    /// options' `frames` say (with `deferred`, the event chunks' checksums are left to the
    /// replay: see [`Trace::open_deferred`]).
    pub fn open(&self, deferred: bool) -> Result<Trace, ReadError> {
        let mut trace = Trace::open_named(&self.trace, &self.named, deferred)?;
        frames::show(&mut trace, self.frames);
        Ok(trace)
    }
}

/// The files of one job, in the order they were named.
pub struct Inputs {
    items: Vec<Input>,
}

impl Inputs {
    /// The files at `paths`: a directory is an error; the files `opts.resolver` converts are
    /// converted, all in one call (they are the ranks of one job), each opened once; the
    /// others are read as traces.
    pub fn resolve<P: AsRef<Path>>(paths: &[P], opts: &LoadOptions) -> Result<Inputs, LoadError> {
        let paths: Vec<&Path> = paths.iter().map(AsRef::as_ref).collect();
        if let Some(dir) = paths.iter().find(|p| p.is_dir()) {
            return Err(LoadError::Directory {
                path: dir.to_path_buf(),
            });
        }
        // Each file judged and converted once: a file named twice is then one trace twice,
        // which opening refuses as it refuses any trace named twice.
        let mut distinct: Vec<&Path> = Vec::new();
        for &p in &paths {
            if !distinct.contains(&p) {
                distinct.push(p);
            }
        }
        let converted: Vec<Option<(PathBuf, Arc<dyn Any + Send + Sync>)>> = match opts.resolver {
            Some(r) => {
                let found = (r.resolve(&distinct, opts.frames.unwrap_or_default()))
                    .map_err(LoadError::Convert)?;
                if found.len() != distinct.len() {
                    return Err(LoadError::Convert(
                        "the converter answered for a different number of files".into(),
                    ));
                }
                (found.into_iter())
                    .map(|c| c.map(|c| (c.trace, Arc::from(c.keep))))
                    .collect()
            }
            None => distinct.iter().map(|_| None).collect(),
        };
        let items = paths
            .iter()
            .map(|&p| {
                let c = (distinct.iter().position(|&f| f == p)).and_then(|i| converted[i].as_ref());
                Input {
                    named: p.to_path_buf(),
                    trace: c.map_or_else(|| p.to_path_buf(), |c| c.0.clone()),
                    frames: opts.frames,
                    _converted: c.map(|c| Arc::clone(&c.1)),
                }
            })
            .collect();
        Ok(Inputs { items })
    }

    pub fn iter(&self) -> std::slice::Iter<'_, Input> {
        self.items.iter()
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The trace files read, in order (a converted file's trace in its place).
    pub fn traces(&self) -> impl Iterator<Item = &Path> {
        self.items.iter().map(|i| i.trace.as_path())
    }
}

impl<'a> IntoIterator for &'a Inputs {
    type Item = &'a Input;
    type IntoIter = std::slice::Iter<'a, Input>;

    fn into_iter(self) -> Self::IntoIter {
        self.items.iter()
    }
}
