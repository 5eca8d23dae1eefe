//! The checks a header and every chunk pass before anything reads them (docs/format.md):
//! FlatBuffers verification, identifier, bounds, the checksum of sealed chunks, and that the
//! sequence numbers account for every chunk the writer reserved.

use poolsight_schema::{
    align8, chunk_crc, crc_covers_size_prefix, fb, header_crc, meta_offset, Prelude,
    HEADER_CRC_LEN, HEADER_CRC_MINOR, PRELUDE_LEN,
};

use super::packed::{self, Packed};
use super::types::{ChunkInfo, ChunkKind, Footer, Header, Warning};
use super::walk::MIN_CHUNK_LEN;
use super::{MIN_PREFIXED_LEN, VERIFIER};

pub(super) fn read_header(
    data: &[u8],
    prelude: &Prelude,
    warnings: &mut Vec<Warning>,
) -> Result<Header, (u64, String)> {
    let start = PRELUDE_LEN;
    let data_offset = prelude.data_offset as usize;
    let with_crc = prelude.minor >= HEADER_CRC_MINOR;
    let crc_len = if with_crc { HEADER_CRC_LEN } else { 0 };
    if data_offset > data.len() || data_offset < start + 4 + crc_len || data_offset % 8 != 0 {
        return Err((
            12,
            format!(
                "data offset {} is impossible for a {}-byte file",
                data_offset,
                data.len()
            ),
        ));
    }
    let header_end = data_offset - crc_len;
    if with_crc {
        let stored =
            u32::from_le_bytes(data[header_end..data_offset].try_into().unwrap_or_default());
        if header_crc(&data[..header_end]) != stored {
            warnings.push(Warning {
                offset: header_end as u64,
                what: "header checksum mismatch: the header was damaged after it was written; its clock calibration, devices and layout fields may be wrong".into(),
                torn: false,
            });
        }
    }
    let size = u32::from_le_bytes(data[start..start + 4].try_into().unwrap_or_default()) as u64;
    let room = (header_end - start - 4) as u64;
    if size > room {
        return Err((
            start as u64,
            format!("header claims {size} bytes but only {room} fit before the data"),
        ));
    }
    let buf = &data[start..start + 4 + size as usize];
    if buf.len() < MIN_PREFIXED_LEN || !fb::header_size_prefixed_buffer_has_identifier(buf) {
        return Err((start as u64, "missing header identifier \"PSTH\"".into()));
    }
    let h = fb::size_prefixed_root_as_header_with_opts(&VERIFIER, buf)
        .map_err(|e| (start as u64, format!("header does not verify: {e}")))?;
    if h.mode() == fb::Mode::Ring && align8(h.chunk_size() as u64) < MIN_CHUNK_LEN {
        return Err((
            start as u64,
            format!(
                "ring mode with chunk_size {} bytes: no ring slot can hold a chunk",
                h.chunk_size()
            ),
        ));
    }
    Ok(Header::read(&h, prelude.major, prelude.minor))
}

/// Whether a chunk's checksum holds (by the rule of the file's format minor version).
pub(super) fn crc_holds(buf: &[u8], meta: &fb::ChunkMeta, minor: u16) -> bool {
    let used = meta.used() as usize;
    let meta_at = meta_offset(buf, meta);
    let sum = if crc_covers_size_prefix(minor) {
        chunk_crc(buf, meta_at, 4 + used)
    } else {
        chunk_crc(&buf[4..], meta_at - 4, used)
    };
    sum == Some(meta.crc32())
}

/// A chunk that passed verification, and what was odd about it.
pub(super) struct Verified {
    pub(super) info: ChunkInfo,
    pub(super) warning: Option<Warning>,
    /// The seqs of the further chunks a packed chunk holds.
    pub(super) merged_seqs: Vec<u64>,
}

