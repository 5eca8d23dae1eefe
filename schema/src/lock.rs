//! Who may use a trace file at the same time: the locking rules every poolsight process keeps,
//! so that no recorder nor reader ever gets a SIGBUS from another's work on the same file.
//!
//! A file mapped into memory raises SIGBUS in every process that touches a page past the
//! file's end. Two things would cut a file under a mapping: a second recording truncating the
//! file of a first (the first process dies), and the recorder trimming its preallocated tail
//! when it finishes while a reader still maps that tail (the reader dies). Both are prevented
//! by advisory locks on two bytes of the file, which nothing ever writes through a lock:
//!
//! | byte | who | lock |
//! |---|---|---|
//! | [`RECORDING_BYTE`] | the recorder, from create to finish | exclusive |
//! | [`READING_BYTE`] | every reader, while it maps the file | shared |
//! | [`READING_BYTE`] | the recorder, for the moment it trims | exclusive, only if free |
//!
//! A second recording on a file whose recording byte is locked is refused, naming the holder
//! (the header's `pid`). A recorder trims only while it holds the reading byte exclusively, so
//! a reader that mapped the file before the trim keeps every page of it; when a reader holds
//! it, the file keeps its preallocated tail (zeros past the footer's `data_end`, which readers
//! skip as they skip the tail of a live file).
//!
//! On Linux these are open-file-description locks (`F_OFD_SETLK`): they belong to one open of
//! the file, so two recordings in one process exclude each other as two processes do, and they
//! go away when the process dies, so a killed recorder leaves no stale lock. Elsewhere the
//! recording byte is an `flock` of the whole file and readers take no lock (the trim then does
//! not wait for them). A file system that supports no locks at all is used without them.

use std::fs::File;
use std::io;

/// The byte a recorder locks exclusively while it records.
pub const RECORDING_BYTE: u64 = 0;
/// The byte readers lock shared while they map the file, and a finishing recorder exclusively
/// while it trims.
pub const READING_BYTE: u64 = 1;

/// Whether a lock could be taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    /// Taken (or the file system has no locks, which is the same to the caller).
    Yes,
    /// Another open of the file holds a conflicting lock.
    Busy,
}

#[cfg(target_os = "linux")]
mod imp {
    use super::*;
    use std::os::fd::AsRawFd;

    fn ofd(file: &File, cmd: libc::c_int, kind: libc::c_int, byte: u64) -> io::Result<libc::flock> {
        // SAFETY: all-zero is a valid `flock`; the fields the call reads are set below.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = kind as libc::c_short;
        fl.l_whence = libc::SEEK_SET as libc::c_short;
        fl.l_start = byte as libc::off_t;
        fl.l_len = 1;
        // OFD locks want l_pid 0.
        fl.l_pid = 0;
        loop {
            // SAFETY: fcntl with a lock command reads and writes the `flock` we own.
            let rc = unsafe { libc::fcntl(file.as_raw_fd(), cmd, &mut fl) };
            if rc == 0 {
                return Ok(fl);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    fn taken(r: io::Result<libc::flock>) -> io::Result<Taken> {
        match r {
            Ok(_) => Ok(Taken::Yes),
            Err(e) if is_busy(&e) => Ok(Taken::Busy),
            Err(e) if unsupported(&e) => Ok(Taken::Yes),
            Err(e) => Err(e),
        }
    }

    pub fn try_exclusive(file: &File, byte: u64) -> io::Result<Taken> {
        taken(ofd(file, libc::F_OFD_SETLK, libc::F_WRLCK, byte))
    }

    pub fn try_shared(file: &File, byte: u64) -> io::Result<Taken> {
        taken(ofd(file, libc::F_OFD_SETLK, libc::F_RDLCK, byte))
    }

    pub fn unlock(file: &File, byte: u64) {
        let _ = ofd(file, libc::F_OFD_SETLK, libc::F_UNLCK, byte);
    }

    pub fn held_by_other(file: &File, byte: u64) -> bool {
        // F_OFD_GETLK answers F_UNLCK when a write lock could be taken, that is, when no other
        // open of the file holds any lock on the byte.
        match ofd(file, libc::F_OFD_GETLK, libc::F_WRLCK, byte) {
            Ok(fl) => fl.l_type != libc::F_UNLCK as libc::c_short,
            Err(_) => false,
        }
    }

    pub const READERS_LOCK: bool = true;
}

#[cfg(all(unix, not(target_os = "linux")))]
mod imp {
    use super::*;
    use std::os::fd::AsRawFd;

    fn flock(file: &File, op: libc::c_int) -> io::Result<Taken> {
        // SAFETY: plain syscall on a descriptor we own.
        let rc = unsafe { libc::flock(file.as_raw_fd(), op | libc::LOCK_NB) };
        if rc == 0 {
            return Ok(Taken::Yes);
        }
        let e = io::Error::last_os_error();
        if is_busy(&e) {
            Ok(Taken::Busy)
        } else if unsupported(&e) {
            Ok(Taken::Yes)
        } else {
            Err(e)
        }
    }

    pub fn try_exclusive(file: &File, byte: u64) -> io::Result<Taken> {
        if byte == RECORDING_BYTE {
            flock(file, libc::LOCK_EX)
        } else {
            Ok(Taken::Yes)
        }
    }

    pub fn try_shared(_file: &File, _byte: u64) -> io::Result<Taken> {
        Ok(Taken::Yes)
    }

    pub fn unlock(file: &File, byte: u64) {
        if byte == RECORDING_BYTE {
            // SAFETY: plain syscall on a descriptor we own.
            unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_UN) };
        }
    }

    pub fn held_by_other(file: &File, byte: u64) -> bool {
        if byte != RECORDING_BYTE {
            return false;
        }
        match flock(file, libc::LOCK_SH) {
            Ok(Taken::Busy) => true,
            Ok(Taken::Yes) => {
                unlock(file, byte);
                false
            }
            Err(_) => false,
        }
    }

    pub const READERS_LOCK: bool = false;
}

fn is_busy(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES))
        || e.kind() == io::ErrorKind::WouldBlock
}

