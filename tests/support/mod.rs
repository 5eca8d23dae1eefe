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

/// Runs the ignored test `name` (`module::function`) of this test binary alone, in a child
/// process with `env` added: for what must not touch the test process itself (its resource
/// limits).
pub fn run_child_test(name: &str, env: &[(&str, &std::ffi::OsStr)]) -> std::process::Output {
    let mut child = std::process::Command::new(std::env::current_exe().expect("the test binary"));
    child.args([
        "--exact",
        name,
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ]);
    for (key, value) in env {
        child.env(key, value);
    }
    child.output().expect("run the child test")
}

/// Limits this process's address space (`RLIMIT_AS`, `ulimit -v`) to what it maps now plus
/// `spare` bytes. For a child process only ([`run_child_test`]).
#[cfg(target_os = "linux")]
pub fn limit_address_space(spare: u64) {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let used_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmSize:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmSize in /proc/self/status");
    let lim = libc::rlimit {
        rlim_cur: (used_kib * 1024 + spare) as libc::rlim_t,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit on this process with a struct we own.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &lim) }, 0);
}
