//! The reader's state and what opcodes share: the stack and its marks, the memo, the
//! containers being filled and how each completes (handed to the [`Build`]), values pushed.

use rustc_hash::FxHashMap;

use super::flat::Seen;
use super::{Build, PickleError, Store, Value, MAX_STACK, MEMO_SLACK};

/// A stack or memo entry: a value, or a dict, list or set still being filled.
#[derive(Debug, Clone, Copy)]
pub(super) enum Item<M> {
    Done(Value<M>),
    Open { slot: u32, serial: u32 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    List,
    Dict,
    Set,
}

impl Kind {
    pub(super) fn name(self) -> &'static str {
        match self {
            Kind::List => "a list",
            Kind::Dict => "a dict",
            Kind::Set => "a set",
        }
    }
}

/// A container being filled. Slots are reused; `serial` tells a container from the earlier
/// ones of its slot.
pub(super) struct Open<M> {
    pub(super) kind: Kind,
    pub(super) items: Vec<Value<M>>,
    /// The memo entry that holds it (`NO_MEMO`: none), set to its value when it completes.
    pub(super) memo: u32,
    pub(super) serial: u32,
    /// Referenced twice while open (`DUP`, a memo `GET`, a second memo entry): its value is
    /// remembered when it completes, for the other reference.
    pub(super) shared: bool,
}

pub(super) const NO_MEMO: u32 = u32::MAX;

pub(super) struct Reader<'a, 'b, B: Build> {
    pub(super) data: &'a [u8],
    pub(super) pos: usize,
    /// Offset of the opcode being executed.
    pub(super) op_at: usize,
    pub(super) build: &'b mut B,
    pub(super) stack: Vec<Item<B::Made>>,
    /// Stack lengths at each open MARK.
    pub(super) marks: Vec<usize>,
    pub(super) memo: Vec<Option<Item<B::Made>>>,
    pub(super) open: Vec<Open<B::Made>>,
    pub(super) free: Vec<u32>,
    /// The values of containers that completed while referenced twice, by serial.
    pub(super) shared_done: FxHashMap<u32, Value<B::Made>>,
    pub(super) serial: u32,
    pub(super) scratch: Vec<Value<B::Made>>,
    /// Small flat dicts read before, by their bytes ([`Reader::flat_dict`]).
    pub(super) seen: Vec<Seen<B::Made>>,
    /// Bumped when a memo entry is replaced: what `seen` holds was read with the old one.
    pub(super) seen_epoch: u32,
    pub(super) store: Store<B::Made>,
    pub(super) protocol: u8,
}

