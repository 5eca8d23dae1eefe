//! A pickle reader that never runs code, and that reads a pickle in one pass without keeping
//! it as a tree.
//!
//! `pickle.load` executes what a pickle asks for: `GLOBAL`/`STACK_GLOBAL` import any callable,
//! `REDUCE` calls it (`os.system("...")` is four opcodes). A PyTorch memory snapshot is plain
//! data — dicts, lists, tuples, strings, numbers, booleans, `None` — so this reader implements
//! exactly the opcodes that build plain data (protocols 0 to 5) and refuses every opcode that
//! imports, calls or builds an object (`GLOBAL`, `STACK_GLOBAL`, `REDUCE`, `BUILD`, `INST`,
//! `OBJ`, `NEWOBJ`, `NEWOBJ_EX`, `PERSID`, `BINPERSID`, `EXT*`, out-of-band buffers) with an
//! error naming what it would have imported. Nothing is evaluated, ever.
//!
//! A snapshot of 100,000 trace entries with 50 frames each is five million dicts. The reader
//! does not keep them: it hands each dict and list to a [`Build`] as soon as it is complete,
//! and the builder may replace it with a small value of its own (the snapshot reader makes a
//! frame dict a frame id, a list of frames an interned list, a trace entry a row of its
//! table); only what the builder leaves is kept, as plain containers in a [`Store`]. A
//! container is complete when it leaves the stack (its parent takes it, `POP`, `STOP`):
//! picklers write a container's contents before they use it. A pickle that adds to a
//! container after that (only a structure that contains itself does) is refused. Strings are
//! interned, so a string is one id however often it occurs, and a memo reference is a value,
//! so a memoized container is shared, never copied. The small dicts of plain values that make
//! up most of a snapshot (its frames) have a fast path that reads each in one go, and
//! remembers the last few thousand by their bytes, so that a frame written again is not read
//! again.
//!
//! Why not `serde-pickle`: it is safe too (unknown globals stay opaque), but it builds the whole
//! value tree before any of it can be read, and clones a memoized value at each reference; a
//! snapshot is hundreds of MB, and references its frame dicts and lists thousands of times.
//!
//! The parts: this file (values, the builder's trait, the store, [`parse`]), `reader` (the
//! stack, memo and containers), `opcodes` (what each opcode does), `flat` (the fast path of
//! small flat dicts).
//!
//! Bounds: every length read from the input is checked against the bytes left before
//! anything is allocated; the stack holds at most [`MAX_STACK`] values and as many marks; a
//! memo index must be near the memo's size. A bad pickle is an error naming the byte offset of
//! the opcode at fault, never a panic.

use std::convert::Infallible;

use rustc_hash::FxHashMap;

use reader::Reader;

/// What is wrong with a pickle, with the byte offset of the opcode at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} (byte {offset} of the pickle)")]
pub struct PickleError {
    pub offset: u64,
    pub what: String,
}

/// An interned string: its index in the [`Store`].
pub type StrId = u32;

/// A value. Containers the [`Build`] left as they are index the [`Store`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value<M> {
    None,
    Bool(bool),
    Int(i64),
    /// An integer in (i64::MAX, u64::MAX].
    UInt(u64),
    /// An integer outside the u64 and i64 ranges (its value is not kept).
    BigInt,
    Float(f64),
    Str(StrId),
    /// Bytes (their content is not kept: a snapshot holds none).
    Bytes,
    List(u32),
    Tuple(u32),
    Dict(u32),
    Set(u32),
    /// What the builder made of a complete dict or list.
    Made(M),
}

impl<M> Value<M> {
    /// An integer that fits u64 (negative ones do not).
    pub fn u64(&self) -> Option<u64> {
        match *self {
            Value::Int(v) => u64::try_from(v).ok(),
            Value::UInt(v) => Some(v),
            Value::Bool(b) => Some(b as u64),
            _ => None,
        }
    }

    pub fn i64(&self) -> Option<i64> {
        match *self {
            Value::Int(v) => Some(v),
            Value::Bool(b) => Some(b as i64),
            _ => None,
        }
    }

    pub fn f64(&self) -> Option<f64> {
        match *self {
            Value::Float(v) => Some(v),
            Value::Int(v) => Some(v as f64),
            Value::UInt(v) => Some(v as f64),
            _ => None,
        }
    }

    pub fn bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            Value::Int(v) => Some(v != 0),
            _ => None,
        }
    }

    /// A short name of what a value is, for error messages.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "a bool",
            Value::Int(_) | Value::UInt(_) | Value::BigInt => "an int",
            Value::Float(_) => "a float",
            Value::Str(_) => "a str",
            Value::Bytes => "bytes",
            Value::List(_) => "a list",
            Value::Tuple(_) => "a tuple",
            Value::Dict(_) => "a dict",
            Value::Set(_) => "a set",
            Value::Made(_) => "a dict or list",
        }
    }
}

/// What a reader makes of the dicts and lists of a pickle, when each is complete. What it
/// makes of one must depend on its content only: a small dict written again with the same
/// bytes (a snapshot's frames, each a dict of its own) is given the value made of the first,
/// without asking again.
pub trait Build {
    type Made: Copy;

    /// A complete dict, its keys and values in turn (`k0, v0, k1, v1, ...`): `Some` to stand
    /// for it from now on, `None` to keep it as a [`Value::Dict`].
    fn dict(
        &mut self,
        store: &Store<Self::Made>,
        pairs: &[Value<Self::Made>],
    ) -> Option<Self::Made>;

