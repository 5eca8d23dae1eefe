//! Packing when a recording finishes (`FinishPacked::finish_packed`): the packed copy replays
//! to the live file's figures, the live file is kept whole, and a copy that cannot be written
//! is an error naming the live file, which still reads in full.

use crate::support::scratch;

use std::path::{Path, PathBuf};

use poolsight::analyzer::export::pack::{PackError, PackOptions};
use poolsight::analyzer::{replay, ReplayOptions, Trace};
use poolsight::recorder::{MemKind, MemRecord, Phase, Recorder, RecorderConfig};
use poolsight::{FinishError, FinishPacked};

/// This process's scratch directory, removed when the tests end.
fn dir() -> &'static Path {
    scratch::process_dir()
}

/// A few training steps on two threads: scopes, malloc/free pairs, epochs.
fn record(path: &PathBuf) -> Recorder {
    let rec = Recorder::create(
        path,
        RecorderConfig {
            chunk_size: 4096,
            ..Default::default()
        },
    )
    .unwrap();
    let work = |h: &poolsight::recorder::Handle, t: u64| {
        for step in 0..300u64 {
            let _s = h.scope("step");
            let _f = h.function("LinearFunction", Phase::Forward);
            let stack = h.current_stack();
            for i in 0..4u64 {
                let ptr = 0x7000_0000 + (t << 32) + ((step * 4 + i) << 9);
                let ev = |kind| MemRecord {
                    kind,
                    device: 0,
                    stream: 0,
                    ptr,
                    bytes: 512 * (i + 1),
                    stack,
                    pmem: 0,
                };
                h.record_mem(ev(MemKind::MallocPost));
                h.record_mem(ev(MemKind::FreePost));
            }
        }
    };
    let h = rec.handle();
    h.epoch_begin(0);
    std::thread::scope(|s| {
        s.spawn(|| work(&rec.handle(), 1));
        work(&h, 0);
    });
    h.epoch_end(0);
    rec
}

/// The trace at `path`, which must read without a warning.
fn open_clean(path: &PathBuf) -> Trace {
    let t = Trace::open(path).unwrap();
    assert!(
        t.warnings.is_empty(),
        "{}: {:?}",
        path.display(),
        t.warnings
    );
    t
}

/// Every figure of the replay, the file's name left out.
fn figures(path: &PathBuf) -> String {
    let mut p = replay(&open_clean(path), 0, &ReplayOptions::default());
    p.sources[0].path.clear();
    format!("{p:#?}")
}

/// (events, mallocs, frees, sealed) of a trace.
fn counts(path: &PathBuf) -> (u64, u64, u64, bool) {
    let s = &replay(&open_clean(path), 0, &ReplayOptions::default()).sources[0];
    (s.events, s.pool.mallocs, s.pool.frees, s.sealed)
}

#[test]
fn the_packed_copy_replays_as_the_live_file() {
    let (live, out) = (dir().join("run.pstrace"), dir().join("run.packed.pstrace"));
    let done = record(&live)
        .finish_packed(&out, &PackOptions::default())
        .unwrap();
    assert!(done.warnings.is_empty(), "{:?}", done.warnings);
    assert_eq!(done.packed.events, done.summary.events);
    assert!(done.summary.events >= 2 * 300 * 10, "{:?}", done.summary);
    assert_eq!(
        done.summary.file_bytes,
        std::fs::metadata(&live).unwrap().len()
    );
    assert_eq!(
        done.packed.bytes_out,
        std::fs::metadata(&out).unwrap().len()
    );
    assert!(
        done.packed.bytes_out * 3 < done.summary.file_bytes,
        "packing made {} bytes of {}",
        done.packed.bytes_out,
        done.summary.file_bytes
    );
    assert!(Trace::open(&out).unwrap().header.packed);
    assert_eq!(figures(&live), figures(&out));
}

#[test]
fn a_copy_that_cannot_be_written_leaves_the_live_file_whole() {
    // A folder of its own, so that what is left in it can be listed.
    let d = scratch::dir();
    let live = d.join("kept.pstrace");
    // Packing onto the live file itself.
    let err = record(&live)
        .finish_packed(&live, &PackOptions::default())
        .unwrap_err();
    assert!(
        matches!(&err, FinishError::Pack { live: l, source: PackError::SameFile { .. } } if *l == live),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("is finished and complete"),
        "{err}"
    );
    let whole = (2 * 300 * 4 * 2 + 2 * 300 * 2 + 2, 2400, 2400, true);
    assert_eq!(counts(&live), whole);
    // Into a folder that does not exist.
    let live2 = d.join("kept2.pstrace");
    let err = record(&live2)
        .finish_packed(d.join("no/such/dir/x.pstrace"), &PackOptions::default())
        .unwrap_err();
    assert!(
        matches!(
            &err,
            FinishError::Pack {
                source: PackError::Io { .. },
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(counts(&live2), whole);
    // Onto a folder: the copy is written whole, then cannot take the folder's name; it must
    // not be left behind.
    let live3 = d.join("kept3.pstrace");
    let folder = d.join("a-folder.pstrace");
    std::fs::create_dir_all(&folder).unwrap();
    let err = record(&live3)
        .finish_packed(&folder, &PackOptions::default())
        .unwrap_err();
    assert!(matches!(&err, FinishError::Pack { .. }), "{err:?}");
    let mut left: Vec<String> = std::fs::read_dir(&*d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(
        left,
        [
            "a-folder.pstrace",
            "kept.pstrace",
            "kept2.pstrace",
            "kept3.pstrace"
        ],
        "no half-written copy is left behind"
    );
    assert_eq!(counts(&live3), whole);
}
