//! A C program records through the ABI (compiled here with the system's `cc` against the
//! header and the shared library cargo built), and the analyzer reads what it wrote.

use std::path::{Path, PathBuf};
use std::process::Command;

use poolsight_analyzer::tables::functions::{functions, FunctionRow};
use poolsight_analyzer::{replay, Profile, ReplayOptions, Trace};

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

/// A scratch directory, removed with everything in it when the test ends.
fn scratch(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("scratch directory")
}

/// Builds the C program `src` into `exe` against the header and the shared library cargo
/// built; false (said on stderr) when there is no C compiler, a failed assertion when it does
/// not build.
fn compile(src: &Path, exe: &Path) -> bool {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let Some(lib) = library_dir() else {
        panic!("libpoolsight_capi.so is not beside the test binary nor in target/<profile>/");
    };
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .arg("-Wall")
        .arg("-Werror")
        .arg("-I")
        .arg(crate_dir.join("include"))
        .arg(src)
        .arg("-o")
        .arg(exe)
        .arg("-L")
        .arg(&lib)
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-lpoolsight_capi")
        .status();
    match status {
        Ok(s) => {
            assert!(s.success(), "{cc} could not build {}", src.display());
            true
        }
        Err(e) => {
            eprintln!("skipped: no C compiler ({cc}: {e})");
            false
        }
    }
}

/// Runs a built program; a failed assertion, with its stderr, when it fails.
/// The `functions` table's row of `name` (a test failure when it has none).
fn function_row(profile: &Profile, name: &str) -> FunctionRow {
    functions(profile)
        .functions
        .into_iter()
        .find(|r| r.name == name)
        .unwrap_or_else(|| panic!("a {name} row"))
}

fn succeeds(cmd: &mut Command) {
    let out = cmd.output().expect("run the program");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_c_program_records_a_trace_the_analyzer_reads() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let scratch = scratch("smoke-");
    let tmp = scratch.path();
    let exe = tmp.join("smoke");
    if !compile(&crate_dir.join("tests/smoke.c"), &exe) {
        return;
    }
    let trace = tmp.join("smoke.pstrace");
    let second = tmp.join("second.pstrace");
    succeeds(Command::new(&exe).arg(&trace).arg(&second));

    let t = Trace::open(&trace).expect("the trace opens");
    assert!(t.warnings.is_empty(), "{:?}", t.warnings);
    assert!(t.footer.is_some(), "ps_recorder_finish sealed the file");
    assert_eq!(t.header.rank, Some(0));
    let profile = replay(&t, 0, &ReplayOptions::default());
    let linear = function_row(&profile, "LinearFunction");
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

/// docs/c.md's example, as written, in a `main` of its own (its `#include` lines before it):
/// it builds, runs, and writes the trace it says.
#[test]
fn the_documented_c_example_builds_and_records() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let page = std::fs::read_to_string(crate_dir.join("../docs/c.md")).expect("docs/c.md");
    let block = page
        .split("```c\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("a C block in docs/c.md");
    let (includes, body): (Vec<&str>, Vec<&str>) =
        block.lines().partition(|l| l.starts_with("#include"));
    let program = format!(
        "{}\n#include <stdint.h>\nint main(void) {{\n{}\nreturn 0;\n}}\n",
        includes.join("\n"),
        body.join("\n")
    );
    let scratch = scratch("doc-c-");
    let tmp = scratch.path();
    let src = tmp.join("example.c");
    std::fs::write(&src, program).expect("write example.c");
    let exe = tmp.join("example");
    if !compile(&src, &exe) {
        return;
    }
    succeeds(Command::new(&exe).current_dir(tmp));
    let t = Trace::open(tmp.join("run.pstrace")).expect("the example's trace opens");
    assert!(t.footer.is_some(), "ps_recorder_finish sealed the file");
    let profile = replay(&t, 0, &ReplayOptions::default());
    let linear = function_row(&profile, "LinearFunction");
    // 1000 bytes asked, 1024 used: the pool rounds to 512-byte units, as CuPy's does.
    assert_eq!((linear.used_bytes, linear.occurrence), (1024, 1));
}
