//! The reader against damaged and hostile files: one bit flipped at every byte of a trace, and
//! headers crafted to make a careless reader loop, overflow or allocate. Every case finishes
//! fast, and every change to what a trace says is caught (an error or a warning) or harmless.

use crate::support::scratch;

use std::path::Path;
use std::time::{Duration, Instant};

use poolsight::analyzer::export::pack::{pack, PackOptions};
use poolsight::analyzer::load::{self, FrameFilter, LoadOptions};
use poolsight::analyzer::tables::info;
use poolsight::analyzer::tables::{Report, ReportOptions};
use poolsight::analyzer::{replay, ReadError, Trace};
use poolsight::recorder::{
    Frame, FrameKind, MarkKind, MemKind, MemRecord, Phase, Recorder, RecorderConfig,
};
use poolsight::schema::fb;
use poolsight::schema::flatbuffers::FlatBufferBuilder;
use poolsight::schema::{header_crc, header_region, Prelude, HEADER_CRC_LEN, PRELUDE_LEN};

fn tmp(name: &str) -> scratch::Scratch {
    scratch::file(name)
}

/// A few KB: one chunk of each kind (memory, scope, mark, definitions), the event chunks nearly
/// full, and the footer.
fn small_trace(path: &Path) -> Vec<u8> {
    let rec = Recorder::create(
        path,
        RecorderConfig {
            chunk_size: 4096,
            calibration: Duration::from_millis(1),
            command_line: Some(vec!["crafted".into()]),
            ..RecorderConfig::default()
        },
    )
    .unwrap();
    let h = rec.handle();
    let frame = h.intern_frame(&Frame {
        kind: FrameKind::Function,
        phase: Phase::Forward,
        file: "model.py".into(),
        line: 12,
        name: "Linear".into(),
    });
    let stack = h.intern_stack(0, frame);
    h.record_mark(MarkKind::EpochBegin, 0, 100, 0);
    for i in 0..60u64 {
        let start = poolsight::recorder::writer::now_ticks();
        for kind in [MemKind::MallocPre, MemKind::MallocPost] {
            h.record_mem(MemRecord {
                kind,
                device: 0,
                stream: 0,
                ptr: 0x1000 * (i + 1),
                bytes: 512 * (i + 1),
                stack,
                pmem: i as u32 + 1,
            });
        }
        for _ in 0..4 {
            h.record_scope(stack, start);
        }
    }
    h.record_mark(MarkKind::EpochEnd, 0, 200, 300);
    rec.finish().unwrap();
    std::fs::read(path).unwrap()
}

/// What a trace says: every report, and the info record without its path.
fn outcome(t: &Trace) -> (Report, String) {
    let p = replay(t, 0, &Default::default());
    let mut r = Report::compute(&p, &ReportOptions::default());
    r.summary.traces.clear();
    let mut i = info::info(t);
    info::add_replay(&mut i, &p);
    i.path.clear();
    (r, serde_json::to_string(&i).unwrap())
}

#[test]
fn no_single_bit_flip_changes_a_report_silently() {
    let base_path = tmp("flip-base.pstrace");
    let bytes = small_trace(&base_path);
    flip_every_byte(&base_path, &bytes, "flip.pstrace");
}

#[test]
fn no_single_bit_flip_in_a_packed_trace_changes_a_report_silently() {
    let live = tmp("flip-live.pstrace");
    small_trace(&live);
    let packed = tmp("flip-packed.pstrace");
    pack(
        &Trace::open(&live).unwrap(),
        &packed,
        &PackOptions::default(),
    )
    .unwrap();
    let bytes = std::fs::read(&packed).unwrap();
    flip_every_byte(&packed, &bytes, "flip-packed-copy.pstrace");
}

#[test]
fn every_cut_of_a_packed_trace_reads_without_a_panic() {
    let live = tmp("cut-live.pstrace");
    small_trace(&live);
    let packed = tmp("cut-packed.pstrace");
    pack(
        &Trace::open(&live).unwrap(),
        &packed,
        &PackOptions::default(),
    )
    .unwrap();
    let bytes = std::fs::read(&packed).unwrap();
    let full = outcome(&Trace::open(&packed).unwrap());
    let path = tmp("cut.pstrace");
    for len in 0..bytes.len() {
        std::fs::write(&path, &bytes[..len]).unwrap();
        if let Ok(t) = Trace::open(&path) {
            let got = outcome(&t);
            assert!(
                !t.warnings.is_empty() || got == full,
                "a packed trace cut to {len} bytes read without a warning"
            );
        }
    }
}

