//! The packed form of an event chunk (format 1.2, docs/format.md "Packed traces"): its events
//! encoded as columns, then compressed with zstd. Encoding first is what makes a trace small:
//! in a training loop the same stacks, sizes and kinds come back every step, while timestamps,
//! pointers and pool ids move by small steps; one column per field turns both into short
//! repeating byte runs that zstd removes.
//!
//! Columns, one after another, each holding one value per event, in the struct's field order:
//!
//! | events | columns |
//! |---|---|
//! | memory | `ts` Δ, `kind` byte, `device` byte, `stream`, `ptr` Δ, `bytes`, `stack`, `pmem` Δ |
//! | scope  | `end` Δ, `stack`, `duration` |
//! | mark   | `ticks` Δ, `kind` byte, `aux`, `a`, `b` |
//!
//! A byte column stores the byte. Every other value is an unsigned LEB128 varint; a Δ column
//! stores the field's difference from the previous event's (the first event's from 0), as a
//! two's-complement wrapping difference in the field's width, zigzag-mapped (`(d << 1) ^ (d >>
//! (width - 1))`) so that small steps either way are short. Decoding reverses exactly this, so
//! the decoded structs are byte for byte those the recorder wrote, rebase events included.
//!
//! Decoding is untrusted input: every length is checked against the bytes present and a bound,
//! and a failure is an error value, never a panic.

use poolsight_schema::fb;

/// zstd level `pack` uses by default: decoding speed does not depend on it, and packing is
/// done once.
pub const DEFAULT_LEVEL: i32 = 9;

/// Most bytes an encoded chunk may claim: a chunk holds at most 16 MiB of events (the
/// recorder's largest `chunk_size`), and its columns are never longer than its structs plus
/// one byte per field.
pub const MAX_ENCODED_LEN: u32 = 32 << 20;

/// Which events a packed chunk holds (the `ChunkBody` they had unpacked).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Packed {
    Mem,
    Scope,
    Mark,
}

impl Packed {
    /// The smallest number of encoded bytes one event takes: one per column.
    pub const fn min_event_bytes(self) -> usize {
        match self {
            Packed::Mem => 8,
            Packed::Scope => 3,
            Packed::Mark => 5,
        }
    }

    pub fn body(self) -> fb::ChunkBody {
        match self {
            Packed::Mem => fb::ChunkBody::MemEvents,
            Packed::Scope => fb::ChunkBody::ScopeEvents,
            Packed::Mark => fb::ChunkBody::MarkEvents,
        }
    }

    pub fn of_body(body: fb::ChunkBody) -> Option<Packed> {
        match body {
            fb::ChunkBody::MemEvents => Some(Packed::Mem),
            fb::ChunkBody::ScopeEvents => Some(Packed::Scope),
            fb::ChunkBody::MarkEvents => Some(Packed::Mark),
            _ => None,
        }
    }
}

/// Why a packed chunk could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("zstd: {0}")]
    Zstd(String),
    #[error("it decompresses to {got} bytes, not the {want} it declares")]
    Length { got: usize, want: usize },
    #[error("its columns end early (column {column}, event {event})")]
    Short { column: usize, event: usize },
    #[error("a varint in column {column} is longer than its field")]
    Varint { column: usize },
    #[error("{0} bytes are left after the last column")]
    Trailing(usize),
}

#[inline]
fn zigzag(d: i64) -> u64 {
    ((d << 1) ^ (d >> 63)) as u64
}

#[inline]
fn unzigzag(z: u64) -> i64 {
    ((z >> 1) as i64) ^ -((z & 1) as i64)
}

