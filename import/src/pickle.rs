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
//! Bounds: every length read from the input is checked against the bytes left before
//! anything is allocated; the stack holds at most [`MAX_STACK`] values and as many marks; a
//! memo index must be near the memo's size. A bad pickle is an error naming the byte offset of
//! the opcode at fault, never a panic.

use std::convert::Infallible;

use rustc_hash::FxHashMap;

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

/// A stack or memo entry: a value, or a dict, list or set still being filled.
#[derive(Debug, Clone, Copy)]
enum Item<M> {
    Done(Value<M>),
    Open { slot: u32, serial: u32 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    List,
    Dict,
    Set,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::List => "a list",
            Kind::Dict => "a dict",
            Kind::Set => "a set",
        }
    }
}

/// A container being filled. Slots are reused; `serial` tells a container from the earlier
/// ones of its slot.
struct Open<M> {
    kind: Kind,
    items: Vec<Value<M>>,
    /// The memo entry that holds it (`NO_MEMO`: none), set to its value when it completes.
    memo: u32,
    serial: u32,
    /// Referenced twice while open (`DUP`, a memo `GET`, a second memo entry): its value is
    /// remembered when it completes, for the other reference.
    shared: bool,
}

const NO_MEMO: u32 = u32::MAX;

/// A flat dict read before: the bytes of its items (from `MARK` to `SETITEMS`), and its value.
#[derive(Clone, Copy)]
struct Seen<M> {
    len: u8,
    bytes: [u8; SEEN_BYTES],
    epoch: u32,
    value: Value<M>,
}

/// The longest items of a flat dict remembered, and how many are (a direct-mapped cache: a
/// new dict takes the slot of its hash).
const SEEN_BYTES: usize = 30;
const SEEN_SLOTS: usize = 1 << 12;

struct Reader<'a, 'b, B: Build> {
    data: &'a [u8],
    pos: usize,
    /// Offset of the opcode being executed.
    op_at: usize,
    build: &'b mut B,
    stack: Vec<Item<B::Made>>,
    /// Stack lengths at each open MARK.
    marks: Vec<usize>,
    memo: Vec<Option<Item<B::Made>>>,
    open: Vec<Open<B::Made>>,
    free: Vec<u32>,
    /// The values of containers that completed while referenced twice, by serial.
    shared_done: FxHashMap<u32, Value<B::Made>>,
    serial: u32,
    scratch: Vec<Value<B::Made>>,
    /// Small flat dicts read before, by their bytes ([`Reader::flat_dict`]).
    seen: Vec<Seen<B::Made>>,
    /// Bumped when a memo entry is replaced: what `seen` holds was read with the old one.
    seen_epoch: u32,
    store: Store<B::Made>,
    protocol: u8,
}

