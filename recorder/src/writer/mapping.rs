//! The trace file's mapping: how long it is made ([`map_within`]), and the address space it
//! gives back once the recording is over ([`Mapping::give_back_past`]).
//!
//! A recording maps its file at its size limit (a terabyte by default) and never moves it, so
//! that threads keep raw pointers into it. A finished recording keeps only the pages its file
//! holds: under a limit on the process's address space (`ulimit -v`, as clusters set), what
//! it gives back is there for the next recording and for the training. Without such a limit
//! the gap it leaves is a little short of a terabyte, so it cannot hold the next recording's
//! mapping: with about 128 recordings kept referenced at once, the next one gets a share.

use std::fs::File;
use std::path::Path;
use std::sync::Mutex;

use memmap2::{MmapOptions, MmapRaw};

use super::file::{size_text, SizeCap};

/// The least address space a recording maps when `max_bytes` of it cannot be had.
const MIN_MAPPED: u64 = 64 << 20;

/// A file's mapping: its base never moves; only its length shrinks, once, at the end.
pub(super) struct Mapping {
    base: usize,
    map: Mutex<MmapRaw>,
}

impl Mapping {
    fn new(map: MmapRaw) -> Mapping {
        Mapping {
            base: map.as_mut_ptr() as usize,
            map: Mutex::new(map),
        }
    }

    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.base as *mut u8
    }

    pub fn flush_range(&self, offset: usize, len: usize) -> std::io::Result<()> {
        self.lock().flush_range(offset, len)
    }

    /// Gives back the address space past the first `keep` bytes (rounded up to whole pages),
    /// in place (`mremap`): the base stays where it is. Only for a recording that is over,
    /// whose file ends at `keep`: nothing writes past the end of its file (a store there would
    /// raise SIGBUS anyway), and the preparer only asks the kernel to fault pages in, which in
    /// a range no longer mapped fails without effect. Where the length cannot change (not
    /// Linux, or the kernel refused), the mapping stays as it was.
    pub fn give_back_past(&self, keep: u64) {
        let keep = keep.max(1).next_multiple_of(crate::cpu::page_size()) as usize;
        let mut map = self.lock();
        if keep >= map.len() {
            return;
        }
        #[cfg(target_os = "linux")]
        {
            // SAFETY: shrinking in place (no move): the base stays valid, and nothing reads
            // or writes past `keep` any more (see above).
            let _ = unsafe { map.remap(keep, memmap2::RemapOptions::new()) };
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MmapRaw> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Maps `max_bytes` of `file`. When the process has not that much address space left (ENOMEM:
/// `ulimit -v`, or many recordings kept, each holding part of it until it is let go; EINVAL:
/// a length the kernel or a tool running the process, such as valgrind, will not map), the
/// mapping takes an eighth of the largest power-of-two fraction of `max_bytes` that could be
/// had (at least [`MIN_MAPPED`] and `first_len`), so that the training keeps the rest for its
/// own memory: the recording stops at that size, as this says on stderr. Returns the mapping,
/// its length and what caps it.
pub(super) fn map_within(
    file: &File,
    path: &Path,
    max_bytes: u64,
    cap: SizeCap,
    first_len: u64,
) -> std::io::Result<(Mapping, u64, SizeCap)> {
    let map = |len: u64| MmapOptions::new().len(len as usize).map_raw(file);
    let (m, len) = fit_mapping(max_bytes, MIN_MAPPED.max(first_len), map)?;
    let m = Mapping::new(m);
    if len == max_bytes {
        return Ok((m, len, cap));
    }
    eprintln!(
        "poolsight: recording to {}: the process has little address space left (`ulimit -v`, \
         valgrind, or many recordings kept: each holds part of it until it is let go), so the \
         trace is mapped at {}, not at its size limit of {}, and stops at that size",
        path.display(),
        size_text(len),
        size_text(max_bytes)
    );
    Ok((m, len, SizeCap::AddressSpace))
}

/// [`map_within`]'s search, over any `map`: `max_bytes` when it maps. Else the length is
/// halved while the mapping fails for want of address space (ENOMEM, EINVAL) and stays at
/// least `floor`, and an eighth of the first length that maps is taken (at least `floor`).
/// Returns the mapping and its length, or the error of the last try.
fn fit_mapping<M>(
    max_bytes: u64,
    floor: u64,
    mut map: impl FnMut(u64) -> std::io::Result<M>,
) -> std::io::Result<(M, u64)> {
    let mut fits = max_bytes;
    loop {
        match map(fits) {
            Ok(m) if fits == max_bytes => return Ok((m, fits)),
            // Found how much fits: let it go, and take a share of it.
            Ok(_) => break,
            Err(e) if no_room(&e) && fits / 2 >= floor => fits /= 2,
            Err(e) => return Err(e),
        }
    }
    let len = (fits / 8).max(floor);
    Ok((map(len)?, len))
}

/// Whether a mapping failed for want of address space rather than for what the file is.
fn no_room(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOMEM | libc::EINVAL))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::{cell::RefCell, rc::Rc};

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    /// A mapping that fails with `errno` above `room` bytes, and the lengths it was asked for.
    fn room(
        room: u64,
        errno: i32,
    ) -> (
        impl FnMut(u64) -> std::io::Result<u64>,
        Rc<RefCell<Vec<u64>>>,
    ) {
        let asked = Rc::new(RefCell::new(Vec::new()));
        let log = asked.clone();
        let map = move |len: u64| {
            log.borrow_mut().push(len);
            if len > room {
                Err(std::io::Error::from_raw_os_error(errno))
            } else {
                Ok(len)
            }
        };
        (map, asked)
    }

    #[test]
    fn the_size_limit_is_mapped_when_it_fits() {
        let (map, asked) = room(u64::MAX, libc::ENOMEM);
        assert_eq!(fit_mapping(1 << 40, 64 * MIB, map).unwrap().1, 1 << 40);
        assert_eq!(*asked.borrow(), [1 << 40]);
    }

    #[test]
    fn a_length_refused_as_invalid_is_halved_like_one_refused_for_memory() {
        for errno in [libc::ENOMEM, libc::EINVAL] {
            let (map, asked) = room(5 * GIB, errno);
            let (m, len) = fit_mapping(1 << 40, 64 * MIB, map).unwrap();
            // 4 GiB is the first power-of-two fraction that maps; an eighth of it is kept.
            assert_eq!((m, len), (512 * MIB, 512 * MIB));
            assert_eq!(asked.borrow().last(), Some(&(512 * MIB)));
            assert_eq!(asked.borrow()[asked.borrow().len() - 2], 4 * GIB);
        }
    }

    #[test]
    fn the_share_is_never_under_the_floor() {
        let (map, _) = room(100 * MIB, libc::EINVAL);
        assert_eq!(fit_mapping(1 << 40, 64 * MIB, map).unwrap().1, 64 * MIB);
    }

    #[test]
    fn no_room_even_at_the_floor_is_the_last_error() {
        let (map, asked) = room(32 * MIB, libc::ENOMEM);
        let e = fit_mapping(1 << 40, 64 * MIB, map).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOMEM));
        assert_eq!(asked.borrow().last(), Some(&(64 * MIB)));
    }

    #[test]
    fn another_error_is_not_retried() {
        let (map, asked) = room(0, libc::EACCES);
        let e = fit_mapping(1 << 40, 64 * MIB, map).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EACCES));
        assert_eq!(asked.borrow().len(), 1);
    }
}