fn put(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Encodes events of one chunk into columns (not yet compressed).
pub struct Encoder {
    out: Vec<u8>,
}

impl Encoder {
    pub fn mem(events: &[fb::MemEvent]) -> Vec<u8> {
        let mut e = Encoder {
            out: Vec::with_capacity(events.len() * 12),
        };
        e.delta32(events.iter().map(|x| x.ts()));
        e.bytes(events.iter().map(|x| x.kind().0));
        e.bytes(events.iter().map(|x| x.device()));
        e.plain(events.iter().map(|x| x.stream() as u64));
        e.delta64(events.iter().map(|x| x.ptr()));
        e.plain(events.iter().map(|x| x.bytes()));
        e.plain(events.iter().map(|x| x.stack() as u64));
        e.delta32(events.iter().map(|x| x.pmem()));
        e.out
    }

    pub fn scope(events: &[fb::ScopeEvent]) -> Vec<u8> {
        let mut e = Encoder {
            out: Vec::with_capacity(events.len() * 6),
        };
        e.delta32(events.iter().map(|x| x.end()));
        e.plain(events.iter().map(|x| x.stack() as u64));
        e.plain(events.iter().map(|x| x.duration()));
        e.out
    }

    pub fn mark(events: &[fb::MarkEvent]) -> Vec<u8> {
        let mut e = Encoder {
            out: Vec::with_capacity(events.len() * 16),
        };
        e.delta64(events.iter().map(|x| x.ticks()));
        e.bytes(events.iter().map(|x| x.kind().0));
        e.plain(events.iter().map(|x| x.aux() as u64));
        e.plain(events.iter().map(|x| x.a()));
        e.plain(events.iter().map(|x| x.b()));
        e.out
    }

    fn bytes(&mut self, col: impl Iterator<Item = u8>) {
        self.out.extend(col);
    }

    fn plain(&mut self, col: impl Iterator<Item = u64>) {
        for v in col {
            put(&mut self.out, v);
        }
    }

    fn delta32(&mut self, col: impl Iterator<Item = u32>) {
        let mut prev = 0u32;
        for v in col {
            put(&mut self.out, zigzag(v.wrapping_sub(prev) as i32 as i64));
            prev = v;
        }
    }

    fn delta64(&mut self, col: impl Iterator<Item = u64>) {
        let mut prev = 0u64;
        for v in col {
            put(&mut self.out, zigzag(v.wrapping_sub(prev) as i64));
            prev = v;
        }
    }
}

/// Compresses encoded columns.
pub fn compress(encoded: &[u8], level: i32) -> std::io::Result<Vec<u8>> {
    zstd::bulk::compress(encoded, level)
}

/// Decompresses `data`, which must hold exactly `encoded_len` bytes once decompressed.
pub fn decompress(data: &[u8], encoded_len: u32) -> Result<Vec<u8>, DecodeError> {
    let want = encoded_len as usize;
    if encoded_len > MAX_ENCODED_LEN {
        return Err(DecodeError::Length { got: 0, want });
    }
    let out = zstd::bulk::decompress(data, want).map_err(|e| DecodeError::Zstd(e.to_string()))?;
    if out.len() != encoded_len as usize {
        return Err(DecodeError::Length {
            got: out.len(),
            want: encoded_len as usize,
        });
    }
    Ok(out)
}

/// Reads columns back; `column` counts them for error messages.
struct Decoder<'a> {
    buf: &'a [u8],
    at: usize,
    column: usize,
}

impl<'a> Decoder<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Decoder {
            buf,
            at: 0,
            column: 0,
        }
    }

    fn bytes(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let col = self
            .buf
            .get(self.at..self.at.saturating_add(n))
            .ok_or(DecodeError::Short {
                column: self.column,
                event: self.buf.len().saturating_sub(self.at),
            })?;
        self.at += n;
        self.column += 1;
        Ok(col)
    }

    /// One varint column of values of at most `bits` bits, one per element of `out`.
    #[inline]
    fn varints<T>(
        &mut self,
        out: &mut [T],
        bits: u32,
        mut set: impl FnMut(&mut T, u64),
    ) -> Result<(), DecodeError> {
        let buf = self.buf;
        let mut at = self.at;
        for (i, slot) in out.iter_mut().enumerate() {
            // Most values of a delta or id column fit one byte.
            let v = match buf.get(at) {
                Some(&b) if b < 0x80 => {
                    at += 1;
                    b as u64
                }
                _ => read_long(buf, &mut at, bits).map_err(|short| match short {
                    true => DecodeError::Short {
                        column: self.column,
                        event: i,
                    },
                    false => DecodeError::Varint {
                        column: self.column,
                    },
                })?,
            };
            set(slot, v);
        }
        self.at = at;
        self.column += 1;
        Ok(())
    }

    fn delta32<T>(
        &mut self,
        out: &mut [T],
        mut set: impl FnMut(&mut T, u32),
    ) -> Result<(), DecodeError> {
        let mut prev = 0u32;
        self.varints(out, 32, |e, z| {
            prev = prev.wrapping_add(unzigzag(z) as u32);
            set(e, prev);
        })
    }

    fn delta64<T>(
        &mut self,
        out: &mut [T],
        mut set: impl FnMut(&mut T, u64),
    ) -> Result<(), DecodeError> {
        let mut prev = 0u64;
        self.varints(out, 64, |e, z| {
            prev = prev.wrapping_add(unzigzag(z) as u64);
            set(e, prev);
        })
    }

    fn finish(self) -> Result<(), DecodeError> {
        match self.buf.len() - self.at {
            0 => Ok(()),
            n => Err(DecodeError::Trailing(n)),
        }
    }
}

