//! A C program records through the ABI (compiled here with the system's `cc` against the
//! header and the shared library cargo built), and the analyzer reads what it wrote.

use std::path::{Path, PathBuf};
use std::process::Command;

use poolsight_analyzer::tables::functions::functions;
use poolsight_analyzer::{replay, ReplayOptions, Trace};

/// Where this crate's shared library is: `cargo test` builds it beside this test binary
/// (target/<profile>/deps/), `cargo build` in target/<profile>/.
fn library_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent()?.to_path_buf();
    let profile = deps.parent().map(Path::to_path_buf);
    [Some(deps), profile]
        .into_iter()
        .flatten()
        .find(|d| d.join("libpoolsight_capi.so").exists())
}

#[test]
fn a_c_program_records_a_trace_the_analyzer_reads() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    // Removed with everything in it when the test ends.
    let scratch = tempfile::Builder::new()
        .prefix("smoke-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("scratch directory");
    let tmp = scratch.path();
    let exe = tmp.join("smoke");
    let Some(lib) = library_dir() else {
        panic!("libpoolsight_capi.so is not beside the test binary nor in target/<profile>/");
    };
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .arg("-Wall")
        .arg("-Werror")
        .arg("-I")
        .arg(crate_dir.join("include"))
        .arg(crate_dir.join("tests/smoke.c"))
        .arg("-o")
        .arg(&exe)
        .arg("-L")
        .arg(&lib)
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-lpoolsight_capi")
        .status();
    match status {
        Ok(s) => assert!(s.success(), "{cc} could not build tests/smoke.c"),
        Err(e) => {
            eprintln!("skipped: no C compiler ({cc}: {e})");
            return;
        }
    }
    let trace = tmp.join("smoke.pstrace");
    let second = tmp.join("second.pstrace");
    let out = Command::new(&exe)
        .arg(&trace)
        .arg(&second)
        .output()
        .expect("run smoke");
    assert!(
        out.status.success(),
        "smoke failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let t = Trace::open(&trace).expect("the trace opens");
    assert!(t.warnings.is_empty(), "{:?}", t.warnings);
    assert!(t.footer.is_some(), "ps_recorder_finish sealed the file");
    assert_eq!(t.header.rank, Some(0));
    let profile = replay(&t, 0, &ReplayOptions::default());
    let rows = functions(&profile).functions;
    let linear = rows
        .iter()
        .find(|r| r.name == "LinearFunction")
        .expect("a LinearFunction row");
    // The failed 1 GiB request counts too, as Chainer counts requests, and is also shown apart.
    assert_eq!(linear.used_bytes, 1024 + 2048 + (1 << 30));
    assert_eq!(linear.failed_used_bytes, 1 << 30);
    // The call closed by ps_scope_abort is not an occurrence, nor are its 8192 bytes.
    assert_eq!(linear.occurrence, 1);

    // The second recording saw its own pool only: one malloc of 4096 and its free.
    let t2 = Trace::open(&second).expect("the second trace opens");
    let p2 = replay(&t2, 0, &ReplayOptions::default());
    assert_eq!(p2.tree.root().total.mallocs, 1);
    assert_eq!(p2.tree.root().total.used_bytes, 4096);
    assert_eq!(
        profile.tree.root().total.mallocs,
        4,
        "1000, 2000, 1 GiB, 8192"
    );
}
