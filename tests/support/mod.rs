//! What the test binaries share: scratch files that clean up after themselves ([`scratch`]), a
//! flattened, verified view of a trace ([`common`]), and running the `poolsight` command
//! ([`cli`]).

#![allow(dead_code)]

pub mod common;
pub mod scratch;

use std::path::Path;
use std::sync::Arc;

use poolsight::pool::device::HostDevice;
use poolsight::pool::{MemoryPool, TraceHook};
use poolsight::recorder::{Handle, Recorder, RecorderConfig};

/// A committed fixture trace: `fixtures/traces/{name}.pstrace`.
pub fn fixture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("fixtures/traces/{name}.pstrace"))
}

/// Records `body` into `path` with a TraceHook on a fresh 1 GiB host pool, then seals the file.
pub fn record_on_pool(path: &Path, body: impl FnOnce(&Handle, &MemoryPool)) {
    let rec = Recorder::create(path, RecorderConfig::default()).expect("recorder");
    let h = rec.handle();
    let pool = MemoryPool::new(Arc::new(HostDevice::new(0, 1 << 30)));
    {
        let _hook = TraceHook::for_pool(h.clone(), &pool).install();
        body(&h, &pool);
    }
    rec.finish().expect("finish");
}

/// What a `poolsight` command did: its exit code (-1 when killed by a signal), stdout, stderr.
pub struct Outcome {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Outcome {
    /// Stdout as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("{e}: {}", self.stdout))
    }
}

/// Runs the `poolsight` binary this test build made, with `args`, in the repository's root
/// (where relative paths like `fixtures/traces/...` are).
pub fn cli<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Outcome {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_poolsight"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(args)
        .output()
        .expect("run poolsight");
    Outcome {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}