/// Most bytes of a varint of at most `bits` bits.
const fn max_len(bits: u32) -> usize {
    bits.div_ceil(7) as usize
}

/// A varint of more than one byte at `*at`; `Err(true)` when the column ends inside it,
/// `Err(false)` when it is longer than `bits` allow.
#[inline]
fn read_long(buf: &[u8], at: &mut usize, bits: u32) -> Result<u64, bool> {
    let limit = max_len(bits);
    let Some(bytes) = buf.get(*at..*at + limit) else {
        return read_near_end(buf, at, bits);
    };
    let mut v = 0u64;
    for (k, &b) in bytes.iter().enumerate() {
        let payload = (b & 0x7f) as u64;
        v |= payload << (7 * k);
        if b < 0x80 {
            if (7 * k as u32 + 7 > bits && payload >> (bits - 7 * k as u32) != 0)
                || (bits < 64 && v >> bits != 0)
            {
                return Err(false);
            }
            *at += k + 1;
            return Ok(v);
        }
    }
    Err(false)
}

/// [`read_long`] within the last bytes of a column, one byte at a time.
#[cold]
fn read_near_end(buf: &[u8], at: &mut usize, bits: u32) -> Result<u64, bool> {
    let mut v = 0u64;
    let mut shift = 0u32;
    loop {
        let &b = buf.get(*at).ok_or(true)?;
        *at += 1;
        let payload = (b & 0x7f) as u64;
        if shift >= bits || (bits - shift < 7 && payload >> (bits - shift) != 0) {
            return Err(false);
        }
        v |= payload << shift;
        if b < 0x80 {
            return Ok(v);
        }
        shift += 7;
    }
}

/// Events in `encoded` can be at most this many, so that no allocation exceeds the input's
/// size times a constant.
fn bounded(n: u32, encoded: &[u8], kind: Packed) -> Result<usize, DecodeError> {
    let n = n as usize;
    if n.saturating_mul(kind.min_event_bytes()) > encoded.len() {
        return Err(DecodeError::Short {
            column: 0,
            event: encoded.len() / kind.min_event_bytes(),
        });
    }
    Ok(n)
}

pub fn decode_mem(encoded: &[u8], n: u32) -> Result<Vec<fb::MemEvent>, DecodeError> {
    let n = bounded(n, encoded, Packed::Mem)?;
    let mut ev = vec![fb::MemEvent::default(); n];
    let mut d = Decoder::new(encoded);
    d.delta32(&mut ev, |e, v| e.set_ts(v))?;
    for (e, &k) in ev.iter_mut().zip(d.bytes(n)?) {
        e.set_kind(fb::MemKind(k));
    }
    for (e, &k) in ev.iter_mut().zip(d.bytes(n)?) {
        e.set_device(k);
    }
    d.varints(&mut ev, 16, |e, v| e.set_stream(v as u16))?;
    d.delta64(&mut ev, |e, v| e.set_ptr(v))?;
    d.varints(&mut ev, 64, |e, v| e.set_bytes(v))?;
    d.varints(&mut ev, 32, |e, v| e.set_stack(v as u32))?;
    d.delta32(&mut ev, |e, v| e.set_pmem(v))?;
    d.finish()?;
    Ok(ev)
}

