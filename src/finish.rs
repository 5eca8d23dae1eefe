//! Finishing a recording and packing it in one call: the recorder seals its live file as
//! always (the file a crash would have left, complete), then the packer writes the compact
//! copy from it. The packer is read-side code (it verifies what it packs), so it lives with the
//! analyzer; this umbrella crate joins the two, and the recorder itself stays free of it.

use std::path::{Path, PathBuf};

use crate::analyzer::export::pack::{pack_file, PackError, PackOptions, PackSummary};
use crate::analyzer::Warning;
use crate::recorder::{Recorder, RecorderError, Summary};

/// What [`FinishPacked::finish_packed`] wrote.
#[derive(Debug, Clone)]
pub struct PackedRecording {
    /// The live file, as [`Recorder::finish`] reports it.
    pub summary: Summary,
    /// The packed copy.
    pub packed: PackSummary,
    /// What the reader warned about in the live file (none for a recording that finished
    /// normally); the chunks it names are not in the packed copy.
    pub warnings: Vec<Warning>,
}

#[derive(Debug, thiserror::Error)]
pub enum FinishError {
    /// Sealing the live file failed.
    #[error(transparent)]
    Record(#[from] RecorderError),
    /// The live file is sealed and whole; only its packed copy could not be written.
    #[error("{} is finished and complete, but packing it failed: {source}", live.display())]
    Pack {
        live: PathBuf,
        #[source]
        source: PackError,
    },
}

/// Packing at the end of a recording.
pub trait FinishPacked {
    /// Seals the trace as [`Recorder::finish`] does, then writes its packed copy to `out`
    /// (as `poolsight pack` would). The live file is kept: it is the one a crash during
    /// packing cannot damage.
    fn finish_packed(
        self,
        out: impl AsRef<Path>,
        opts: &PackOptions,
    ) -> Result<PackedRecording, FinishError>;
}

impl FinishPacked for Recorder {
    fn finish_packed(
        self,
        out: impl AsRef<Path>,
        opts: &PackOptions,
    ) -> Result<PackedRecording, FinishError> {
        let live = self.path();
        let summary = self.finish()?;
        pack_finished(&live, summary, out.as_ref(), opts)
    }
}

/// The packing half of [`FinishPacked::finish_packed`], for a recording already sealed by
/// other means (the Python package's and the C ABI's sessions): packs `live` into `out`.
pub fn pack_finished(
    live: &Path,
    summary: Summary,
    out: &Path,
    opts: &PackOptions,
) -> Result<PackedRecording, FinishError> {
    let (packed, warnings) = pack_file(live, out, opts).map_err(|source| FinishError::Pack {
        live: live.to_path_buf(),
        source,
    })?;
    Ok(PackedRecording {
        summary,
        packed,
        warnings,
    })
}