/// Errors of a file system that keeps no locks (some network and FUSE file systems).
fn unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOLCK) | Some(libc::EINVAL) | Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS)
    )
}

/// Takes the recording lock of `file` (opened for writing), or says another recording holds it.
pub fn lock_recording(file: &File) -> io::Result<Taken> {
    imp::try_exclusive(file, RECORDING_BYTE)
}

/// Gives the recording lock back: the recording is finished (sealed), and the file may be
/// replaced or read as any finished trace.
pub fn unlock_recording(file: &File) {
    imp::unlock(file, RECORDING_BYTE)
}

/// Whether another open of the file (in this process or another) is recording to it.
pub fn is_being_recorded(file: &File) -> bool {
    imp::held_by_other(file, RECORDING_BYTE)
}

/// Takes a reader's shared lock on `file`, waiting up to `patience` while a recorder trims it
/// (a moment); `Busy` if it is still held then. Hold it for as long as the file is mapped.
pub fn lock_reading(file: &File, patience: std::time::Duration) -> io::Result<Taken> {
    let start = std::time::Instant::now();
    loop {
        match imp::try_shared(file, READING_BYTE)? {
            Taken::Yes => return Ok(Taken::Yes),
            Taken::Busy if start.elapsed() >= patience => return Ok(Taken::Busy),
            Taken::Busy => std::thread::sleep(std::time::Duration::from_millis(2)),
        }
    }
}

/// The finishing recorder's try for the reading byte: `Yes` when no reader maps the file, and
/// then no reader can start mapping it until [`end_trim`].
pub fn begin_trim(file: &File) -> io::Result<Taken> {
    imp::try_exclusive(file, READING_BYTE)
}

/// Lets readers in again after [`begin_trim`].
pub fn end_trim(file: &File) {
    imp::unlock(file, READING_BYTE)
}

/// Whether readers take the reading lock on this platform (the trim waits for them).
pub const READERS_LOCK: bool = imp::READERS_LOCK;

/// The process id in a trace's header, from the file's first bytes; `None` when they are not
/// (yet) a poolsight header. What names the holder of a locked trace.
pub fn header_pid(bytes: &[u8]) -> Option<u32> {
    let prelude = crate::Prelude::decode(bytes).ok()?;
    let end = (prelude.data_offset as usize).min(bytes.len());
    let header = bytes.get(crate::PRELUDE_LEN..end)?;
    crate::fb::size_prefixed_root_as_header(header)
        .ok()
        .map(|h| h.pid())
        .filter(|&pid| pid != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch() -> (std::path::PathBuf, File) {
        let path = std::env::temp_dir().join(format!(
            "poolsight-lock-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let f = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        (path, f)
    }

    /// Two opens of one file in one process exclude each other, and closing the first frees
    /// the lock.
    #[test]
    fn recording_lock_is_per_open_file() {
        let (path, a) = scratch();
        let b = File::options().read(true).write(true).open(&path).unwrap();
        assert_eq!(lock_recording(&a).unwrap(), Taken::Yes);
        assert!(is_being_recorded(&b));
        assert_eq!(lock_recording(&b).unwrap(), Taken::Busy);
        drop(a);
        assert!(!is_being_recorded(&b));
        assert_eq!(lock_recording(&b).unwrap(), Taken::Yes);
        std::fs::remove_file(path).unwrap();
    }

    /// A reader keeps the trim out; once it is gone the trim goes ahead and keeps readers
    /// out until it ends.
    #[cfg(target_os = "linux")]
    #[test]
    fn trim_waits_for_readers() {
        let (path, recorder) = scratch();
        let reader = File::open(&path).unwrap();
        let patience = std::time::Duration::from_millis(20);
        assert_eq!(lock_reading(&reader, patience).unwrap(), Taken::Yes);
        assert_eq!(begin_trim(&recorder).unwrap(), Taken::Busy);
        drop(reader);
        assert_eq!(begin_trim(&recorder).unwrap(), Taken::Yes);
        let late = File::open(&path).unwrap();
        assert_eq!(lock_reading(&late, patience).unwrap(), Taken::Busy);
        end_trim(&recorder);
        assert_eq!(lock_reading(&late, patience).unwrap(), Taken::Yes);
        std::fs::remove_file(path).unwrap();
    }
}
