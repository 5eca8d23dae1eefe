//! Other tools' files read wherever a trace is: the interface through which a converter (for
//! PyTorch's files, `poolsight_import::PyTorchFiles`) hands the loading step a trace for each
//! file it takes. The reader links no converter; whoever loads files passes one.

use std::any::Any;
use std::path::{Path, PathBuf};

use poolsight_frames::FrameFilter;

/// Why a resolver could not convert a file (its message names the file).
pub type ConvertError = Box<dyn std::error::Error + Send + Sync>;

/// Converts files that are not poolsight traces into traces.
pub trait Resolver: Sync {
    /// Of the files `paths` — those of one job, each once, in the order they were named —
    /// converts those it reads (judged by their content), keeping the frames `frames` says:
    /// one entry per path, in their order, `None` for a file it leaves to be read as a trace.
    /// Each file is opened once, to judge it and to convert it.
    fn resolve(
        &self,
        paths: &[&Path],
        frames: FrameFilter,
    ) -> Result<Vec<Option<Converted>>, ConvertError>;
}

/// A file converted into a trace.
pub struct Converted {
    /// The trace it was converted into.
    pub trace: PathBuf,
    /// What keeps that trace on disk (a temporary directory), dropped with the loaded input.
    /// The trace keeps what the file recorded of its allocator (format 1.7's import header).
    pub keep: Box<dyn Any + Send + Sync>,
}