impl<'a, B: Build> Reader<'a, '_, B> {
    pub(super) fn err(&self, what: impl Into<String>) -> PickleError {
        PickleError {
            offset: self.op_at as u64,
            what: what.into(),
        }
    }

    pub(super) fn truncated(&self) -> PickleError {
        self.err("the pickle ends in the middle of an opcode (truncated file?)")
    }

    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8], PickleError> {
        if n > self.data.len() - self.pos {
            return Err(self.truncated());
        }
        let s = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    pub(super) fn u8(&mut self) -> Result<u8, PickleError> {
        Ok(self.take(1)?[0])
    }

    pub(super) fn u16(&mut self) -> Result<usize, PickleError> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]) as usize)
    }

    pub(super) fn u32(&mut self) -> Result<usize, PickleError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    }

    pub(super) fn u64(&mut self) -> Result<u64, PickleError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    /// `n` bytes whose count was read from the input, bounded by what is left of it.
    pub(super) fn take_len(&mut self, n: u64) -> Result<&'a [u8], PickleError> {
        if n > (self.data.len() - self.pos) as u64 {
            return Err(self.truncated());
        }
        self.take(n as usize)
    }

    /// A text line (protocol 0 arguments), without its newline.
    pub(super) fn line(&mut self) -> Result<&'a [u8], PickleError> {
        let rest = &self.data[self.pos..];
        let end = rest
            .iter()
            .position(|&b| b == b'\n')
            .ok_or_else(|| self.truncated())?;
        self.pos += end + 1;
        Ok(&rest[..end])
    }

    /// The stack length at the innermost open MARK: what lies below belongs to it.
    pub(super) fn fence(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    pub(super) fn push(&mut self, item: Item<B::Made>) -> Result<(), PickleError> {
        if self.stack.len() >= MAX_STACK {
            return Err(self.too_deep());
        }
        self.stack.push(item);
        Ok(())
    }

    pub(super) fn too_deep(&self) -> PickleError {
        self.err(format!(
            "the pickle holds more than {MAX_STACK} values at once on its stack (nested too deep; not a snapshot)"
        ))
    }

    pub(super) fn value(&mut self, v: Value<B::Made>) -> Result<(), PickleError> {
        self.push(Item::Done(v))
    }

    pub(super) fn missing(&self) -> PickleError {
        if self.marks.is_empty() {
            self.err("an opcode needs a value but the stack is empty")
        } else {
            self.err("an opcode found a MARK where it expected a value")
        }
    }

    /// The top of the stack, completed.
    pub(super) fn pop(&mut self) -> Result<Value<B::Made>, PickleError> {
        if self.stack.len() <= self.fence() {
            return Err(self.missing());
        }
        match self.stack.pop() {
            Some(Item::Done(v)) => Ok(v),
            Some(open) => self.complete(open),
            None => Err(self.missing()),
        }
    }

    pub(super) fn top(&self) -> Result<Item<B::Made>, PickleError> {
        if self.stack.len() <= self.fence() {
            return Err(self.missing());
        }
        self.stack.last().copied().ok_or_else(|| self.missing())
    }

    /// Closes the innermost MARK: the stack index of the first value above it.
    pub(super) fn pop_mark(&mut self) -> Result<usize, PickleError> {
        self.marks
            .pop()
            .ok_or_else(|| self.err("an opcode needs a MARK but none is open"))
    }

    pub(super) fn new_open(&mut self, kind: Kind) -> Result<(), PickleError> {
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
    pub(super) fn complete(&mut self, item: Item<B::Made>) -> Result<Value<B::Made>, PickleError> {
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
    pub(super) fn take_from(&mut self, start: usize) -> Result<Vec<Value<B::Made>>, PickleError> {
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
    pub(super) fn target(
        &self,
        at: Option<usize>,
        kind: Kind,
        op: &str,
    ) -> Result<usize, PickleError> {
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
    pub(super) fn add_from_mark(&mut self, kind: Kind, op: &str) -> Result<(), PickleError> {
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

    /// `LIST`, `DICT`: a new open container of the values above the innermost MARK.
    pub(super) fn open_from_mark(&mut self, kind: Kind, op: &str) -> Result<(), PickleError> {
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
    pub(super) fn frozen(
        &mut self,
        values: Vec<Value<B::Made>>,
        set: bool,
    ) -> Result<(), PickleError> {
        let id = self.store.keep(&values);
        self.scratch = values;
        let id = id.ok_or_else(|| self.err("the pickle holds more than 4 billion containers"))?;
        self.value(if set {
            Value::Set(id)
        } else {
            Value::Tuple(id)
        })
    }

    pub(super) fn string(&mut self, s: &str) -> Result<(), PickleError> {
        let id = self
            .store
            .intern(s)
            .ok_or_else(|| self.err("the pickle holds more than 4 billion strings"))?;
        self.value(Value::Str(id))
    }

    pub(super) fn utf8(&mut self, bytes: &[u8]) -> Result<(), PickleError> {
        match std::str::from_utf8(bytes) {
            Ok(s) => self.string(s),
            Err(_) => self.string(&String::from_utf8_lossy(bytes)),
        }
    }

    pub(super) fn int_le(&mut self, b: &[u8]) -> Result<(), PickleError> {
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

    pub(super) fn text_int(&mut self, line: &[u8]) -> Result<(), PickleError> {
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

    pub(super) fn memo_put(&mut self, id: usize) -> Result<(), PickleError> {
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

    pub(super) fn memo_get(&mut self, id: usize) -> Result<(), PickleError> {
        match self.memo.get(id).copied().flatten() {
            Some(item) => {
                self.share(item);
                self.push(item)
            }
            None => Err(self.err(format!("memo index {id} was never stored"))),
        }
    }

    /// A second reference to `item` is about to be pushed.
    pub(super) fn share(&mut self, item: Item<B::Made>) {
        if let Item::Open { slot, serial } = item {
            if let Some(o) = self.open.get_mut(slot as usize) {
                if o.serial == serial {
                    o.shared = true;
                }
            }
        }
    }

    pub(super) fn refuse_global(&self, module: &str, name: &str) -> PickleError {
        self.err(format!(
            "refused: the pickle imports `{module}.{name}` (a pickle that imports or calls anything can run code; \
             a PyTorch snapshot holds only plain data, and poolsight never runs code from a pickle)"
        ))
    }

    pub(super) fn refuse(&self, op: &str) -> PickleError {
        self.err(format!(
            "refused: opcode {op} builds an object (a pickle that builds objects can run code; \
             a PyTorch snapshot holds only plain data, and poolsight never runs code from a pickle)"
        ))
    }
}