/// Flips one bit of every byte of the trace `bytes` (read from `base_path`): each flip is
/// refused, warned about, or lands in a byte no reader uses.
fn flip_every_byte(base_path: &Path, bytes: &[u8], scratch: &str) {
    let base = Trace::open(base_path).unwrap();
    assert!(base.warnings.is_empty(), "{:?}", base.warnings);
    assert!(base.footer.is_some());
    let baseline = outcome(&base);
    // Bytes no reader looks at: the reserved tail of each sealed chunk past its `used` bytes.
    let mut unused = vec![false; bytes.len()];
    for c in &base.chunks {
        let (at, len) = (c.offset as usize, c.len as usize);
        let used = fb::size_prefixed_root_as_chunk(&bytes[at..at + len])
            .unwrap()
            .meta()
            .used() as usize;
        unused[at + 4 + used..at + len].fill(true);
    }
    drop(base);

    let path = tmp(scratch);
    let (mut errors, mut warned, mut identical) = (0usize, 0usize, 0usize);
    let mut silent = Vec::new();
    let started = Instant::now();
    for at in 0..bytes.len() {
        let bit = at % 8;
        let mut flipped = bytes.to_vec();
        flipped[at] ^= 1 << bit;
        std::fs::write(&path, &flipped).unwrap();
        assert_deferred_checks_agree(&path, at, bit);
        let case = Instant::now();
        match Trace::open(&path) {
            Err(_) => errors += 1,
            Ok(t) if !t.warnings.is_empty() => {
                // A warned trace is still analyzed to the end without a panic.
                let _ = outcome(&t);
                warned += 1;
            }
            Ok(t) => {
                if outcome(&t) == baseline {
                    assert!(
                        unused[at],
                        "flipping bit {bit} of byte {at}, which a reader uses, went unnoticed"
                    );
                    identical += 1;
                } else {
                    silent.push((at, bit));
                }
            }
        }
        assert!(
            case.elapsed() < Duration::from_secs(5),
            "flipping bit {bit} of byte {at} took {:?}",
            case.elapsed()
        );
    }
    eprintln!(
        "bit-flip sweep: {} bytes ({} unused), {errors} refused, {warned} warned, {identical} identical, {} silent, in {:.2?}",
        bytes.len(),
        unused.iter().filter(|&&u| u).count(),
        silent.len(),
        started.elapsed()
    );
    assert!(
        silent.is_empty(),
        "{} flips changed the report without a warning or an error (byte, bit): {:?}",
        silent.len(),
        &silent[..silent.len().min(20)]
    );
}

/// What `poolsight report` loads (checksums checked as the replay reads each chunk, the file
/// opened again if one fails) is what opening with every checksum checked first gives.
fn assert_deferred_checks_agree(path: &Path, at: usize, bit: usize) {
    let eager = load::open_all(&[path]).map(|o| {
        let profile = replay(&o.traces[0], 0, &Default::default());
        let warnings: Vec<String> = o.warnings.iter().map(|w| w.warning.to_string()).collect();
        (format!("{profile:?}"), warnings)
    });
    // As recorded, as `open_all` opens them.
    let opts = LoadOptions {
        frames: Some(FrameFilter::All),
        resolver: None,
    };
    let deferred = load::load(&[path], &opts, &Default::default(), |_| {}).map(|l| {
        let warnings: Vec<String> = l.warnings.iter().map(|w| w.warning.to_string()).collect();
        (format!("{:?}", l.profiles[0]), warnings)
    });
    match (eager, deferred) {
        (Ok(e), Ok(d)) => {
            assert_eq!(e.1, d.1, "flipping bit {bit} of byte {at}: warnings differ");
            assert!(
                e.0 == d.0,
                "flipping bit {bit} of byte {at}: the deferred checksums gave\n{}\nthe checked open\n{}",
                d.0,
                e.0
            );
        }
        (Err(_), Err(_)) => {}
        (e, d) => panic!(
            "flipping bit {bit} of byte {at}: opened {} checked, {} deferred",
            e.is_ok(),
            d.is_ok()
        ),
    }
}

/// Header fields a crafted file sets; the rest are those of an ordinary header.
#[derive(Clone, Copy)]
struct Craft {
    mode: fb::Mode,
    chunk_size: u32,
    ring_slots: u32,
}

