//! `poolsight predict`: a Python command run on fake CUDA tensors (`poolsight.torch.fake_cuda`)
//! and what it would do on a GPU: its active and reserved peaks, whether it fits, the first
//! request that would not, the smallest capacity, what was live at the peak.
//!
//! Running the command is Python's (`python -m poolsight.predict`, which this spawns with the
//! interpreter of `POOLSIGHT_PYTHON`, else `python3`; the Python package's `poolsight` command
//! sets it to its own); reading the trace it wrote is `poolsight::analyzer::predict`'s, which the
//! Python module calls too.

use std::path::PathBuf;
use std::process::Command;

use anyhow::Context;
use clap::Args;

/// `poolsight predict [--gpu NAME | --capacity BYTES] [-o TRACE] -- COMMAND...`: every
/// option is the Python module's (`poolsight predict --help` prints them).
#[derive(Args)]
#[command(disable_help_flag = true)]
pub struct PredictArgs {
    /// The options and the command, as `python -m poolsight.predict` takes them.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "ARGS"
    )]
    pub args: Vec<String>,
}

/// Runs `python -m poolsight.predict ARGS` and passes its exit code on (0 fits, 1 does not,
/// 2 bad input or the command failed).
pub fn run(args: PredictArgs) -> anyhow::Result<u8> {
    let python = std::env::var_os("POOLSIGHT_PYTHON").unwrap_or_else(|| "python3".into());
    // A Python without the package would exit 1 ("does not fit"): asked first.
    let found = Command::new(&python)
        .args(["-c", "import poolsight.predict"])
        .stderr(std::process::Stdio::null())
        .status();
    anyhow::ensure!(
        found.is_ok_and(|s| s.success()),
        "predict runs a Python that has the poolsight package (pip install poolsight); {} has \
         not (set POOLSIGHT_PYTHON to the interpreter of your training environment)",
        PathBuf::from(&python).display()
    );
    let status = Command::new(&python)
        .args(["-m", "poolsight.predict"])
        .args(&args.args)
        .status()
        .with_context(|| {
            format!(
                "predict runs Python ({}, set POOLSIGHT_PYTHON to choose another) with the \
                 poolsight package installed, and it did not start",
                PathBuf::from(&python).display()
            )
        })?;
    Ok(match status.code() {
        Some(c) if (0..=2).contains(&c) => c as u8,
        _ => 2,
    })
}
