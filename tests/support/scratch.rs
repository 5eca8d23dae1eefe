//! Scratch files for the tests, removed when the test ends, also when it fails: repeated test
//! runs leave nothing behind on the disk (a run writes some hundreds of MB of traces).

#![allow(dead_code)]

use std::ffi::OsStr;
use std::ops::Deref;
use std::path::{Path, PathBuf};

use tempfile::TempDir;

/// A fresh directory under Cargo's per-package temporary directory, deleted with everything in
/// it when dropped.
pub struct Dir(TempDir);

pub fn dir() -> Dir {
    Dir(tempfile::Builder::new()
        .prefix("scratch-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("scratch directory"))
}

impl Deref for Dir {
    type Target = Path;
    fn deref(&self) -> &Path {
        self.0.path()
    }
}

/// `name` in a directory of its own; the directory (with anything written beside the file, such
/// as a packed copy or a report) goes when this is dropped.
pub struct Scratch {
    path: PathBuf,
    _dir: Dir,
}

pub fn file(name: &str) -> Scratch {
    let dir = dir();
    Scratch {
        path: dir.join(name),
        _dir: dir,
    }
}

impl Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<OsStr> for Scratch {
    fn as_ref(&self) -> &OsStr {
        self.path.as_os_str()
    }
}

static PROCESS_DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

extern "C" fn remove_process_dir() {
    if let Some(dir) = PROCESS_DIR.get() {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// `name` in a directory shared by this test process, removed when the process exits (the test
/// harness exits through `exit`, also when tests fail). For files a helper creates and a test
/// reads after the helper has returned.
pub fn process_file(name: &str) -> PathBuf {
    process_dir().join(name)
}

/// The directory of [`process_file`].
pub fn process_dir() -> &'static Path {
    PROCESS_DIR.get_or_init(|| {
        let dir = dir().0.keep();
        // SAFETY: registers a plain function with no arguments; it only reads a OnceLock.
        unsafe { libc::atexit(remove_process_dir) };
        dir
    })
}
