//! The `poolsight` binary: the CLI lives in the library ([`poolsight::cli`]), shared with the
//! Python package's `poolsight` command.

use std::process::ExitCode;

use poolsight::recorder::CountingAllocator;

// Exact heap bytes for the demo's per-epoch CPU figures, as tracemalloc gives Python.
#[global_allocator]
static ALLOC: CountingAllocator = CountingAllocator::new();

fn main() -> ExitCode {
    poolsight::cli::main()
}
