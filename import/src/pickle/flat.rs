//! The fast path of the millions of small dicts of plain values a snapshot holds (its frames):
//! each read in one go, and one written again with the same bytes given the value of the first.

use super::reader::{Item, Reader};
use super::{Build, Value, MAX_STACK, MEMO_SLACK};

/// A flat dict read before: the bytes of its items (from `MARK` to `SETITEMS`), and its value.
#[derive(Clone, Copy)]
pub(super) struct Seen<M> {
    pub(super) len: u8,
    pub(super) bytes: [u8; SEEN_BYTES],
    pub(super) epoch: u32,
    pub(super) value: Value<M>,
}

/// The longest items of a flat dict remembered, and how many are (a direct-mapped cache: a
/// new dict takes the slot of its hash).
pub(super) const SEEN_BYTES: usize = 30;
pub(super) const SEEN_SLOTS: usize = 1 << 12;

impl<B: Build> Reader<'_, '_, B> {
    /// The fast path of `EMPTY_DICT`, for the millions of small dicts of plain values a
    /// snapshot holds (its frames): `EMPTY_DICT`, its memo entry, `MARK`, keys and values that
    /// are strings, numbers, `None`, booleans or memo references to such values, `SETITEMS`,
    /// read in one go and handed to the builder at once, without going through the stack.
    /// The opcode after it must be one that takes it (`APPENDS`, `SETITEMS`, `APPEND`,
    /// `SETITEM`) or a sibling (`EMPTY_DICT`, `EMPTY_LIST`: picklers write a container whole
    /// before the next), so that it is complete here as it would be on the general path.
    /// Anything else (a memo entry among its values, a container, an opcode this path does not
    /// read, damage) and it reads nothing: `false`, and the general path reads the dict (and
    /// reports what is wrong with it). Its only side effect then is strings interned, which
    /// the general path interns again to the same ids.
    ///
    /// A dict whose items are the same bytes as those of one read before (a snapshot writes
    /// each frame again and again, a dict of its own each time, its strings memo references)
    /// is the value made of that one, unread: the bytes name the same memo entries, and none
    /// has been replaced since (`seen_epoch`).
    // Kept out of `run`: the compiler makes a better loop of it on its own.
    #[inline(never)]
    pub(super) fn flat_dict(&mut self) -> bool {
        /// Dicts larger than this take the general path.
        const MOST: usize = 64;
        let d = &self.data[self.pos..];
        let byte = |i: usize| d.get(i).copied();
        let u16_at = |i: usize| d.get(i..i + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
        let u32_at = |i: usize| {
            d.get(i..i + 4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        };
        let (memo, mut at) = match byte(0) {
            Some(0x94) => (Some(self.memo.len()), 1),
            Some(b'q') => (byte(1).map(usize::from), 2),
            Some(b'r') => (u32_at(1).map(|v| v as usize), 5),
            _ => (None, 0),
        };
        // A memo entry replaced, or one far away: the general path.
        let fresh = memo.is_none_or(|m| m >= self.memo.len() && m <= self.memo.len() + MEMO_SLACK);
        if byte(at) != Some(b'(') || !fresh {
            return false;
        }
        at += 1;
        let items = at;
        if let Some(end) = flat_items_end(d, items) {
            let key = &d[items..end];
            let next = d.get(end + 1).copied();
            if let Some(v) = self.seen(key) {
                if matches!(next, Some(b'}' | b']' | b'e' | b'u' | b'a' | b's'))
                    && self.stack.len() < MAX_STACK
                {
                    self.commit_flat(v, memo, end + 1);
                    return true;
                }
            }
        }
        let own = memo.unwrap_or(usize::MAX);
        let mut kv = std::mem::take(&mut self.scratch);
        kv.clear();
        let done = loop {
            let Some(op) = byte(at) else { break false };
            let v = match op {
                b'u' => {
                    at += 1;
                    break kv.len() % 2 == 0;
                }
                b'h' | b'j' => {
                    let id = if op == b'h' {
                        byte(at + 1).map(u32::from)
                    } else {
                        u32_at(at + 1)
                    };
                    at += if op == b'h' { 2 } else { 5 };
                    // The dict's own memo entry is the dict, not what it held before.
                    let Some(id) = id.map(|id| id as usize).filter(|&id| id != own) else {
                        break false;
                    };
                    match self.memo.get(id) {
                        Some(Some(Item::Done(v))) => *v,
                        _ => break false,
                    }
                }
                b'K' => match byte(at + 1) {
                    Some(v) => {
                        at += 2;
                        Value::Int(v as i64)
                    }
                    None => break false,
                },
                b'M' => match u16_at(at + 1) {
                    Some(v) => {
                        at += 3;
                        Value::Int(v as i64)
                    }
                    None => break false,
                },
                b'J' => match u32_at(at + 1) {
                    Some(v) => {
                        at += 5;
                        Value::Int(v as i32 as i64)
                    }
                    None => break false,
                },
                b'N' | 0x88 | 0x89 => {
                    at += 1;
                    match op {
                        b'N' => Value::None,
                        b => Value::Bool(b == 0x88),
                    }
                }
                0x8c | b'X' => {
                    let (len, head) = if op == 0x8c {
                        (byte(at + 1).map(usize::from), 2)
                    } else {
                        (u32_at(at + 1).map(|n| n as usize), 5)
                    };
                    let text = len
                        .and_then(|n| d.get(at + head..(at + head).checked_add(n)?))
                        .and_then(|b| std::str::from_utf8(b).ok());
                    match text.and_then(|t| Some((self.store.intern(t)?, t.len()))) {
                        Some((id, n)) => {
                            at += head + n;
                            Value::Str(id)
                        }
                        None => break false,
                    }
                }
                _ => break false,
            };
            kv.push(v);
            if kv.len() > 2 * MOST {
                break false;
            }
        };
        let complete = matches!(byte(at), Some(b'}' | b']' | b'e' | b'u' | b'a' | b's'));
        if !done || !complete || self.stack.len() >= MAX_STACK {
            self.scratch = kv;
            return false;
        }
        let v = match self.build.dict(&self.store, &kv) {
            Some(m) => Value::Made(m),
            None => match self.store.keep(&kv) {
                Some(id) => Value::Dict(id),
                None => {
                    self.scratch = kv;
                    return false;
                }
            },
        };
        self.scratch = kv;
        self.remember(&d[items..at - 1], v);
        self.commit_flat(v, memo, at);
        true
    }

    /// A flat dict's value onto the stack and into its (fresh) memo entry; `len` bytes read.
    pub(super) fn commit_flat(&mut self, v: Value<B::Made>, memo: Option<usize>, len: usize) {
        if let Some(id) = memo {
            if id > self.memo.len() {
                self.memo.resize(id, None);
            }
            self.memo.push(Some(Item::Done(v)));
        }
        self.stack.push(Item::Done(v));
        self.pos += len;
    }

    /// The value of a flat dict read before with these items, unless a memo entry has been
    /// replaced since.
    pub(super) fn seen(&self, items: &[u8]) -> Option<Value<B::Made>> {
        let slot = self.seen.get(seen_slot(items)?)?;
        let same = slot.len as usize == items.len() && slot.bytes.get(..items.len()) == Some(items);
        (same && slot.epoch == self.seen_epoch).then_some(slot.value)
    }

    pub(super) fn remember(&mut self, items: &[u8], value: Value<B::Made>) {
        let Some(i) = seen_slot(items) else { return };
        if self.seen.is_empty() {
            let empty = Seen {
                len: u8::MAX,
                bytes: [0; SEEN_BYTES],
                epoch: 0,
                value: Value::None,
            };
            self.seen = vec![empty; SEEN_SLOTS];
        }
        let mut bytes = [0; SEEN_BYTES];
        bytes[..items.len()].copy_from_slice(items);
        self.seen[i] = Seen {
            len: items.len() as u8,
            bytes,
            epoch: self.seen_epoch,
            value,
        };
    }
}

/// Where the items of a flat dict that begin at `at` end: the index of its `SETITEMS`, if
/// every opcode up to it is one [`Reader::flat_dict`] reads. Lengths only: nothing is read.
pub(super) fn flat_items_end(d: &[u8], mut at: usize) -> Option<usize> {
    loop {
        let len = match *d.get(at)? {
            b'u' => return Some(at),
            b'N' | 0x88 | 0x89 => 1,
            b'h' | b'K' => 2,
            b'M' => 3,
            b'j' | b'J' => 5,
            0x8c => 2 + *d.get(at + 1)? as usize,
            b'X' => {
                let b = d.get(at + 1..at + 5)?;
                5 + u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize
            }
            _ => return None,
        };
        at = at.checked_add(len)?;
    }
}

/// The slot of a flat dict's items in the cache, if they are short enough to be remembered.
pub(super) fn seen_slot(items: &[u8]) -> Option<usize> {
    use std::hash::Hasher;
    if items.len() > SEEN_BYTES {
        return None;
    }
    let mut h = rustc_hash::FxHasher::default();
    h.write(items);
    Some(h.finish() as usize % SEEN_SLOTS)
}
