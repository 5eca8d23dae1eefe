//! The poolsight trace format. The byte layout of a file, the checksum and sealing rules and the
//! timestamp conversion are written down once, in [`docs/format.md`](../../docs/format.md);
//! [`header.fbs`](../header.fbs) and [`trace.fbs`](../trace.fbs) are the schemas of its
//! buffers, `generated/` is what flatc 25.12.19 makes of them (checked in, rebuilt by
//! `regen.sh`), and this file holds what the schema language cannot say: the 16-byte prelude,
//! the version numbers, and the checksum rules shared by the writer and the reader.
//!
//! Change any struct in the schemas, or the meaning of a field: bump [`FORMAT_MAJOR`] and keep a
//! fixture of the old version readable. Add a field or an enum value at the end, or a rule that
//! makes files safer to read: bump [`FORMAT_MINOR`], and keep the older minor's fixtures readable
//! with that minor's rules.

#[allow(
    clippy::all,
    clippy::pedantic,
    unused_imports,
    dead_code,
    deprecated,
    non_camel_case_types,
    unsafe_op_in_unsafe_fn,
    mismatched_lifetime_syntaxes
)]
#[rustfmt::skip]
#[path = "generated/mod.rs"]
mod generated;

pub mod header;
pub mod kinds;
pub mod lock;

/// The FlatBuffers runtime the generated code is pinned to, for building buffers by hand.
pub use flatbuffers;
/// The flatc-generated types (`Chunk`, `MemEvent`, ...).
pub use generated::poolsight::fb;

/// First bytes of every trace file.
pub const MAGIC: [u8; 8] = *b"PSTRACE\0";
/// Incompatible changes bump this; a reader refuses a major it does not know.
pub const FORMAT_MAJOR: u16 = 1;
/// Compatible additions bump this. 1.1 added the header checksum and the size prefix to the
/// sealed-chunk checksum (see [`HEADER_CRC_MINOR`]); 1.2 added packed traces (see
/// [`PACKED_MINOR`]); 1.3 added `MarkKind.ScopeAbort`, the mark of a call that raised; 1.4
/// added `FrameKind.Label` and `DeviceDef.kind`/`observed` (see [`LABEL_MINOR`]); 1.5 added
/// what imported traces need: `MemKind.FreeRequested`, the marks `DeviceFree`, `Snapshot` and
/// `Annotation`, and `Header.import` (see [`IMPORT_MINOR`]); 1.6 added `MemKind.Relabel`, a
/// block moved to another stack with its live bytes unchanged; 1.7 added `DeviceDef.prediction`
/// (see [`PREDICTION_MINOR`]).
pub const FORMAT_MINOR: u16 = 7;
/// The first minor version with `FrameKind.Label`; in older files an integration's labels are
/// `Scope` frames with no file and line 0.
pub const LABEL_MINOR: u16 = 4;
/// The first minor version with `Header.import` and the kinds of imported traces
/// (`MemKind.FreeRequested`, `MarkKind.DeviceFree`, `Snapshot`, `Annotation`).
pub const IMPORT_MINOR: u16 = 5;
/// The first minor version with `DeviceDef.prediction`: a device whose events a fake CUDA run
/// predicted (`poolsight.torch.fake_cuda`) instead of observing them on a GPU.
pub const PREDICTION_MINOR: u16 = 7;
/// The first minor version that may be packed (`Header.packed`, `PackedEvents` chunks).
pub const PACKED_MINOR: u16 = 2;
/// The first minor version whose files carry a header checksum (the 4 bytes before
/// `data_offset`) and whose sealed-chunk checksums cover the size prefix.
pub const HEADER_CRC_MINOR: u16 = 1;
/// The `file` of a `Label` frame whose category was inferred (from stacks, phases and
/// lifetimes, by the importer of a file that has none) rather than recorded: readers say so.
pub const INFERRED_LABEL: &str = "inferred";
/// The `file` of an inferred `Label` frame whose category was inferred by matching sizes, not
/// from its own stack: a block live from the start that a gradient of its size (and stream)
/// matches one to one is a `parameter`.
pub const INFERRED_BY_GRADIENT_LABEL: &str = "inferred from gradient sizes";

