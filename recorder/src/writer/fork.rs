//! A process forked while recording (a PyTorch `DataLoader`'s workers, `multiprocessing` with
//! the fork start method, `os.fork()`) must not write to its parent's trace: the mapping is
//! shared with the parent, but the counters that hand out its regions are the child's own
//! copies, so the child's writes would land on the parent's chunks.
//!
//! Each recorder notes the fork generation it was created in. A `pthread_atfork` handler
//! (installed when the first recorder is created) counts forks in the child and lets go of the
//! forking thread's writers without sealing them (their chunks are the parent's). From then on
//! every way into a parent's recorder — its writers, its definitions, `finish` — drops what the
//! child records; recorders the child creates itself record as any other.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;

/// Forks this process has been through (counted in each child).
static FORKS: AtomicU64 = AtomicU64::new(0);
static HANDLER: Once = Once::new();

/// The fork generation now, with the handler that counts forks installed.
pub(crate) fn generation() -> u64 {
    HANDLER.call_once(|| {
        // SAFETY: registers a plain function; registration failing (ENOMEM) leaves forked
        // children unguarded, as before, and is not worth failing a recording for.
        #[cfg(unix)]
        unsafe {
            libc::pthread_atfork(None, None, Some(in_child));
        }
    });
    FORKS.load(Ordering::Relaxed)
}

/// Whether this process was forked from the one that created a recorder of `generation`.
#[inline]
pub(crate) fn forked_since(generation: u64) -> bool {
    FORKS.load(Ordering::Relaxed) != generation
}

/// Runs in the child of a fork, on its one thread, before `fork` returns there.
#[cfg(unix)]
extern "C" fn in_child() {
    FORKS.fetch_add(1, Ordering::Relaxed);
    super::thread::abandon_writers();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_is_a_later_generation_and_its_parent_is_not() {
        let before = generation();
        assert!(!forked_since(before));
        // SAFETY: the child only reads atomics and exits with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let code = if forked_since(before) && generation() == before + 1 {
                0
            } else {
                1
            };
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for the child made above.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "{status}"
        );
        assert!(!forked_since(before));
    }
}
