//! CuPy's `DebugPrintHook`: one JSON line per malloc, alloc and free.
//!
//! The output is byte-for-byte CuPy's (same keys, same order, `pmem_id` as a hex string), so
//! scripts written against CuPy's debug output keep working.

use std::fmt::Write as _;
use std::io::Write;
use std::sync::Mutex;

use super::{AllocPost, FreeInfo, MallocPost, MemoryHook};

/// Prints the arguments of `malloc_postprocess`, `alloc_postprocess` and `free_postprocess`
/// as JSON lines, like `cupy.cuda.memory_hooks.DebugPrintHook`:
///
/// ```text
/// {"hook":"alloc","device_id":0,"mem_size":512,"mem_ptr":150496608256}
/// {"hook":"malloc","device_id":0,"size":24,"mem_size":512,"mem_ptr":150496608256,"pmem_id":"0x1"}
/// {"hook":"free","device_id":0,"mem_size":512,"mem_ptr":150496608256,"pmem_id":"0x1"}
/// ```
///
/// Writing is best-effort: an I/O error is ignored rather than allowed to break the run being
/// debugged.
pub struct DebugPrintHook {
    out: Mutex<Box<dyn Write + Send>>,
    flush: bool,
}

impl DebugPrintHook {
    /// Prints to standard output and flushes after each line, as CuPy does by default.
    pub fn new() -> Self {
        Self::with_writer(Box::new(std::io::stdout()))
    }

    /// Prints to `out` (a file, a buffer in a test...), flushing after each line.
    pub fn with_writer(out: Box<dyn Write + Send>) -> Self {
        DebugPrintHook {
            out: Mutex::new(out),
            flush: true,
        }
    }

    /// Whether to flush after each line (CuPy's `flush` argument); turning it off makes the
    /// hook cheaper when the output goes to a file read after the run.
    pub fn flush(mut self, flush: bool) -> Self {
        self.flush = flush;
        self
    }

    fn print(&self, line: &str) {
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        let _ = out.write_all(line.as_bytes());
        if self.flush {
            let _ = out.flush();
        }
    }
}

impl Default for DebugPrintHook {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for DebugPrintHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DebugPrintHook")
            .field("flush", &self.flush)
            .finish_non_exhaustive()
    }
}

impl MemoryHook for DebugPrintHook {
    fn name(&self) -> &str {
        "DebugPrintHook"
    }

    fn alloc_postprocess(&self, i: &AllocPost) {
        let mut s = String::with_capacity(96);
        let _ = writeln!(
            s,
            r#"{{"hook":"alloc","device_id":{},"mem_size":{},"mem_ptr":{}}}"#,
            i.device_id, i.mem_size, i.mem_ptr
        );
        self.print(&s);
    }

    fn malloc_postprocess(&self, i: &MallocPost) {
        let mut s = String::with_capacity(128);
        // `{:#x}` prints 0 as "0x0", like Python's hex().
        let _ = writeln!(
            s,
            r#"{{"hook":"malloc","device_id":{},"size":{},"mem_size":{},"mem_ptr":{},"pmem_id":"{:#x}"}}"#,
            i.device_id, i.size, i.mem_size, i.mem_ptr, i.pmem_id
        );
        self.print(&s);
    }

    fn free_postprocess(&self, i: &FreeInfo) {
        let mut s = String::with_capacity(128);
        let _ = writeln!(
            s,
            r#"{{"hook":"free","device_id":{},"mem_size":{},"mem_ptr":{},"pmem_id":"{:#x}"}}"#,
            i.device_id, i.mem_size, i.mem_ptr, i.pmem_id
        );
        self.print(&s);
    }
}