pub(super) fn verify_chunk(
    data: &[u8],
    off: u64,
    len: u32,
    minor: u16,
    packed_trace: bool,
    deferred: bool,
) -> Result<Verified, Warning> {
    let bad = |what: String| Warning {
        offset: off,
        what,
        torn: true,
    };
    let buf = &data[off as usize..off as usize + len as usize];
    // flatbuffers asserts (panics) on buffers too short to hold an identifier.
    if buf.len() < MIN_PREFIXED_LEN || !fb::chunk_size_prefixed_buffer_has_identifier(buf) {
        return Err(bad("not a chunk (no \"PSTC\" identifier); skipped".into()));
    }
    let chunk = fb::size_prefixed_root_as_chunk_with_opts(&VERIFIER, buf)
        .map_err(|e| bad(format!("chunk does not verify ({e}); skipped")))?;
    let meta = chunk.meta();
    let used = meta.used() as usize;
    if used > buf.len() - 4 {
        return Err(bad(format!(
            "the chunk says it uses {used} bytes but holds {}: damaged; skipped",
            buf.len() - 4
        )));
    }
    let crc_holds = || crc_holds(buf, meta, minor);
    // Only a sealed event chunk's checksum may wait: the reader's walk needs nothing from
    // its events, and the replay checks it when it reads them.
    let defer = deferred
        && meta.state() == fb::ChunkState::Sealed
        && matches!(
            chunk.body_type(),
            fb::ChunkBody::MemEvents
                | fb::ChunkBody::ScopeEvents
                | fb::ChunkBody::MarkEvents
                | fb::ChunkBody::PackedEvents
        );
    let mut warning = None;
    let sealed = match meta.state() {
        fb::ChunkState::Sealed if defer || crc_holds() => true,
        fb::ChunkState::Sealed => {
            return Err(bad(
                "checksum mismatch: the chunk was corrupted after it was written; skipped".into(),
            ))
        }
        // The writer stores `used` and `crc32` only when sealing, the state last: an Open chunk
        // with either set had its state byte damaged, or its writer was killed mid-seal.
        fb::ChunkState::Open if meta.crc32() == 0 && used == 0 => false,
        fb::ChunkState::Open if crc_holds() => {
            warning = Some(Warning {
                offset: off,
                what: "the chunk is marked Open but its checksum is set and holds: its state byte was damaged, or its writer was killed while sealing it; read as sealed".into(),
                torn: false,
            });
            true
        }
        fb::ChunkState::Open if meta.crc32() == 0 => {
            warning = Some(Warning {
                offset: off,
                what: format!("the chunk is Open with no checksum but says it uses {used} bytes: its writer was killed while sealing it, or the chunk was damaged; its events are read unverified"),
                torn: false,
            });
            false
        }
        fb::ChunkState::Open => return Err(bad(
            "the chunk is marked Open but carries a checksum that does not hold: damaged; skipped"
                .into(),
        )),
        other => {
            return Err(bad(format!(
                "unknown chunk state {}: damaged; skipped",
                other.0
            )))
        }
    };
    let (kind, events) = match chunk.body_type() {
        fb::ChunkBody::MemEvents => (
            ChunkKind::Mem,
            chunk
                .body_as_mem_events()
                .and_then(|b| b.events())
                .map_or(0, |v| v.len()),
        ),
        fb::ChunkBody::ScopeEvents => (
            ChunkKind::Scope,
            chunk
                .body_as_scope_events()
                .and_then(|b| b.events())
                .map_or(0, |v| v.len()),
        ),
        fb::ChunkBody::MarkEvents => (
            ChunkKind::Mark,
            chunk
                .body_as_mark_events()
                .and_then(|b| b.events())
                .map_or(0, |v| v.len()),
        ),
        fb::ChunkBody::Defs => (ChunkKind::Defs, 0),
        fb::ChunkBody::Footer => (ChunkKind::Footer, 0),
        fb::ChunkBody::PackedEvents if packed_trace => {
            let p = chunk
                .body_as_packed_events()
                .ok_or_else(|| bad("packed chunk without a body; skipped".into()))?;
            return verify_packed(&p, sealed, off, len, meta, defer).map_err(bad);
        }
        other => return Err(bad(format!("unknown chunk body type {}; skipped", other.0))),
    };
    if matches!(kind, ChunkKind::Defs) && !sealed {
        return Err(bad("definitions chunk was never sealed; skipped".into()));
    }
    Ok(Verified {
        merged_seqs: Vec::new(),
        info: ChunkInfo {
            offset: off,
            len,
            kind,
            seq: meta.seq(),
            thread: meta.thread(),
            base_ticks: meta.base_ticks(),
            sealed,
            events: events as u32,
            packed: false,
            crc_deferred: defer,
        },
        warning,
    })
}

