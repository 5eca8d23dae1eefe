//! The recorder's error types.

use std::path::PathBuf;

/// Why the recorder could not start (or finish). Failures while recording never surface here:
/// they stop recording, count dropped events and are reported once on stderr and in the file.
#[derive(Debug, thiserror::Error)]
pub enum RecorderError {
    #[error("cannot {what} trace file {}: {source}", path.display())]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid recorder configuration: {0}")]
    Config(String),
}

/// Why [`crate::Handle::exit`] refused a token. Nothing is recorded and no open scope is
/// touched when it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ScopeError {
    /// The token was entered on another recorder; its stack id means nothing in this file.
    #[error("the scope token belongs to another recorder")]
    OtherRecorder,
    /// The token was entered on another thread (scopes are per thread, as Chainer's hooks), or
    /// this thread's scope state was dropped since (the thread is exiting).
    #[error("the scope token was entered on another thread")]
    OtherThread,
    /// The token was already exited.
    #[error("the scope token was already exited")]
    NotOpen,
}