/// Whether a `Label` frame's `file` says its category was inferred ([`INFERRED_LABEL`],
/// [`INFERRED_BY_GRADIENT_LABEL`]).
pub fn is_inferred_label(file: &str) -> bool {
    file == INFERRED_LABEL || file == INFERRED_BY_GRADIENT_LABEL
}
/// The `file` of a function frame that is a `record_function` range of an imported file (a
/// snapshot's `external_annotations`): with the phases inferred from stacks (function frames
/// whose file is [`INFERRED_LABEL`]), the phases reports split memory by.
pub const RANGE_FILE: &str = "record_function";

/// Bytes before the header FlatBuffer.
pub const PRELUDE_LEN: usize = 16;
/// Bytes of the header checksum that ends the header region (format 1.1 and later).
pub const HEADER_CRC_LEN: usize = 4;
/// FlatBuffers file identifier of the header buffer.
pub const HEADER_IDENTIFIER: &str = fb::HEADER_IDENTIFIER;
/// FlatBuffers file identifier of every chunk buffer.
pub const CHUNK_IDENTIFIER: &str = fb::CHUNK_IDENTIFIER;
/// Conventional file extension.
pub const FILE_EXTENSION: &str = fb::CHUNK_EXTENSION;

/// Byte offsets of the fields of `ChunkMeta` inside the struct, for in-place updates and for the
/// checksum rule. A test pins them against the generated accessors.
pub mod meta_field {
    pub const SEQ: usize = 0;
    pub const BASE_TICKS: usize = 8;
    pub const THREAD: usize = 16;
    pub const CRC32: usize = 20;
    pub const USED: usize = 24;
    pub const STATE: usize = 28;
}

/// The fixed bytes in front of the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prelude {
    pub major: u16,
    pub minor: u16,
    pub data_offset: u32,
}

/// Why a prelude was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PreludeError {
    /// Fewer than [`PRELUDE_LEN`] bytes.
    TooShort(usize),
    /// The magic bytes are not "PSTRACE\0": not a poolsight trace.
    BadMagic([u8; 8]),
    /// A major version this reader does not know.
    UnsupportedMajor { major: u16, minor: u16 },
}

impl std::fmt::Display for PreludeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PreludeError::TooShort(n) => write!(
                f,
                "file is {n} bytes, too short to be a poolsight trace (the prelude alone is {PRELUDE_LEN})"
            ),
            PreludeError::BadMagic(m) => write!(
                f,
                "not a poolsight trace: it starts with {:?}, expected \"PSTRACE\\0\"",
                String::from_utf8_lossy(m)
            ),
            PreludeError::UnsupportedMajor { major, minor } => write!(
                f,
                "trace format {major}.{minor} is not supported by this reader (format {FORMAT_MAJOR}.x); use a poolsight that reads format {major}"
            ),
        }
    }
}

impl std::error::Error for PreludeError {}

impl Prelude {
    pub fn current(data_offset: u32) -> Self {
        Prelude {
            major: FORMAT_MAJOR,
            minor: FORMAT_MINOR,
            data_offset,
        }
    }

    pub fn encode(&self) -> [u8; PRELUDE_LEN] {
        let mut out = [0u8; PRELUDE_LEN];
        out[..8].copy_from_slice(&MAGIC);
        out[8..10].copy_from_slice(&self.major.to_le_bytes());
        out[10..12].copy_from_slice(&self.minor.to_le_bytes());
        out[12..16].copy_from_slice(&self.data_offset.to_le_bytes());
        out
    }

    /// Checks the magic and the major version; the minor may be newer (additions only).
    pub fn decode(bytes: &[u8]) -> Result<Self, PreludeError> {
        if bytes.len() < PRELUDE_LEN {
            return Err(PreludeError::TooShort(bytes.len()));
        }
        let mut magic = [0u8; 8];
        magic.copy_from_slice(&bytes[..8]);
        if magic != MAGIC {
            return Err(PreludeError::BadMagic(magic));
        }
        let major = u16::from_le_bytes([bytes[8], bytes[9]]);
        let minor = u16::from_le_bytes([bytes[10], bytes[11]]);
        if major != FORMAT_MAJOR {
            return Err(PreludeError::UnsupportedMajor { major, minor });
        }
        let data_offset = u32::from_le_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]);
        Ok(Prelude {
            major,
            minor,
            data_offset,
        })
    }
}