impl Default for Craft {
    fn default() -> Self {
        Craft {
            mode: fb::Mode::Grow,
            chunk_size: 4096,
            ring_slots: 0,
        }
    }
}

/// A 1 KB file: prelude, the crafted header, a valid header checksum, then `fill` up to 1 KB.
fn crafted(c: Craft, fill: u8) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let writer = fbb.create_string("crafted");
    let clock = fb::Clock::new(0, 0, 0, 1.0);
    let header = fb::Header::create(
        &mut fbb,
        &fb::HeaderArgs {
            format_major: 1,
            format_minor: 1,
            writer: Some(writer),
            clock: Some(&clock),
            mode: c.mode,
            chunk_size: c.chunk_size,
            ring_slots: c.ring_slots,
            ..Default::default()
        },
    );
    fb::finish_size_prefixed_header_buffer(&mut fbb, header);
    let header = fbb.finished_data();
    let region = header_region(header);
    let mut out = vec![fill; 1024];
    out[..region.len()].copy_from_slice(&region);
    out
}

/// Rewrites the header checksum, so that a crafted field reaches the reader's other checks.
fn seal_header(bytes: &mut [u8]) {
    let data_offset = Prelude::decode(bytes).unwrap().data_offset as usize;
    let crc_at = data_offset - HEADER_CRC_LEN;
    let crc = header_crc(&bytes[..crc_at]);
    bytes[crc_at..data_offset].copy_from_slice(&crc.to_le_bytes());
}

/// Opens `bytes` as a file, within a second.
fn open_fast(name: &str, bytes: &[u8]) -> Result<Trace, ReadError> {
    let path = tmp(name);
    std::fs::write(&path, bytes).unwrap();
    let start = Instant::now();
    let r = Trace::open(&path);
    if let Ok(t) = &r {
        let _ = outcome(t);
    }
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{name} took {:?}",
        start.elapsed()
    );
    r
}