    /// A complete list: `Some` to stand for it, `None` to keep it as a [`Value::List`].
    fn list(
        &mut self,
        store: &Store<Self::Made>,
        items: &[Value<Self::Made>],
    ) -> Option<Self::Made>;
}

/// A builder that keeps every container as it is.
pub struct Plain;

impl Build for Plain {
    type Made = Infallible;

    fn dict(&mut self, _: &Store<Infallible>, _: &[Value<Infallible>]) -> Option<Infallible> {
        None
    }

    fn list(&mut self, _: &Store<Infallible>, _: &[Value<Infallible>]) -> Option<Infallible> {
        None
    }
}

/// The strings of a pickle, and the containers kept.
pub struct Store<M> {
    strings: Vec<Box<str>>,
    ids: FxHashMap<Box<str>, StrId>,
    /// The items of every container kept, each container's a span of it.
    items: Vec<Value<M>>,
    spans: Vec<(usize, usize)>,
}

impl<M: Copy> Store<M> {
    fn new() -> Self {
        Store {
            strings: Vec::new(),
            ids: FxHashMap::default(),
            items: Vec::new(),
            spans: Vec::new(),
        }
    }

    /// The text of an interned string.
    pub fn text(&self, id: StrId) -> &str {
        self.strings.get(id as usize).map_or("", |s| s)
    }

    pub fn str(&self, v: Value<M>) -> Option<&str> {
        match v {
            Value::Str(id) => Some(self.text(id)),
            _ => None,
        }
    }

    /// The items of a list, tuple or set; a dict's keys and values in turn; empty for anything
    /// else.
    pub fn items(&self, v: Value<M>) -> &[Value<M>] {
        let span = match v {
            Value::List(i) | Value::Tuple(i) | Value::Dict(i) | Value::Set(i) => {
                self.spans.get(i as usize)
            }
            _ => None,
        };
        match span {
            Some(&(start, len)) => self.items.get(start..start + len).unwrap_or(&[]),
            None => &[],
        }
    }

    /// The key/value pairs of a dict (none for anything else).
    pub fn pairs(&self, dict: Value<M>) -> impl Iterator<Item = (Value<M>, Value<M>)> + '_ {
        let kv = match dict {
            Value::Dict(_) => self.items(dict),
            _ => &[],
        };
        kv.chunks_exact(2).map(|p| (p[0], p[1]))
    }

    /// The value of `key` in a dict whose keys are strings.
    pub fn get(&self, dict: Value<M>, key: &str) -> Option<Value<M>> {
        self.pairs(dict)
            .find(|(k, _)| self.str(*k) == Some(key))
            .map(|(_, v)| v)
    }

    fn intern(&mut self, s: &str) -> Option<StrId> {
        if let Some(&id) = self.ids.get(s) {
            return Some(id);
        }
        let id = StrId::try_from(self.strings.len()).ok()?;
        self.strings.push(s.into());
        self.ids.insert(s.into(), id);
        Some(id)
    }

    fn keep(&mut self, items: &[Value<M>]) -> Option<u32> {
        let id = u32::try_from(self.spans.len()).ok()?;
        self.spans.push((self.items.len(), items.len()));
        self.items.extend_from_slice(items);
        Some(id)
    }
}

/// A pickle read: its root and what it holds.
pub struct Parsed<M> {
    pub root: Value<M>,
    pub store: Store<M>,
    /// The protocol the pickle declared (0 or 1 when it has no PROTO opcode).
    pub protocol: u8,
}

impl<M> std::fmt::Debug for Parsed<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parsed")
            .field("strings", &self.store.strings.len())
            .field("containers", &self.store.spans.len())
            .field("protocol", &self.protocol)
            .finish()
    }
}

/// Called with the bytes read so far, every few MB, for a progress bar.
pub type Progress<'p> = &'p mut dyn FnMut(u64);

/// The most values (and the most marks) the stack may hold. A snapshot pickled by Python holds
/// at most a batch of 1,000 items per open container; a pickler that writes a list in one
/// batch holds its items (a device trace's entries).
pub const MAX_STACK: usize = 1 << 20;

/// Memo ids are small, dense integers in every pickler; one far past the memo's size is
/// refused rather than allocated for.
const MEMO_SLACK: usize = 1 << 20;

/// Reads `data`, which must hold exactly one pickle (trailing bytes are refused), handing its
/// dicts and lists to `build`. `keys` are interned first, in order: the string `keys[i]` is
/// `Value::Str(i)` wherever it occurs, so that a builder knows its keys by id.
pub fn parse<B: Build>(
    data: &[u8],
    keys: &[&str],
    build: &mut B,
    progress: Option<Progress<'_>>,
) -> Result<Parsed<B::Made>, PickleError> {
    let mut store = Store::new();
    for k in keys {
        store.intern(k);
    }
    Reader {
        data,
        pos: 0,
        op_at: 0,
        build,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: Vec::new(),
        open: Vec::new(),
        free: Vec::new(),
        shared_done: FxHashMap::default(),
        serial: 0,
        scratch: Vec::new(),
        seen: Vec::new(),
        seen_epoch: 0,
        store,
        protocol: 0,
    }
    .run(progress)
}

mod flat;
mod opcodes;
mod reader;
#[cfg(test)]
mod tests;