/// Rounds up to the chunk alignment (8 bytes).
pub const fn align8(n: u64) -> u64 {
    (n + 7) & !7
}

/// The checksum of the header region (format 1.1 and later): CRC-32 (IEEE) of the file's bytes
/// `[0, data_offset - 4)` — prelude, header buffer and the zero padding after it — stored
/// little-endian in the 4 bytes `[data_offset - 4, data_offset)`.
pub fn header_crc(region: &[u8]) -> u32 {
    crc32fast::hash(region)
}

/// Where the chunks start in a file whose size-prefixed header buffer is `header_len` bytes:
/// after the prelude, the header and its checksum, 8-aligned.
pub fn data_offset(header_len: usize) -> u64 {
    align8((PRELUDE_LEN + header_len + HEADER_CRC_LEN) as u64)
}

/// Bytes `[0, data_offset)` of a trace file ([`data_offset`]): prelude, the size-prefixed
/// `header` buffer, zero padding, and the header checksum ([`header_crc`]) in the last 4
/// bytes. What the recorder and the packer both write first.
pub fn header_region(header: &[u8]) -> Vec<u8> {
    let data_offset = data_offset(header.len());
    let mut out = vec![0u8; data_offset as usize];
    out[..PRELUDE_LEN].copy_from_slice(&Prelude::current(data_offset as u32).encode());
    out[PRELUDE_LEN..PRELUDE_LEN + header.len()].copy_from_slice(header);
    let crc_at = out.len() - HEADER_CRC_LEN;
    let crc = header_crc(&out[..crc_at]);
    out[crc_at..].copy_from_slice(&crc.to_le_bytes());
    out
}

/// Finishes a chunk with a zeroed, Open meta and returns its size-prefixed bytes (the builder
/// is reset for the next). The writer fills in the meta and seals it.
pub fn finish_chunk(
    fbb: &mut flatbuffers::FlatBufferBuilder,
    body_type: fb::ChunkBody,
    body: flatbuffers::WIPOffset<flatbuffers::UnionWIPOffset>,
) -> Vec<u8> {
    let meta = fb::ChunkMeta::new(0, 0, 0, 0, 0, fb::ChunkState::Open);
    let root = fb::Chunk::create(
        fbb,
        &fb::ChunkArgs {
            meta: Some(&meta),
            body_type,
            body: Some(body),
        },
    );
    fb::finish_size_prefixed_chunk_buffer(fbb, root);
    let bytes = fbb.finished_data().to_vec();
    fbb.reset();
    bytes
}

/// Where a chunk's checksum starts, by format minor: 1.1 and later cover the 4-byte size
/// prefix too, so a damaged size of a sealed chunk is caught; 1.0 starts after it.
pub const fn crc_covers_size_prefix(minor: u16) -> bool {
    minor >= HEADER_CRC_MINOR
}

/// The checksum of a sealed chunk: CRC-32 of `buf[..used]` with the meta's `crc32` and `state`
/// fields read as zero, so that the writer can compute it before it stores either of them.
/// `meta_at` is the offset of `ChunkMeta` within `buf`. Format 1.1 passes the chunk from its
/// size prefix on (`used` + 4 bytes), format 1.0 the bytes after the prefix (`used` bytes).
///
/// Returns `None` when the meta or `used` lies outside `buf`.
pub fn chunk_crc(buf: &[u8], meta_at: usize, used: usize) -> Option<u32> {
    let crc_at = meta_at.checked_add(meta_field::CRC32)?;
    let state_at = meta_at.checked_add(meta_field::STATE)?;
    if used > buf.len() || state_at >= used {
        return None;
    }
    let mut h = crc32fast::Hasher::new();
    h.update(&buf[..crc_at]);
    h.update(&[0u8; 4]);
    h.update(&buf[crc_at + 4..state_at]);
    h.update(&[0u8]);
    h.update(&buf[state_at + 1..used]);
    Some(h.finalize())
}