impl<'a, B: Build> Reader<'a, '_, B> {
    fn err(&self, what: impl Into<String>) -> PickleError {
        PickleError {
            offset: self.op_at as u64,
            what: what.into(),
        }
    }

    fn truncated(&self) -> PickleError {
        self.err("the pickle ends in the middle of an opcode (truncated file?)")
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], PickleError> {
        if n > self.data.len() - self.pos {
            return Err(self.truncated());
        }
        let s = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8, PickleError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<usize, PickleError> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]) as usize)
    }

    fn u32(&mut self) -> Result<usize, PickleError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    }

    fn u64(&mut self) -> Result<u64, PickleError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    /// `n` bytes whose count was read from the input, bounded by what is left of it.
    fn take_len(&mut self, n: u64) -> Result<&'a [u8], PickleError> {
        if n > (self.data.len() - self.pos) as u64 {
            return Err(self.truncated());
        }
        self.take(n as usize)
    }

    /// A text line (protocol 0 arguments), without its newline.
    fn line(&mut self) -> Result<&'a [u8], PickleError> {
        let rest = &self.data[self.pos..];
        let end = rest
            .iter()
            .position(|&b| b == b'\n')
            .ok_or_else(|| self.truncated())?;
        self.pos += end + 1;
        Ok(&rest[..end])
    }

    /// The stack length at the innermost open MARK: what lies below belongs to it.
    fn fence(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    fn push(&mut self, item: Item<B::Made>) -> Result<(), PickleError> {
        if self.stack.len() >= MAX_STACK {
            return Err(self.too_deep());
        }
        self.stack.push(item);
        Ok(())
    }

    fn too_deep(&self) -> PickleError {
        self.err(format!(
            "the pickle holds more than {MAX_STACK} values at once on its stack (nested too deep; not a snapshot)"
        ))
    }

    fn value(&mut self, v: Value<B::Made>) -> Result<(), PickleError> {
        self.push(Item::Done(v))
    }

    fn missing(&self) -> PickleError {
        if self.marks.is_empty() {
            self.err("an opcode needs a value but the stack is empty")
        } else {
            self.err("an opcode found a MARK where it expected a value")
        }
    }

    /// The top of the stack, completed.
    fn pop(&mut self) -> Result<Value<B::Made>, PickleError> {
        if self.stack.len() <= self.fence() {
            return Err(self.missing());
        }
        match self.stack.pop() {
            Some(Item::Done(v)) => Ok(v),
            Some(open) => self.complete(open),
            None => Err(self.missing()),
        }
    }

    fn top(&self) -> Result<Item<B::Made>, PickleError> {
        if self.stack.len() <= self.fence() {
            return Err(self.missing());
        }
        self.stack.last().copied().ok_or_else(|| self.missing())
    }

    /// Closes the innermost MARK: the stack index of the first value above it.
    fn pop_mark(&mut self) -> Result<usize, PickleError> {
        self.marks
            .pop()
            .ok_or_else(|| self.err("an opcode needs a MARK but none is open"))
    }

    fn new_open(&mut self, kind: Kind) -> Result<(), PickleError> {
        if self.stack.len() >= MAX_STACK {
            return Err(self.too_deep());
        }
        let serial = self.serial;
        self.serial = self
            .serial
            .checked_add(1)
            .ok_or_else(|| self.err("the pickle holds more than 4 billion containers"))?;
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                let s = u32::try_from(self.open.len())
                    .map_err(|_| self.err("the pickle holds more than 4 billion containers"))?;
                self.open.push(Open {
                    kind,
                    items: Vec::new(),
                    memo: NO_MEMO,
                    serial,
                    shared: false,
                });
                s
            }
        };
        let o = &mut self.open[slot as usize];
        o.kind = kind;
        o.serial = serial;
        o.memo = NO_MEMO;
        o.shared = false;
        self.push(Item::Open { slot, serial })
    }

    /// The value of a stack or memo entry; a container still open is complete from now on.
    // Out of line: the callers' fast path is the value that is already one.
    #[inline(never)]
    fn complete(&mut self, item: Item<B::Made>) -> Result<Value<B::Made>, PickleError> {
        let (slot, serial) = match item {
            Item::Done(v) => return Ok(v),
            Item::Open { slot, serial } => (slot, serial),
        };
        let o = match self.open.get_mut(slot as usize) {
            Some(o) if o.serial == serial => o,
            _ => {
                return self.shared_done.get(&serial).copied().ok_or_else(|| {
                    self.err("a container is used after it was complete (not plain data)")
                })
            }
        };
        let items = std::mem::take(&mut o.items);
        let (kind, shared, memo) = (o.kind, o.shared, o.memo);
        // Dead until reused: no serial is u32::MAX (new_open stops short of it).
        o.serial = u32::MAX;
        let made = match kind {
            Kind::Dict => self.build.dict(&self.store, &items),
            Kind::List => self.build.list(&self.store, &items),
            Kind::Set => None,
        };
        let v = match made {
            Some(m) => Value::Made(m),
            None => {
                let id = self
                    .store
                    .keep(&items)
                    .ok_or_else(|| self.err("the pickle holds more than 4 billion containers"))?;
                match kind {
                    Kind::Dict => Value::Dict(id),
                    Kind::List => Value::List(id),
                    Kind::Set => Value::Set(id),
                }
            }
        };
        if let Some(m) = self.memo.get_mut(memo as usize) {
            if matches!(*m, Some(Item::Open { slot: s, serial: n }) if s == slot && n == serial) {
                *m = Some(Item::Done(v));
            }
        }
        if shared {
            self.shared_done.insert(serial, v);
        }
        let o = &mut self.open[slot as usize];
        o.items = items;
        o.items.clear();
        self.free.push(slot);
        Ok(v)
    }

    /// Completes the values from `start` to the top, moves them into `scratch` and off the stack.
    fn take_from(&mut self, start: usize) -> Result<Vec<Value<B::Made>>, PickleError> {
        let mut out = std::mem::take(&mut self.scratch);
        out.clear();
        out.reserve(self.stack.len().saturating_sub(start));
        for i in start..self.stack.len() {
            let v = match self.stack[i] {
                Item::Done(v) => v,
                open => self.complete(open)?,
            };
            out.push(v);
        }
        self.stack.truncate(start);
        Ok(out)
    }

    /// The open container at stack index `at`, for `op` to add to.
    fn target(&self, at: Option<usize>, kind: Kind, op: &str) -> Result<usize, PickleError> {
        let item = at
            .filter(|&i| i >= self.fence())
            .and_then(|i| self.stack.get(i))
            .ok_or_else(|| self.err(format!("{op} has no container to add to")))?;
        match *item {
            Item::Open { slot, serial } => match self.open.get(slot as usize) {
                Some(o) if o.serial == serial && o.kind == kind => Ok(slot as usize),
                Some(o) if o.serial == serial => {
                    Err(self.err(format!("{op} applied to {}", o.kind.name())))
                }
                _ => Err(self.err(format!(
                    "{op} adds to a container that is already complete (a structure that \
                     contains itself; not plain data)"
                ))),
            },
            Item::Done(v) => Err(self.err(format!("{op} applied to {}", v.kind_name()))),
        }
    }

    /// `APPENDS`, `SETITEMS`, `ADDITEMS`: the values above the innermost MARK into the open
    /// container below it. The hot path of a snapshot (every dict and list is filled so): the
    /// values go straight from the stack into the container.
    fn add_from_mark(&mut self, kind: Kind, op: &str) -> Result<(), PickleError> {
        let start = self.pop_mark()?;
        if kind == Kind::Dict && (self.stack.len() - start) % 2 != 0 {
            return Err(self.err(format!("{op} with an odd number of keys and values")));
        }
        for i in start..self.stack.len() {
            if let open @ Item::Open { .. } = self.stack[i] {
                let v = self.complete(open)?;
                self.stack[i] = Item::Done(v);
            }
        }
        let slot = self.target(start.checked_sub(1), kind, op)?;
        // Every item is a value now (completed just above).
        let values = self.stack[start..].iter().map(|item| match *item {
            Item::Done(v) => v,
            Item::Open { .. } => Value::None,
        });
        self.open[slot].items.extend(values);
        self.stack.truncate(start);
        Ok(())
    }

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
    fn flat_dict(&mut self) -> bool {
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
    fn commit_flat(&mut self, v: Value<B::Made>, memo: Option<usize>, len: usize) {
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
    fn seen(&self, items: &[u8]) -> Option<Value<B::Made>> {
        let slot = self.seen.get(seen_slot(items)?)?;
        let same = slot.len as usize == items.len() && slot.bytes.get(..items.len()) == Some(items);
        (same && slot.epoch == self.seen_epoch).then_some(slot.value)
    }

    fn remember(&mut self, items: &[u8], value: Value<B::Made>) {
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

    /// `LIST`, `DICT`: a new open container of the values above the innermost MARK.
    fn open_from_mark(&mut self, kind: Kind, op: &str) -> Result<(), PickleError> {
        let start = self.pop_mark()?;
        if kind == Kind::Dict && (self.stack.len() - start) % 2 != 0 {
            return Err(self.err(format!("{op} with an odd number of keys and values")));
        }
        let values = self.take_from(start)?;
        self.new_open(kind)?;
        if let Some(Item::Open { slot, .. }) = self.stack.last().copied() {
            self.open[slot as usize].items.extend_from_slice(&values);
        }
        self.scratch = values;
        Ok(())
    }

    /// A tuple or frozenset of the given values (complete at once: they cannot change).
    fn frozen(&mut self, values: Vec<Value<B::Made>>, set: bool) -> Result<(), PickleError> {
        let id = self.store.keep(&values);
        self.scratch = values;
        let id = id.ok_or_else(|| self.err("the pickle holds more than 4 billion containers"))?;
        self.value(if set {
            Value::Set(id)
        } else {
            Value::Tuple(id)
        })
    }

    fn string(&mut self, s: &str) -> Result<(), PickleError> {
        let id = self
            .store
            .intern(s)
            .ok_or_else(|| self.err("the pickle holds more than 4 billion strings"))?;
        self.value(Value::Str(id))
    }

    fn utf8(&mut self, bytes: &[u8]) -> Result<(), PickleError> {
        match std::str::from_utf8(bytes) {
            Ok(s) => self.string(s),
            Err(_) => self.string(&String::from_utf8_lossy(bytes)),
        }
    }

    fn int_le(&mut self, b: &[u8]) -> Result<(), PickleError> {
        if b.is_empty() {
            return self.value(Value::Int(0));
        }
        let negative = b[b.len() - 1] & 0x80 != 0;
        // Drop sign-extension bytes, then see what is left.
        let mut n = b.len();
        let fill = if negative { 0xff } else { 0 };
        while n > 1 && b[n - 1] == fill && (b[n - 2] & 0x80 != 0) == negative {
            n -= 1;
        }
        if n <= 8 {
            let mut a = [fill; 8];
            a[..n].copy_from_slice(&b[..n]);
            return self.value(Value::Int(i64::from_le_bytes(a)));
        }
        if n == 9 && !negative && b[8] == 0 {
            let mut a = [0; 8];
            a.copy_from_slice(&b[..8]);
            return self.value(Value::UInt(u64::from_le_bytes(a)));
        }
        self.value(Value::BigInt)
    }

    fn text_int(&mut self, line: &[u8]) -> Result<(), PickleError> {
        let t = std::str::from_utf8(line)
            .unwrap_or("")
            .trim_end_matches('L');
        match t {
            "00" => return self.value(Value::Bool(false)),
            "01" => return self.value(Value::Bool(true)),
            _ => {}
        }
        if let Ok(v) = t.parse::<i64>() {
            self.value(Value::Int(v))
        } else if let Ok(v) = t.parse::<u64>() {
            self.value(Value::UInt(v))
        } else if !t.is_empty()
            && t.trim_start_matches('-')
                .bytes()
                .all(|c| c.is_ascii_digit())
        {
            self.value(Value::BigInt)
        } else {
            Err(self.err("a text integer that is not a number"))
        }
    }

    fn memo_put(&mut self, id: usize) -> Result<(), PickleError> {
        let top = self.top()?;
        if id == self.memo.len() {
            self.memo.push(Some(top));
        } else if id < self.memo.len() {
            self.memo[id] = Some(top);
            self.seen_epoch = self.seen_epoch.wrapping_add(1);
        } else if id <= self.memo.len() + MEMO_SLACK {
            self.memo.resize(id, None);
            self.memo.push(Some(top));
        } else {
            return Err(self.err(format!("memo index {id} is far past the memo's size")));
        }
        if let Item::Open { slot, serial } = top {
            if let Some(o) = self
                .open
                .get_mut(slot as usize)
                .filter(|o| o.serial == serial)
            {
                if o.memo == NO_MEMO {
                    // `id` < memo.len(), which MEMO_SLACK keeps far below u32::MAX.
                    o.memo = id as u32;
                } else {
                    o.shared = true;
                }
            }
        }
        Ok(())
    }

    fn memo_get(&mut self, id: usize) -> Result<(), PickleError> {
        match self.memo.get(id).copied().flatten() {
            Some(item) => {
                self.share(item);
                self.push(item)
            }
            None => Err(self.err(format!("memo index {id} was never stored"))),
        }
    }

    /// A second reference to `item` is about to be pushed.
    fn share(&mut self, item: Item<B::Made>) {
        if let Item::Open { slot, serial } = item {
            if let Some(o) = self.open.get_mut(slot as usize) {
                if o.serial == serial {
                    o.shared = true;
                }
            }
        }
    }

    fn refuse_global(&self, module: &str, name: &str) -> PickleError {
        self.err(format!(
            "refused: the pickle imports `{module}.{name}` (a pickle that imports or calls anything can run code; \
             a PyTorch snapshot holds only plain data, and poolsight never runs code from a pickle)"
        ))
    }

    fn refuse(&self, op: &str) -> PickleError {
        self.err(format!(
            "refused: opcode {op} builds an object (a pickle that builds objects can run code; \
             a PyTorch snapshot holds only plain data, and poolsight never runs code from a pickle)"
        ))
    }

    fn run(mut self, mut progress: Option<Progress<'_>>) -> Result<Parsed<B::Made>, PickleError> {
        const REPORT_EVERY: usize = 8 << 20;
        let mut next_report = REPORT_EVERY;
        loop {
            if self.pos >= next_report {
                if let Some(p) = progress.as_mut() {
                    p(self.pos as u64);
                }
                next_report = self.pos + REPORT_EVERY;
            }
            self.op_at = self.pos;
            if self.pos >= self.data.len() {
                return Err(if self.pos == 0 {
                    self.err("the file is empty")
                } else {
                    self.err("the pickle ends without its STOP opcode (truncated file?)")
                });
            }
            let op = self.u8()?;
            match op {
                0x80 => {
                    self.protocol = self.u8()?;
                    if self.protocol > 5 {
                        return Err(self.err(format!(
                            "pickle protocol {} is newer than any this reader knows (0 to 5)",
                            self.protocol
                        )));
                    }
                }
                0x95 => {
                    // FRAME: a length hint; the opcodes follow in place.
                    self.u64()?;
                }
                b'.' => {
                    let root = self.pop()?;
                    if !self.stack.is_empty() || !self.marks.is_empty() {
                        return Err(self.err("values are left on the stack at STOP"));
                    }
                    if self.pos != self.data.len() {
                        return Err(PickleError {
                            offset: self.pos as u64,
                            what: "bytes follow the end of the pickle".into(),
                        });
                    }
                    if let Some(p) = progress.as_mut() {
                        p(self.pos as u64);
                    }
                    return Ok(Parsed {
                        root,
                        store: self.store,
                        protocol: self.protocol,
                    });
                }
                b'(' => {
                    if self.marks.len() >= MAX_STACK {
                        return Err(self.too_deep());
                    }
                    self.marks.push(self.stack.len());
                }
                b'0' => {
                    // As Python's unpickler: with nothing above the innermost MARK, POP
                    // removes the MARK.
                    if self.stack.len() > self.fence() {
                        self.pop()?;
                    } else if self.marks.pop().is_none() {
                        return Err(self.err("POP on an empty stack"));
                    }
                }
                b'1' => {
                    let start = self.pop_mark()?;
                    let dropped = self.take_from(start)?;
                    self.scratch = dropped;
                }
                b'2' => {
                    let top = self.top()?;
                    self.share(top);
                    self.push(top)?;
                }
                b'N' => self.value(Value::None)?,
                0x88 => self.value(Value::Bool(true))?,
                0x89 => self.value(Value::Bool(false))?,
                b'J' => {
                    let b = self.take(4)?;
                    let v = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                    self.value(Value::Int(v as i64))?;
                }
                b'K' => {
                    let v = self.u8()?;
                    self.value(Value::Int(v as i64))?;
                }
                b'M' => {
                    let v = self.u16()?;
                    self.value(Value::Int(v as i64))?;
                }
                0x8a => {
                    let n = self.u8()? as u64;
                    let b = self.take_len(n)?;
                    self.int_le(b)?;
                }
                0x8b => {
                    let n = self.u32()? as u64;
                    let b = self.take_len(n)?;
                    self.int_le(b)?;
                }
                b'I' | b'L' => {
                    let line = self.line()?;
                    self.text_int(line)?;
                }
                b'F' => {
                    let line = self.line()?;
                    let v: f64 = std::str::from_utf8(line)
                        .ok()
                        .and_then(|t| t.trim().parse().ok())
                        .ok_or_else(|| self.err("a text float that is not a number"))?;
                    self.value(Value::Float(v))?;
                }
                b'G' => {
                    let b = self.take(8)?;
                    let mut a = [0u8; 8];
                    a.copy_from_slice(b);
                    self.value(Value::Float(f64::from_be_bytes(a)))?;
                }
                b'X' => {
                    let n = self.u32()? as u64;
                    let b = self.take_len(n)?;
                    self.utf8(b)?;
                }
                0x8c => {
                    let n = self.u8()? as u64;
                    let b = self.take_len(n)?;
                    self.utf8(b)?;
                }
                0x8d => {
                    let n = self.u64()?;
                    let b = self.take_len(n)?;
                    self.utf8(b)?;
                }
                b'V' => {
                    let line = self.line()?;
                    let s = raw_unicode_escape(line)
                        .ok_or_else(|| self.err("a protocol-0 unicode string with a bad escape"))?;
                    self.string(&s)?;
                }
                b'T' => {
                    let n = self.u32()? as u64;
                    let b = self.take_len(n)?;
                    self.string(&latin1(b))?;
                }
                b'U' => {
                    let n = self.u8()? as u64;
                    let b = self.take_len(n)?;
                    self.string(&latin1(b))?;
                }
                b'S' => {
                    let line = self.line()?;
                    let s = python_str_literal(line)
                        .ok_or_else(|| self.err("a protocol-0 string that is not quoted"))?;
                    self.string(&s)?;
                }
                b'B' => {
                    let n = self.u32()? as u64;
                    self.take_len(n)?;
                    self.value(Value::Bytes)?;
                }
                b'C' => {
                    let n = self.u8()? as u64;
                    self.take_len(n)?;
                    self.value(Value::Bytes)?;
                }
                0x8e | 0x96 => {
                    let n = self.u64()?;
                    self.take_len(n)?;
                    self.value(Value::Bytes)?;
                }
                b']' => self.new_open(Kind::List)?,
                b'}' => {
                    if !self.flat_dict() {
                        self.new_open(Kind::Dict)?;
                    }
                }
                0x8f => self.new_open(Kind::Set)?,
                b')' => {
                    let none = self.take_from(self.stack.len())?;
                    self.frozen(none, false)?;
                }
                b'l' => self.open_from_mark(Kind::List, "LIST")?,
                b'd' => self.open_from_mark(Kind::Dict, "DICT")?,
                b't' | 0x91 => {
                    let start = self.pop_mark()?;
                    let values = self.take_from(start)?;
                    self.frozen(values, op == 0x91)?;
                }
                0x85..=0x87 => {
                    let n = (op - 0x84) as usize;
                    if self.stack.len() < self.fence() + n {
                        return Err(self.err("TUPLE needs more values than the stack holds"));
                    }
                    let values = self.take_from(self.stack.len() - n)?;
                    self.frozen(values, false)?;
                }
                b'a' => {
                    let v = self.pop()?;
                    let slot =
                        self.target(self.stack.len().checked_sub(1), Kind::List, "APPEND")?;
                    self.open[slot].items.push(v);
                }
                b'e' => self.add_from_mark(Kind::List, "APPENDS")?,
                0x90 => self.add_from_mark(Kind::Set, "ADDITEMS")?,
                b'u' => self.add_from_mark(Kind::Dict, "SETITEMS")?,
                b's' => {
                    let v = self.pop()?;
                    let k = self.pop()?;
                    let slot =
                        self.target(self.stack.len().checked_sub(1), Kind::Dict, "SETITEM")?;
                    self.open[slot].items.extend_from_slice(&[k, v]);
                }
                b'q' => {
                    let id = self.u8()? as usize;
                    self.memo_put(id)?;
                }
                b'r' => {
                    let id = self.u32()?;
                    self.memo_put(id)?;
                }
                0x94 => {
                    let id = self.memo.len();
                    self.memo_put(id)?;
                }
                b'p' => {
                    let line = self.line()?;
                    let id = text_index(line).ok_or_else(|| self.err("PUT with a bad index"))?;
                    self.memo_put(id)?;
                }
                b'h' => {
                    let id = self.u8()? as usize;
                    self.memo_get(id)?;
                }
                b'j' => {
                    let id = self.u32()?;
                    self.memo_get(id)?;
                }
                b'g' => {
                    let line = self.line()?;
                    let id = text_index(line).ok_or_else(|| self.err("GET with a bad index"))?;
                    self.memo_get(id)?;
                }
                b'c' | b'i' => {
                    let module = self.line()?;
                    let name = self.line()?;
                    return Err(self.refuse_global(
                        &String::from_utf8_lossy(module),
                        &String::from_utf8_lossy(name),
                    ));
                }
                0x93 => {
                    let text = |item: Option<&Item<B::Made>>| match item {
                        Some(Item::Done(Value::Str(id))) => self.store.text(*id),
                        _ => "?",
                    };
                    let n = self.stack.len();
                    let name = text(n.checked_sub(1).and_then(|i| self.stack.get(i)));
                    let module = text(n.checked_sub(2).and_then(|i| self.stack.get(i)));
                    return Err(self.refuse_global(module, name));
                }
                b'R' => return Err(self.refuse("REDUCE (call)")),
                b'b' => return Err(self.refuse("BUILD")),
                b'o' => return Err(self.refuse("OBJ")),
                0x81 => return Err(self.refuse("NEWOBJ")),
                0x92 => return Err(self.refuse("NEWOBJ_EX")),
                b'P' | b'Q' => return Err(self.refuse("PERSID (persistent id)")),
                0x82..=0x84 => return Err(self.refuse("EXT (extension registry)")),
                0x97 | 0x98 => return Err(self.refuse("NEXT_BUFFER (out-of-band buffer)")),
                other => {
                    return Err(self.err(format!(
                        "byte 0x{other:02x} is not a pickle opcode (not a pickle, or a damaged one)"
                    )))
                }
            }
        }
    }
}

/// Where the items of a flat dict that begin at `at` end: the index of its `SETITEMS`, if
/// every opcode up to it is one [`Reader::flat_dict`] reads. Lengths only: nothing is read.
fn flat_items_end(d: &[u8], mut at: usize) -> Option<usize> {
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
fn seen_slot(items: &[u8]) -> Option<usize> {
    use std::hash::Hasher;
    if items.len() > SEEN_BYTES {
        return None;
    }
    let mut h = rustc_hash::FxHasher::default();
    h.write(items);
    Some(h.finish() as usize % SEEN_SLOTS)
}

fn text_index(line: &[u8]) -> Option<usize> {
    std::str::from_utf8(line).ok()?.trim().parse().ok()
}

fn latin1(b: &[u8]) -> String {
    b.iter().map(|&c| c as char).collect()
}

/// Python's `raw-unicode-escape`: `\uXXXX` and `\UXXXXXXXX`, every other byte Latin-1.
fn raw_unicode_escape(b: &[u8]) -> Option<String> {
    let mut out = String::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 1 < b.len() && (b[i + 1] == b'u' || b[i + 1] == b'U') {
            let n = if b[i + 1] == b'u' { 4 } else { 8 };
            let hex = std::str::from_utf8(b.get(i + 2..i + 2 + n)?).ok()?;
            out.push(char::from_u32(u32::from_str_radix(hex, 16).ok()?)?);
            i += 2 + n;
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    Some(out)
}

/// A protocol-0 `STRING` argument: a quoted Python 2 `str` literal.
fn python_str_literal(line: &[u8]) -> Option<String> {
    let q = *line.first()?;
    if line.len() < 2 || !(q == b'\'' || q == b'"') || *line.last()? != q {
        return None;
    }
    let body = &line[1..line.len() - 1];
    let mut out = String::new();
    let mut i = 0;
    while i < body.len() {
        let c = body[i];
        if c != b'\\' {
            out.push(c as char);
            i += 1;
            continue;
        }
        let e = *body.get(i + 1)?;
        i += 2;
        match e {
            b'n' => out.push('\n'),
            b't' => out.push('\t'),
            b'r' => out.push('\r'),
            b'x' => {
                let hex = std::str::from_utf8(body.get(i..i + 2)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()? as char);
                i += 2;
            }
            other => out.push(other as char),
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    type V = Value<Infallible>;

    fn parse(b: &[u8]) -> Result<Parsed<Infallible>, PickleError> {
        super::parse(b, &[], &mut Plain, None)
    }

    #[test]
    fn protocol_2_dict_of_list() {
        // pickle.dumps({'a': [1, 'x', None, True]}, protocol=2)
        let b = b"\x80\x02}q\x00X\x01\x00\x00\x00aq\x01]q\x02(K\x01X\x01\x00\x00\x00xq\x03N\x88es.";
        let p = parse(b).unwrap();
        let s = &p.store;
        let items = s.items(s.get(p.root, "a").unwrap());
        assert_eq!(items.len(), 4);
        assert_eq!(items[0].u64(), Some(1));
        assert_eq!(s.str(items[1]), Some("x"));
        assert_eq!(items[2], V::None);
        assert_eq!(items[3].bool(), Some(true));
    }

    #[test]
    fn long1_values() {
        // LONG1 of 2**63 (9 bytes), -1 (1 byte), 2**40
        let b = b"\x80\x02(\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00\x8a\x01\xff\x8a\x06\x00\x00\x00\x00\x00\x01t.";
        let p = parse(b).unwrap();
        let v = p.store.items(p.root);
        assert_eq!(v[0].u64(), Some(1 << 63));
        assert_eq!(v[1].i64(), Some(-1));
        assert_eq!(v[2].u64(), Some(1 << 40));
    }

    #[test]
    fn memoized_containers_are_shared() {
        // a = []; pickle.dumps([a, a], protocol=2): the second `a` is a GET of the first while
        // both wait for the outer APPENDS.
        let p = parse(b"\x80\x02]q\x00(]q\x01h\x01e.").unwrap();
        let v = p.store.items(p.root);
        assert_eq!(v.len(), 2);
        assert_eq!(v[0], v[1]);
        // d = {'x': {'f': 1}}; d['y'] = d['x']; pickle.dumps(d, protocol=4)
        let b = b"\x80\x04\x95\x18\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01x\x94}\x94\x8c\x01f\x94K\x01s\x8c\x01y\x94h\x02u.";
        let p = parse(b).unwrap();
        let (x, y) = (p.store.get(p.root, "x"), p.store.get(p.root, "y"));
        assert_eq!(x, y);
        assert_eq!(p.store.get(x.unwrap(), "f").and_then(|v| v.u64()), Some(1));
        // Strings are interned: the key and the text of `x` are one id.
        assert_eq!(p.store.str(p.store.items(p.root)[0]), Some("x"));
    }

    #[test]
    fn keys_are_interned_first() {
        let b = b"\x80\x02}q\x00X\x01\x00\x00\x00aK\x01s.";
        let p = super::parse(b, &["zero", "a"], &mut Plain, None).unwrap();
        assert_eq!(p.store.items(p.root)[0], V::Str(1));
    }

    /// A value as text, containers recursively.
    fn show(p: &Parsed<Infallible>, v: V) -> String {
        let s = &p.store;
        let all = |v: V| -> Vec<String> { s.items(v).iter().map(|&x| show(p, x)).collect() };
        match v {
            V::Str(_) => format!("{:?}", s.str(v).unwrap_or_default()),
            V::List(_) => format!("[{}]", all(v).join(", ")),
            V::Tuple(_) => format!("({})", all(v).join(", ")),
            V::Dict(_) => {
                let kv = all(v);
                let pairs: Vec<String> = kv.chunks(2).map(|p| p.join(": ")).collect();
                format!("{{{}}}", pairs.join(", "))
            }
            other => format!("{other:?}"),
        }
    }

    #[test]
    fn the_fast_path_of_flat_dicts_reads_as_the_general_one() {
        // f1 = {'filename': 'a.py', 'line': 3, 'name': 'f'}; f2 = {..., 'line': 300, ...}
        // obj = {'frames': [dict(f1), dict(f2), dict(f1), dict(f1)], 'n': [None, True, -5, 2.5]}
        // protocol 4 (the fast path, the last frame remembered from the third) and 0 (none).
        let p4 = b"\x80\x04\x95\x8c\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x06frames\x94]\x94(}\x94(\x8c\x08filename\x94\x8c\x04a.py\x94\x8c\x04line\x94K\x03\x8c\x04name\x94\x8c\x01f\x94u}\x94(h\x04\x8c\x04b.py\x94h\x06M,\x01h\x07\x8c\x01g\x94u}\x94(h\x04h\x05h\x06K\x03h\x07h\x08u}\x94(h\x04h\x05h\x06K\x03h\x07h\x08ue\x8c\x01n\x94]\x94(N\x88J\xfb\xff\xff\xffG@\x04\x00\x00\x00\x00\x00\x00eu.";
        let p0 = b"(dp0\nVframes\np1\n(lp2\n(dp3\nVfilename\np4\nVa.py\np5\nsVline\np6\nI3\nsVname\np7\nVf\np8\nsa(dp9\ng4\nVb.py\np10\nsg6\nI300\nsg7\nVg\np11\nsa(dp12\ng4\ng5\nsg6\nI3\nsg7\ng8\nsa(dp13\ng4\ng5\nsg6\nI3\nsg7\ng8\nsasVn\np14\n(lp15\nNaI01\naI-5\naF2.5\nas.";
        let (a, b) = (parse(p4).unwrap(), parse(p0).unwrap());
        let text = show(&a, a.root);
        assert_eq!(text, show(&b, b.root));
        assert!(
            text.contains(r#"{"filename": "b.py", "line": Int(300), "name": "g"}"#),
            "{text}"
        );
    }

    #[test]
    fn a_replaced_memo_entry_is_read_again() {
        // [] ; 1 PUT 5 POP ; {'k': GET 5} APPEND ; 2 PUT 5 POP ; {'k': GET 5} APPEND: the
        // second dict has the bytes of the first, but memo 5 holds 2 by then.
        let b = b"\x80\x04]K\x01q\x050}(\x8c\x01kh\x05uaK\x02q\x050}(\x8c\x01kh\x05ua.";
        let p = parse(b).unwrap();
        assert_eq!(show(&p, p.root), r#"[{"k": Int(1)}, {"k": Int(2)}]"#);
    }

    #[test]
    fn a_container_that_holds_itself_is_refused() {
        // l = []; l.append(l); pickle.dumps(l, protocol=2)
        let e = parse(b"\x80\x02]q\x00h\x00a.").unwrap_err();
        assert!(e.what.contains("already complete"), "{e}");
    }

    #[test]
    fn globals_and_calls_are_refused() {
        // pickle.dumps of an object whose __reduce__ returns (os.system, ('echo hi',)), protocol 2
        let b = b"\x80\x02cposix\nsystem\nq\x00X\x07\x00\x00\x00echo hiq\x01\x85q\x02Rq\x03.";
        let e = parse(b).unwrap_err();
        assert!(e.what.contains("posix.system"), "{e}");
        // protocol 4 uses STACK_GLOBAL
        let b = b"\x80\x04\x95\x1e\x00\x00\x00\x00\x00\x00\x00\x8c\x05posix\x94\x8c\x06system\x94\x93\x94\x8c\x07echo hi\x94\x85\x94R\x94.";
        let e = parse(b).unwrap_err();
        assert!(e.what.contains("posix.system"), "{e}");
        assert!(parse(b"\x80\x02N\x85R.")
            .unwrap_err()
            .what
            .contains("REDUCE"));
    }

    #[test]
    fn damaged_input_is_an_error() {
        for bad in [
            &b""[..],
            b"\x80\x02",
            b"\x80\x02X\xff\xff\xff\x7f",
            b"\x80\x02\x8d\xff\xff\xff\xff\xff\xff\xff\xff",
            b"\x80\x02h\x05.",
            b"\x80\x02e.",
            b"\x80\x02u.",
            b"\x80\x02}K\x01s.",
            b"\x80\x02N.extra",
            b"\x80\x02r\xff\xff\xff\xff",
            b"\x80\x02(N0.",
            b"\x80\x02N(a.",
            b"\x80\x02(.",
            b"\xfe",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn nesting_is_bounded() {
        let mut deep = b"\x80\x02".to_vec();
        deep.resize(MAX_STACK + 3, b']');
        let e = parse(&deep).unwrap_err();
        assert!(e.what.contains("nested too deep"), "{e}");
        let mut marks = b"\x80\x02".to_vec();
        marks.resize(MAX_STACK + 3, b'(');
        assert!(parse(&marks).unwrap_err().what.contains("nested too deep"));
    }

    #[test]
    fn protocol_0_text() {
        // pickle.dumps({'k': [1, 2.5, 'é']}, protocol=0)
        let b = b"(dp0\nVk\np1\n(lp2\nI1\naF2.5\naV\\u00e9\np3\nas.";
        let p = parse(b).unwrap();
        let l = p.store.items(p.store.get(p.root, "k").unwrap());
        assert_eq!(l[0].u64(), Some(1));
        assert_eq!(l[1].f64(), Some(2.5));
        assert_eq!(p.store.str(l[2]), Some("é"));
    }

    #[test]
    fn values_stay_small() {
        assert!(std::mem::size_of::<Item<Infallible>>() <= 16);
        assert!(std::mem::size_of::<Option<Item<(u32, u32)>>>() <= 16);
    }
}
