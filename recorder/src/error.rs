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
    /// The path exists and replacing it was not asked for.
    #[error(
        "{} already exists; poolsight replaces a file only when asked (RecorderConfig::overwrite, \
         overwrite=True in Python, --force on the command line), or record to another path",
        path.display()
    )]
    Exists { path: PathBuf },
    /// Another recording (in this process or another) is writing the file: a file takes one
    /// recording at a time.
    #[error(
        "{} is being recorded by {}; a trace file takes one recording at a time: record to another path",
        path.display(),
        match pid {
            Some(p) if *p == std::process::id() => format!("this process (pid {p})"),
            Some(p) => format!("process {p}"),
            None => "another recording".to_string(),
        }
    )]
    Busy { path: PathBuf, pid: Option<u32> },
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
