//! `poolsight diff` (being written).

use std::process::ExitCode;

use clap::Args;

#[derive(Args)]
pub struct DiffArgs {
    /// Base trace(s).
    pub base: Vec<std::path::PathBuf>,
}

pub fn run(_args: DiffArgs, _out: &mut dyn std::io::Write) -> anyhow::Result<ExitCode> {
    anyhow::bail!("diff is not built yet")
}