fn warnings(r: Result<Trace, ReadError>) -> String {
    let t = r.unwrap_or_else(|e| panic!("expected a trace with warnings, got: {e}"));
    assert!(!t.warnings.is_empty(), "no warning");
    t.warnings
        .iter()
        .map(|w| w.to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

fn error(r: Result<Trace, ReadError>) -> String {
    let e = r.err().expect("expected an error").to_string();
    assert!(!e.contains('\n'), "{e}");
    e
}

#[test]
fn a_ring_of_four_billion_slots_in_a_1k_file_is_bounded_by_the_file() {
    let bytes = crafted(
        Craft {
            mode: fb::Mode::Ring,
            ring_slots: u32::MAX,
            ..Craft::default()
        },
        0,
    );
    let w = warnings(open_fast("ring-max.pstrace", &bytes));
    assert!(w.contains("4294967295 ring slots"), "{w}");
}

#[test]
fn a_ring_with_chunk_size_zero_is_refused() {
    for chunk_size in [0, 1, 8] {
        let bytes = crafted(
            Craft {
                mode: fb::Mode::Ring,
                ring_slots: 1000,
                chunk_size,
            },
            0,
        );
        let e = error(open_fast("ring-zero.pstrace", &bytes));
        assert!(e.contains("no ring slot can hold a chunk"), "{e}");
    }
}

#[test]
fn a_data_offset_past_the_end_is_refused() {
    for data_offset in [u32::MAX - 7, 1 << 20, 1032, 0, 17] {
        let mut bytes = crafted(Craft::default(), 0);
        bytes[12..16].copy_from_slice(&data_offset.to_le_bytes());
        let e = error(open_fast("offset.pstrace", &bytes));
        assert!(e.contains("data offset"), "{e}");
    }
}

#[test]
fn a_huge_header_size_prefix_is_refused() {
    for size in [u32::MAX, 1 << 30, 1000] {
        let mut bytes = crafted(Craft::default(), 0);
        bytes[PRELUDE_LEN..PRELUDE_LEN + 4].copy_from_slice(&size.to_le_bytes());
        seal_header(&mut bytes);
        let e = error(open_fast("header-size.pstrace", &bytes));
        assert!(e.contains(&format!("header claims {size} bytes")), "{e}");
    }
}

#[test]
fn a_damaged_header_is_a_warning_naming_its_checksum() {
    let path = tmp("header-crc.pstrace");
    let mut bytes = small_trace(&path);
    let data_offset = Prelude::decode(&bytes).unwrap().data_offset as usize;
    bytes[data_offset - HEADER_CRC_LEN] ^= 0x10;
    let w = warnings(open_fast("header-crc.pstrace", &bytes));
    assert!(w.contains("header checksum mismatch"), "{w}");
}

#[test]
fn chunk_regions_full_of_garbage_end_fast_with_warnings() {
    // 0xff: every size prefix runs past the end; "PSTC" everywhere: every offset looks like a
    // chunk start and none verifies.
    for fill in [0xffu8, b'P'] {
        let mut bytes = crafted(Craft::default(), fill);
        if fill == b'P' {
            for w in bytes.rchunks_exact_mut(4).take(200) {
                w.copy_from_slice(b"PSTC");
            }
        }
        let w = warnings(open_fast("garbage.pstrace", &bytes));
        assert!(w.contains("footer slot"), "{w}");
    }
    // A footer slot that claims the whole 4 GiB and a ring of 2^32 slots behind it.
    let mut bytes = crafted(
        Craft {
            mode: fb::Mode::Ring,
            ring_slots: u32::MAX,
            chunk_size: 16 << 20,
        },
        0,
    );
    let data_offset = Prelude::decode(&bytes).unwrap().data_offset as usize;
    bytes[data_offset..data_offset + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    let w = warnings(open_fast("footer-huge.pstrace", &bytes));
    assert!(w.contains("footer slot"), "{w}");
}

#[test]
fn a_zero_footer_slot_hides_nothing_else() {
    let path = tmp("zero-footer.pstrace");
    let mut bytes = small_trace(&path);
    let whole = Trace::open(&path).unwrap();
    let footer = *whole
        .chunks
        .iter()
        .find(|c| c.kind == poolsight::analyzer::ChunkKind::Footer)
        .unwrap();
    let events_before = info::info(&whole).total_events;
    drop(whole);
    let (at, len) = (footer.offset as usize, footer.len as usize);
    bytes[at..at + len].fill(0);
    let t = open_fast("zero-footer.pstrace", &bytes).unwrap();
    assert!(t.footer.is_none());
    assert!(t.warnings.iter().any(|w| w.what.contains("footer slot")));
    assert_eq!(info::info(&t).total_events, events_before);
}

#[test]
fn a_stack_chained_without_end_keeps_every_command_shallow() {
    // A crafted trace: 20,000 stacks, each the child of the one before, with mallocs along the
    // chain. The call tree stops at its depth cap, so no report walks 20,000 levels deep.
    let path = tmp("deep-chain.pstrace");
    let rec = Recorder::create(&path, RecorderConfig::default()).unwrap();
    let h = rec.handle();
    let mut stack = 0;
    for i in 0..20_000u32 {
        let frame = h.intern_frame(&Frame {
            kind: FrameKind::Function,
            phase: Phase::Forward,
            file: "deep.py".into(),
            line: i,
            name: format!("f{i}"),
        });
        stack = h.intern_stack(stack, frame);
        if i % 1000 == 999 {
            h.record_mem(MemRecord {
                kind: MemKind::MallocPost,
                device: 0,
                stream: 0,
                ptr: 0x1000 + u64::from(i),
                bytes: 512,
                stack,
                pmem: 0,
            });
        }
    }
    drop(h);
    rec.finish().unwrap();
    let out = tmp("deep-chain-out");
    std::fs::create_dir_all(&out).unwrap();
    let p = path.to_str().unwrap();
    let o = |name: &str| out.join(name).to_str().unwrap().to_owned();
    let runs: Vec<Vec<String>> = vec![
        vec!["report".into(), p.into()],
        vec!["lines".into(), p.into()],
        vec!["flamegraph".into(), p.into(), "-o".into(), o("f.svg")],
        vec!["html".into(), p.into(), "-o".into(), o("r.html")],
        vec!["diff".into(), p.into(), p.into()],
        vec![
            "export".into(),
            "--format".into(),
            "parquet".into(),
            "--tables".into(),
            "summary".into(),
            "-o".into(),
            o("pq"),
            p.into(),
        ],
    ];
    for args in runs {
        let r = std::process::Command::new(env!("CARGO_BIN_EXE_poolsight"))
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(
            r.status.code(),
            Some(0),
            "poolsight {args:?}: {}",
            String::from_utf8_lossy(&r.stderr)
        );
    }
}