/// The checks of a packed chunk that need no decoding (docs/format.md, "Packed traces"): it
/// was sealed by `pack`, names an event body, and declares sizes its bytes can hold. Whether
/// the columns decode is found when they are read.
fn verify_packed(
    p: &fb::PackedEvents<'_>,
    sealed: bool,
    off: u64,
    len: u32,
    meta: &fb::ChunkMeta,
    defer: bool,
) -> Result<Verified, String> {
    if !sealed {
        return Err("packed chunk is not sealed; skipped".into());
    }
    let kind = match Packed::of_body(fb::ChunkBody(p.body())) {
        Some(Packed::Mem) => ChunkKind::Mem,
        Some(Packed::Scope) => ChunkKind::Scope,
        Some(Packed::Mark) => ChunkKind::Mark,
        None => {
            return Err(format!(
                "packed chunk of unknown body type {}; skipped",
                p.body()
            ))
        }
    };
    let min = Packed::of_body(fb::ChunkBody(p.body())).map_or(1, Packed::min_event_bytes);
    let encoded = p.encoded_len();
    if encoded > packed::MAX_ENCODED_LEN || (p.events() as u64) * (min as u64) > encoded as u64 {
        return Err(format!(
            "packed chunk declares {} events in {encoded} encoded bytes: damaged; skipped",
            p.events()
        ));
    }
    Ok(Verified {
        info: ChunkInfo {
            offset: off,
            len,
            kind,
            seq: meta.seq(),
            thread: meta.thread(),
            base_ticks: meta.base_ticks(),
            sealed: !p.open(),
            events: p.events(),
            packed: true,
            crc_deferred: defer,
        },
        warning: None,
        merged_seqs: p
            .more_seqs()
            .map(|v| v.iter().collect())
            .unwrap_or_default(),
    })
}

/// In grow mode the writer numbers chunks densely from 1 and nothing overwrites them, so a
/// `seq` that is absent (below the highest one found, or below the sealed footer's count) is a
/// chunk that was lost. The warning counts as a torn chunk only when no other one does: a
/// damaged chunk that was already reported is most likely the one missing.
pub(super) fn check_seqs(
    chunks: &[ChunkInfo],
    merged: Vec<u64>,
    footer: Option<&Footer>,
    warnings: &mut Vec<Warning>,
) {
    let mut found: Vec<u64> = chunks
        .iter()
        .filter(|c| c.kind != ChunkKind::Footer && c.seq != 0)
        .map(|c| c.seq)
        .chain(merged.into_iter().filter(|&s| s != 0))
        .collect();
    found.sort_unstable();
    found.dedup();
    let last = found.last().copied().unwrap_or(0);
    let want = footer.map_or(last, |f| f.chunks.max(last));
    let missing = want - found.len() as u64;
    if missing == 0 {
        return;
    }
    const NAMED: usize = 5;
    let mut named = Vec::with_capacity(NAMED);
    let mut expect = 1u64;
    for &seq in found.iter().chain(std::iter::once(&want.saturating_add(1))) {
        while expect < seq && named.len() < NAMED {
            named.push(format!("#{expect}"));
            expect += 1;
        }
        if named.len() == NAMED {
            break;
        }
        expect = seq.saturating_add(1);
    }
    let more = if missing > named.len() as u64 {
        ", ..."
    } else {
        ""
    };
    let torn = !warnings.iter().any(|w| w.torn);
    warnings.push(Warning {
        offset: 0,
        what: format!(
            "{missing} of the {want} chunks the writer reserved are missing (seq {}{more}): lost to damage or truncation",
            named.join(", ")
        ),
        torn,
    });
}