pub fn decode_scope(encoded: &[u8], n: u32) -> Result<Vec<fb::ScopeEvent>, DecodeError> {
    let n = bounded(n, encoded, Packed::Scope)?;
    let mut ev = vec![fb::ScopeEvent::default(); n];
    let mut d = Decoder::new(encoded);
    d.delta32(&mut ev, |e, v| e.set_end(v))?;
    d.varints(&mut ev, 32, |e, v| e.set_stack(v as u32))?;
    d.varints(&mut ev, 64, |e, v| e.set_duration(v))?;
    d.finish()?;
    Ok(ev)
}

pub fn decode_mark(encoded: &[u8], n: u32) -> Result<Vec<fb::MarkEvent>, DecodeError> {
    let n = bounded(n, encoded, Packed::Mark)?;
    let mut ev = vec![fb::MarkEvent::default(); n];
    let mut d = Decoder::new(encoded);
    d.delta64(&mut ev, |e, v| e.set_ticks(v))?;
    for (e, &k) in ev.iter_mut().zip(d.bytes(n)?) {
        e.set_kind(fb::MarkKind(k));
    }
    d.varints(&mut ev, 32, |e, v| e.set_aux(v as u32))?;
    d.varints(&mut ev, 64, |e, v| e.set_a(v))?;
    d.varints(&mut ev, 64, |e, v| e.set_b(v))?;
    d.finish()?;
    Ok(ev)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem(i: u64) -> fb::MemEvent {
        fb::MemEvent::new(
            (i * 37) as u32,
            fb::MemKind((i % 10) as u8),
            (i % 3) as u8,
            (i % 5) as u16,
            0x7f00_0000_0000u64.wrapping_add(i.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
            u64::MAX - i,
            (i * 7) as u32,
            u32::MAX - i as u32,
        )
    }

    #[test]
    fn columns_roundtrip_exactly() {
        let events: Vec<_> = (0..1000).map(mem).collect();
        let enc = Encoder::mem(&events);
        let packed = compress(&enc, DEFAULT_LEVEL).unwrap();
        let back = decode_mem(&decompress(&packed, enc.len() as u32).unwrap(), 1000).unwrap();
        assert!(events.iter().zip(&back).all(|(a, b)| a.0 == b.0));

        let scopes: Vec<_> = (0..500u64)
            .map(|i| fb::ScopeEvent::new(u32::MAX - i as u32 * 3, i as u32, i << 40))
            .collect();
        let back = decode_scope(&Encoder::scope(&scopes), 500).unwrap();
        assert!(scopes.iter().zip(&back).all(|(a, b)| a.0 == b.0));

        let marks: Vec<_> = (0..50u64)
            .map(|i| fb::MarkEvent::new(u64::MAX / (i + 1), fb::MarkKind(1), 7, i, !i))
            .collect();
        let back = decode_mark(&Encoder::mark(&marks), 50).unwrap();
        assert!(marks.iter().zip(&back).all(|(a, b)| a.0 == b.0));
    }

    #[test]
    fn damaged_columns_are_errors() {
        let events: Vec<_> = (0..100).map(mem).collect();
        let enc = Encoder::mem(&events);
        for cut in 0..enc.len() {
            assert!(decode_mem(&enc[..cut], 100).is_err(), "cut at {cut}");
        }
        assert!(decode_mem(&enc, 101).is_err());
        assert!(decode_mem(&enc, u32::MAX).is_err());
        let mut long = enc.clone();
        long.push(0);
        assert_eq!(
            decode_mem(&long, 100),
            Err(DecodeError::Trailing(1)).map(|_: ()| vec![])
        );
        assert!(decode_mem(&[0xff; 80], 10).is_err(), "overlong varints");
        assert!(decompress(&[1, 2, 3], 10).is_err());
        let packed = compress(&enc, 1).unwrap();
        assert!(decompress(&packed, enc.len() as u32 - 1).is_err());
        assert!(decompress(&packed, enc.len() as u32 + 1).is_err());
    }
}