/// Offset of a chunk's `ChunkMeta` inside the buffer it was read from (the bytes after the size
/// prefix). FlatBuffers structs are read in place, so the meta is a view into `buf`.
pub fn meta_offset(buf: &[u8], meta: &fb::ChunkMeta) -> usize {
    meta as *const fb::ChunkMeta as usize - buf.as_ptr() as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    // Each event struct is the on-disk record: a size change is a format change.
    #[test]
    fn struct_sizes_are_pinned() {
        use std::mem::size_of;
        assert_eq!(size_of::<fb::MemEvent>(), 32);
        assert_eq!(size_of::<fb::ScopeEvent>(), 16);
        assert_eq!(size_of::<fb::MarkEvent>(), 32);
        assert_eq!(size_of::<fb::ChunkMeta>(), 32);
        assert_eq!(size_of::<fb::Clock>(), 32);
        assert_eq!(size_of::<fb::FrameDef>(), 20);
        assert_eq!(size_of::<fb::StackDef>(), 12);
    }

    #[test]
    fn meta_field_offsets_match_generated_layout() {
        let meta = fb::ChunkMeta::new(
            0x0102030405060708,
            0x1112131415161718,
            0x21222324,
            0x31323334,
            0x41424344,
            fb::ChunkState::Sealed,
        );
        let b = &meta.0;
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        assert_eq!(u64_at(meta_field::SEQ), meta.seq());
        assert_eq!(u64_at(meta_field::BASE_TICKS), meta.base_ticks());
        assert_eq!(u32_at(meta_field::THREAD), meta.thread());
        assert_eq!(u32_at(meta_field::CRC32), meta.crc32());
        assert_eq!(u32_at(meta_field::USED), meta.used());
        assert_eq!(b[meta_field::STATE], fb::ChunkState::Sealed.0);
    }

    #[test]
    fn prelude_round_trips() {
        let p = Prelude::current(4096);
        assert_eq!(Prelude::decode(&p.encode()), Ok(p));
    }

    #[test]
    fn prelude_rejects_foreign_files() {
        let mut bytes = Prelude::current(64).encode();
        bytes[..8].copy_from_slice(b"\x7fELF\x02\x01\x01\x00");
        let err = Prelude::decode(&bytes).unwrap_err();
        assert!(matches!(err, PreludeError::BadMagic(_)));
        assert!(err.to_string().starts_with("not a poolsight trace"));
        assert_eq!(Prelude::decode(&bytes[..5]), Err(PreludeError::TooShort(5)));
    }

    #[test]
    fn prelude_rejects_other_major_but_accepts_newer_minor() {
        let newer_minor = Prelude {
            major: FORMAT_MAJOR,
            minor: FORMAT_MINOR + 3,
            data_offset: 64,
        };
        assert_eq!(Prelude::decode(&newer_minor.encode()), Ok(newer_minor));
        let other_major = Prelude {
            major: FORMAT_MAJOR + 1,
            minor: 0,
            data_offset: 64,
        };
        let err = Prelude::decode(&other_major.encode()).unwrap_err();
        assert!(err.to_string().contains("is not supported by this reader"));
    }

    #[test]
    fn crc_ignores_crc_and_state_fields_only() {
        let mut buf = vec![7u8; 96];
        let meta_at = 16;
        let a = chunk_crc(&buf, meta_at, 96).unwrap();
        buf[meta_at + meta_field::CRC32] = 1;
        buf[meta_at + meta_field::STATE] = 1;
        assert_eq!(chunk_crc(&buf, meta_at, 96), Some(a));
        buf[meta_at + meta_field::USED] ^= 1;
        assert_ne!(chunk_crc(&buf, meta_at, 96), Some(a));
        assert_eq!(chunk_crc(&buf, meta_at, 97), None);
        assert_eq!(chunk_crc(&buf, 90, 96), None);
    }
}
