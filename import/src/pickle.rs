//! A pickle reader that never runs code.
//!
//! `pickle.load` executes what a pickle asks for: `GLOBAL`/`STACK_GLOBAL` import any callable,
//! `REDUCE` calls it (`os.system("...")` is four opcodes). A PyTorch memory snapshot is plain
//! data — dicts, lists, tuples, strings, numbers, booleans, `None` — so this reader implements
//! exactly the opcodes that build plain data (protocols 0 to 5) and refuses every opcode that
//! imports, calls or builds an object (`GLOBAL`, `STACK_GLOBAL`, `REDUCE`, `BUILD`, `INST`,
//! `OBJ`, `NEWOBJ`, `NEWOBJ_EX`, `PERSID`, `BINPERSID`, `EXT*`, out-of-band buffers) with an
//! error naming what it would have imported. Nothing is evaluated, ever.
//!
//! Why not `serde-pickle`: it is safe too (unknown globals stay opaque), but it clones a
//! memoized value at each reference while deserializing, and a snapshot references each
//! frame list and frame dict thousands of times; here a memo reference is a node id, so a
//! shared frame list is read once and stays shared, and strings stay in the input buffer.
//!
//! The result is a flat tree: [`Node`]s (16 bytes) in one vector, containers as chains of
//! runs of child ids in a second one. Every length read from the input is checked against the
//! bytes left before anything is allocated, so a hostile size cannot make it allocate.

use std::fmt;

/// What is wrong with a pickle, with the byte offset of the opcode at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} (byte {offset} of the pickle)")]
pub struct PickleError {
    pub offset: u64,
    pub what: String,
}

/// Which kind of value a node holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Tag {
    None,
    Bool,
    Int,
    /// An integer in (i64::MAX, u64::MAX].
    UInt,
    /// An integer outside the u64 and i64 ranges (its value is not kept).
    BigInt,
    Float,
    /// UTF-8 text in the input (`val` = offset, `len` = bytes).
    Str,
    /// Text decoded into [`Pickle::owned`] (protocol 0 escapes, Latin-1 `str8`): `val` = index.
    OwnedStr,
    Bytes,
    List,
    Tuple,
    Dict,
    Set,
}

/// One value. Containers: `val` = head run (low 32 bits) and tail run (high 32 bits) in
/// [`Pickle`]'s runs, `len` = number of children (dicts: key/value pairs).
#[derive(Debug, Clone, Copy)]
pub struct Node {
    pub tag: Tag,
    pub len: u32,
    pub val: u64,
}

#[derive(Debug, Clone, Copy)]
struct Run {
    start: u32,
    len: u32,
    next: u32,
}

const NO_RUN: u32 = u32::MAX;
/// A stack entry that is a MARK, not a node.
const MARK: u32 = u32::MAX;

/// A parsed pickle: its nodes, and the root's id.
pub struct Pickle<'a> {
    data: &'a [u8],
    nodes: Vec<Node>,
    runs: Vec<Run>,
    kids: Vec<u32>,
    owned: Vec<String>,
    pub root: u32,
    /// The protocol the pickle declared (0 or 1 when it has no PROTO opcode).
    pub protocol: u8,
}

impl fmt::Debug for Pickle<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pickle")
            .field("nodes", &self.nodes.len())
            .field("protocol", &self.protocol)
            .finish()
    }
}

/// Called with the bytes read so far, every few MB, for a progress bar.
pub type Progress<'p> = &'p mut dyn FnMut(u64);

impl<'a> Pickle<'a> {
    /// Parses `data`, which must hold exactly one pickle (trailing bytes are refused).
    pub fn parse(
        data: &'a [u8],
        progress: Option<Progress<'_>>,
    ) -> Result<Pickle<'a>, PickleError> {
        Parser::new(data).run(progress)
    }

    pub fn node(&self, id: u32) -> Node {
        self.nodes[id as usize]
    }

    pub fn tag(&self, id: u32) -> Tag {
        self.nodes[id as usize].tag
    }

    /// Children of a list, tuple or set (empty for anything else).
    pub fn items(&self, id: u32) -> Items<'_, 'a> {
        let n = self.node(id);
        let head = match n.tag {
            Tag::List | Tag::Tuple | Tag::Set | Tag::Dict => n.val as u32,
            _ => NO_RUN,
        };
        Items {
            p: self,
            run: head,
            at: 0,
        }
    }

    /// The key/value pairs of a dict (empty for anything else).
    pub fn pairs(&self, id: u32) -> Pairs<'_, 'a> {
        let inner = if self.tag(id) == Tag::Dict {
            self.items(id)
        } else {
            Items {
                p: self,
                run: NO_RUN,
                at: 0,
            }
        };
        Pairs { inner }
    }

    /// The value of `key` in a dict whose keys are strings.
    pub fn get(&self, dict: u32, key: &str) -> Option<u32> {
        self.pairs(dict)
            .find(|(k, _)| self.str(*k) == Some(key))
            .map(|(_, v)| v)
    }

    /// Text of a string node (bytes that are not UTF-8 never make a `Str`).
    pub fn str(&self, id: u32) -> Option<&str> {
        let n = self.node(id);
        match n.tag {
            // SAFETY-free: validated as UTF-8 when parsed.
            Tag::Str => std::str::from_utf8(self.span(n)).ok(),
            Tag::OwnedStr => self.owned.get(n.val as usize).map(String::as_str),
            _ => None,
        }
    }

    fn span(&self, n: Node) -> &'a [u8] {
        let start = n.val as usize;
        &self.data[start..start + n.len as usize]
    }

    /// An integer that fits u64 (negative ones do not).
    pub fn u64(&self, id: u32) -> Option<u64> {
        let n = self.node(id);
        match n.tag {
            Tag::Int => u64::try_from(n.val as i64).ok(),
            Tag::UInt => Some(n.val),
            Tag::Bool => Some(n.val),
            _ => None,
        }
    }

    pub fn i64(&self, id: u32) -> Option<i64> {
        let n = self.node(id);
        match n.tag {
            Tag::Int => Some(n.val as i64),
            Tag::Bool => Some(n.val as i64),
            _ => None,
        }
    }

    pub fn f64(&self, id: u32) -> Option<f64> {
        let n = self.node(id);
        match n.tag {
            Tag::Float => Some(f64::from_bits(n.val)),
            Tag::Int => Some(n.val as i64 as f64),
            Tag::UInt => Some(n.val as f64),
            _ => None,
        }
    }

    pub fn bool(&self, id: u32) -> Option<bool> {
        let n = self.node(id);
        match n.tag {
            Tag::Bool | Tag::Int => Some(n.val != 0),
            _ => None,
        }
    }

    /// A short name of what a node is, for error messages.
    pub fn kind_name(&self, id: u32) -> &'static str {
        match self.tag(id) {
            Tag::None => "None",
            Tag::Bool => "a bool",
            Tag::Int | Tag::UInt | Tag::BigInt => "an int",
            Tag::Float => "a float",
            Tag::Str | Tag::OwnedStr => "a str",
            Tag::Bytes => "bytes",
            Tag::List => "a list",
            Tag::Tuple => "a tuple",
            Tag::Dict => "a dict",
            Tag::Set => "a set",
        }
    }

    /// Bytes held by the parsed tree (not counting the input).
    pub fn heap_bytes(&self) -> usize {
        self.nodes.capacity() * std::mem::size_of::<Node>()
            + self.runs.capacity() * std::mem::size_of::<Run>()
            + self.kids.capacity() * 4
            + self.owned.iter().map(String::capacity).sum::<usize>()
    }
}

pub struct Items<'p, 'a> {
    p: &'p Pickle<'a>,
    run: u32,
    at: u32,
}

impl Iterator for Items<'_, '_> {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        loop {
            let r = *self.p.runs.get(self.run as usize)?;
            if self.at < r.len {
                let id = self.p.kids[(r.start + self.at) as usize];
                self.at += 1;
                return Some(id);
            }
            self.run = r.next;
            self.at = 0;
        }
    }
}

pub struct Pairs<'p, 'a> {
    inner: Items<'p, 'a>,
}

impl Iterator for Pairs<'_, '_> {
    type Item = (u32, u32);

    fn next(&mut self) -> Option<(u32, u32)> {
        Some((self.inner.next()?, self.inner.next()?))
    }
}

struct Parser<'a> {
    data: &'a [u8],
    pos: usize,
    /// Offset of the opcode being executed.
    op_at: usize,
    stack: Vec<u32>,
    memo: Vec<u32>,
    nodes: Vec<Node>,
    runs: Vec<Run>,
    kids: Vec<u32>,
    owned: Vec<String>,
    protocol: u8,
}

/// Memo ids are small, dense integers in every pickler; one far past the memo's size is
/// refused rather than allocated for.
const MEMO_SLACK: usize = 1 << 20;

impl<'a> Parser<'a> {
    fn new(data: &'a [u8]) -> Self {
        Parser {
            data,
            pos: 0,
            op_at: 0,
            stack: Vec::new(),
            memo: Vec::new(),
            // A node per ~10 bytes of a typical snapshot; reserving avoids most regrowth.
            nodes: Vec::with_capacity(data.len() / 12),
            runs: Vec::with_capacity(data.len() / 64),
            kids: Vec::with_capacity(data.len() / 6),
            owned: Vec::new(),
            protocol: 0,
        }
    }

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

    /// A length read from the input, bounded by what is left of it.
    fn len_of(&mut self, n: u64) -> Result<usize, PickleError> {
        if n > (self.data.len() - self.pos) as u64 {
            return Err(self.truncated());
        }
        Ok(n as usize)
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

    fn push_node(&mut self, n: Node) -> Result<(), PickleError> {
        let id = u32::try_from(self.nodes.len())
            .ok()
            .filter(|&id| id != MARK)
            .ok_or_else(|| self.err("the pickle holds more than 4 billion values"))?;
        self.nodes.push(n);
        self.stack.push(id);
        Ok(())
    }

    fn push(&mut self, tag: Tag, len: u32, val: u64) -> Result<(), PickleError> {
        self.push_node(Node { tag, len, val })
    }

    fn container(&mut self, tag: Tag) -> Result<(), PickleError> {
        self.push(tag, 0, (NO_RUN as u64) << 32 | NO_RUN as u64)
    }

    fn pop(&mut self) -> Result<u32, PickleError> {
        match self.stack.pop() {
            Some(MARK) => Err(self.err("an opcode found a MARK where it expected a value")),
            Some(id) => Ok(id),
            None => Err(self.err("an opcode needs a value but the stack is empty")),
        }
    }

    fn top(&self) -> Result<u32, PickleError> {
        match self.stack.last() {
            Some(&MARK) | None => Err(self.err("an opcode needs a value but there is none")),
            Some(&id) => Ok(id),
        }
    }

    /// Index just past the topmost MARK.
    fn mark_start(&self) -> Result<usize, PickleError> {
        self.stack
            .iter()
            .rposition(|&x| x == MARK)
            .map(|i| i + 1)
            .ok_or_else(|| self.err("an opcode needs a MARK but none is open"))
    }

    /// Appends `items` (node ids) as a new run of the container `target`.
    fn extend(&mut self, target: u32, items: std::ops::Range<usize>) -> Result<(), PickleError> {
        let count = items.len();
        if count == 0 {
            return Ok(());
        }
        let start = self.kids.len();
        self.kids.extend_from_slice(&self.stack[items]);
        let (start, len) = match (u32::try_from(start), u32::try_from(count)) {
            (Ok(s), Ok(l)) if s.checked_add(l).is_some() => (s, l),
            _ => return Err(self.err("the pickle's containers hold more than 4 billion items")),
        };
        let run = self.runs.len() as u32;
        self.runs.push(Run {
            start,
            len,
            next: NO_RUN,
        });
        let node = &mut self.nodes[target as usize];
        let tail = (node.val >> 32) as u32;
        if tail == NO_RUN {
            node.val = (run as u64) << 32 | run as u64;
        } else {
            node.val = (run as u64) << 32 | (node.val & 0xffff_ffff);
            self.runs[tail as usize].next = run;
        }
        let per = if node.tag == Tag::Dict { 2 } else { 1 };
        node.len = node.len.saturating_add(len / per);
        Ok(())
    }

    fn check_container(&self, id: u32, want: &[Tag], op: &str) -> Result<(), PickleError> {
        let tag = self.nodes[id as usize].tag;
        if want.contains(&tag) {
            Ok(())
        } else {
            Err(self.err(format!("{op} applied to a {tag:?} value")))
        }
    }

    /// Pops the items above the topmost MARK into the container below it.
    fn fill_from_mark(&mut self, want: &[Tag], op: &str, pairs: bool) -> Result<(), PickleError> {
        let start = self.mark_start()?;
        if pairs && (self.stack.len() - start) % 2 != 0 {
            return Err(self.err(format!("{op} with an odd number of keys and values")));
        }
        if self.stack[start..].contains(&MARK) {
            return Err(self.err(format!("{op} found a MARK among its items")));
        }
        let target = match start.checked_sub(2).map(|i| self.stack[i]) {
            Some(t) if t != MARK => t,
            _ => return Err(self.err(format!("{op} has no container to add to"))),
        };
        self.check_container(target, want, op)?;
        self.extend(target, start..self.stack.len())?;
        self.stack.truncate(start - 1);
        Ok(())
    }

    fn str_node(&mut self, bytes: &'a [u8]) -> Result<(), PickleError> {
        if std::str::from_utf8(bytes).is_err() {
            return self.owned_str(String::from_utf8_lossy(bytes).into_owned());
        }
        let off = bytes.as_ptr() as usize - self.data.as_ptr() as usize;
        let len = u32::try_from(bytes.len()).map_err(|_| self.err("a string over 4 GB"))?;
        self.push(Tag::Str, len, off as u64)
    }

    fn owned_str(&mut self, s: String) -> Result<(), PickleError> {
        self.owned.push(s);
        self.push(Tag::OwnedStr, 0, (self.owned.len() - 1) as u64)
    }

    fn bytes_node(&mut self, bytes: &'a [u8]) -> Result<(), PickleError> {
        let off = bytes.as_ptr() as usize - self.data.as_ptr() as usize;
        let len = u32::try_from(bytes.len()).map_err(|_| self.err("a bytes value over 4 GB"))?;
        self.push(Tag::Bytes, len, off as u64)
    }

    fn int_le(&mut self, b: &[u8]) -> Result<(), PickleError> {
        if b.is_empty() {
            return self.push(Tag::Int, 0, 0);
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
            return self.push(Tag::Int, 0, i64::from_le_bytes(a) as u64);
        }
        if n == 9 && !negative && b[8] == 0 {
            let mut a = [0; 8];
            a.copy_from_slice(&b[..8]);
            return self.push(Tag::UInt, 0, u64::from_le_bytes(a));
        }
        self.push(Tag::BigInt, 0, 0)
    }

    fn text_int(&mut self, line: &[u8]) -> Result<(), PickleError> {
        let t = std::str::from_utf8(line)
            .unwrap_or("")
            .trim_end_matches('L');
        match t {
            "00" => return self.push(Tag::Bool, 0, 0),
            "01" => return self.push(Tag::Bool, 0, 1),
            _ => {}
        }
        if let Ok(v) = t.parse::<i64>() {
            self.push(Tag::Int, 0, v as u64)
        } else if let Ok(v) = t.parse::<u64>() {
            self.push(Tag::UInt, 0, v)
        } else if !t.is_empty()
            && t.trim_start_matches('-')
                .bytes()
                .all(|c| c.is_ascii_digit())
        {
            self.push(Tag::BigInt, 0, 0)
        } else {
            Err(self.err("a text integer that is not a number"))
        }
    }

    fn memo_put(&mut self, id: usize) -> Result<(), PickleError> {
        let top = self.top()?;
        if id >= self.memo.len() {
            if id > self.memo.len() + MEMO_SLACK {
                return Err(self.err(format!("memo index {id} is far past the memo's size")));
            }
            self.memo.resize(id + 1, MARK);
        }
        self.memo[id] = top;
        Ok(())
    }

    fn memo_get(&mut self, id: usize) -> Result<(), PickleError> {
        match self.memo.get(id) {
            Some(&v) if v != MARK => {
                self.stack.push(v);
                Ok(())
            }
            _ => Err(self.err(format!("memo index {id} was never stored"))),
        }
    }

    fn refuse_global(&self, module: &[u8], name: &[u8]) -> PickleError {
        let m = String::from_utf8_lossy(module);
        let n = String::from_utf8_lossy(name);
        self.err(format!(
            "refused: the pickle imports `{m}.{n}` (a pickle that imports or calls anything can run code; \
             a PyTorch snapshot holds only plain data, and poolsight never runs code from a pickle)"
        ))
    }

    fn refuse(&self, op: &str) -> PickleError {
        self.err(format!(
            "refused: opcode {op} builds an object (a pickle that builds objects can run code; \
             a PyTorch snapshot holds only plain data, and poolsight never runs code from a pickle)"
        ))
    }

    fn run(mut self, mut progress: Option<Progress<'_>>) -> Result<Pickle<'a>, PickleError> {
        let mut next_report = 8 << 20;
        loop {
            if self.pos >= next_report {
                if let Some(p) = progress.as_mut() {
                    p(self.pos as u64);
                }
                next_report = self.pos + (8 << 20);
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
                    if !self.stack.is_empty() {
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
                    return Ok(Pickle {
                        data: self.data,
                        nodes: self.nodes,
                        runs: self.runs,
                        kids: self.kids,
                        owned: self.owned,
                        root,
                        protocol: self.protocol,
                    });
                }
                b'(' => self.stack.push(MARK),
                b'0' => {
                    match self.stack.pop() {
                        Some(_) => {}
                        None => return Err(self.err("POP on an empty stack")),
                    };
                }
                b'1' => {
                    let start = self.mark_start()?;
                    self.stack.truncate(start - 1);
                }
                b'2' => {
                    let top = self.top()?;
                    self.stack.push(top);
                }
                b'N' => self.push(Tag::None, 0, 0)?,
                0x88 => self.push(Tag::Bool, 0, 1)?,
                0x89 => self.push(Tag::Bool, 0, 0)?,
                b'J' => {
                    let b = self.take(4)?;
                    let v = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                    self.push(Tag::Int, 0, v as i64 as u64)?;
                }
                b'K' => {
                    let v = self.u8()?;
                    self.push(Tag::Int, 0, v as u64)?;
                }
                b'M' => {
                    let v = self.u16()?;
                    self.push(Tag::Int, 0, v as u64)?;
                }
                0x8a => {
                    let n = self.u8()? as usize;
                    let b = self.take(n)?;
                    self.int_le(b)?;
                }
                0x8b => {
                    let n = self.u32()? as u64;
                    let n = self.len_of(n)?;
                    let b = self.take(n)?;
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
                    self.push(Tag::Float, 0, v.to_bits())?;
                }
                b'G' => {
                    let b = self.take(8)?;
                    let mut a = [0u8; 8];
                    a.copy_from_slice(b);
                    self.push(Tag::Float, 0, f64::from_be_bytes(a).to_bits())?;
                }
                b'X' => {
                    let n = self.u32()? as u64;
                    let n = self.len_of(n)?;
                    let b = self.take(n)?;
                    self.str_node(b)?;
                }
                0x8c => {
                    let n = self.u8()? as usize;
                    let b = self.take(n)?;
                    self.str_node(b)?;
                }
                0x8d => {
                    let n = self.u64()?;
                    let n = self.len_of(n)?;
                    let b = self.take(n)?;
                    self.str_node(b)?;
                }
                b'V' => {
                    let line = self.line()?;
                    let s = raw_unicode_escape(line)
                        .ok_or_else(|| self.err("a protocol-0 unicode string with a bad escape"))?;
                    self.owned_str(s)?;
                }
                b'T' => {
                    let n = self.u32()? as u64;
                    let n = self.len_of(n)?;
                    let b = self.take(n)?;
                    self.owned_str(latin1(b))?;
                }
                b'U' => {
                    let n = self.u8()? as usize;
                    let b = self.take(n)?;
                    self.owned_str(latin1(b))?;
                }
                b'S' => {
                    let line = self.line()?;
                    let s = python_str_literal(line)
                        .ok_or_else(|| self.err("a protocol-0 string that is not quoted"))?;
                    self.owned_str(s)?;
                }
                b'B' => {
                    let n = self.u32()? as u64;
                    let n = self.len_of(n)?;
                    let b = self.take(n)?;
                    self.bytes_node(b)?;
                }
                b'C' => {
                    let n = self.u8()? as usize;
                    let b = self.take(n)?;
                    self.bytes_node(b)?;
                }
                0x8e | 0x96 => {
                    let n = self.u64()?;
                    let n = self.len_of(n)?;
                    let b = self.take(n)?;
                    self.bytes_node(b)?;
                }
                b']' => self.container(Tag::List)?,
                b')' => self.container(Tag::Tuple)?,
                b'}' => self.container(Tag::Dict)?,
                0x8f => self.container(Tag::Set)?,
                b'l' | b't' | b'd' | 0x91 => {
                    let start = self.mark_start()?;
                    let tag = match op {
                        b'l' => Tag::List,
                        b't' => Tag::Tuple,
                        b'd' => Tag::Dict,
                        _ => Tag::Set,
                    };
                    if tag == Tag::Dict && (self.stack.len() - start) % 2 != 0 {
                        return Err(self.err("DICT with an odd number of keys and values"));
                    }
                    let items: Vec<u32> = self.stack.drain(start..).collect();
                    self.stack.pop();
                    self.container(tag)?;
                    let id = self.top()?;
                    let at = self.stack.len();
                    self.stack.extend_from_slice(&items);
                    self.extend(id, at..at + items.len())?;
                    self.stack.truncate(at);
                }
                0x85..=0x87 => {
                    let n = (op - 0x84) as usize;
                    if self.stack.len() < n || self.stack[self.stack.len() - n..].contains(&MARK) {
                        return Err(self.err("TUPLE needs more values than the stack holds"));
                    }
                    let items: Vec<u32> = self.stack.split_off(self.stack.len() - n);
                    self.container(Tag::Tuple)?;
                    let id = self.top()?;
                    let at = self.stack.len();
                    self.stack.extend_from_slice(&items);
                    self.extend(id, at..at + n)?;
                    self.stack.truncate(at);
                }
                b'a' => {
                    let v = self.pop()?;
                    let list = self.top()?;
                    self.check_container(list, &[Tag::List], "APPEND")?;
                    let at = self.stack.len();
                    self.stack.push(v);
                    self.extend(list, at..at + 1)?;
                    self.stack.truncate(at);
                }
                b'e' => self.fill_from_mark(&[Tag::List], "APPENDS", false)?,
                0x90 => self.fill_from_mark(&[Tag::Set], "ADDITEMS", false)?,
                b'u' => self.fill_from_mark(&[Tag::Dict], "SETITEMS", true)?,
                b's' => {
                    let v = self.pop()?;
                    let k = self.pop()?;
                    let dict = self.top()?;
                    self.check_container(dict, &[Tag::Dict], "SETITEM")?;
                    let at = self.stack.len();
                    self.stack.push(k);
                    self.stack.push(v);
                    self.extend(dict, at..at + 2)?;
                    self.stack.truncate(at);
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
                b'c' => {
                    let module = self.line()?;
                    let name = self.line()?;
                    return Err(self.refuse_global(module, name));
                }
                b'i' => {
                    let module = self.line()?;
                    let name = self.line()?;
                    return Err(self.refuse_global(module, name));
                }
                0x93 => {
                    let name = self.stack.pop();
                    let module = self.stack.pop();
                    let text = |id: Option<u32>| -> Vec<u8> {
                        match id.and_then(|i| self.nodes.get(i as usize)) {
                            Some(n) if n.tag == Tag::Str => {
                                let s = n.val as usize;
                                self.data[s..s + n.len as usize].to_vec()
                            }
                            Some(n) if n.tag == Tag::OwnedStr => self
                                .owned
                                .get(n.val as usize)
                                .map(|s| s.as_bytes().to_vec())
                                .unwrap_or_default(),
                            _ => b"?".to_vec(),
                        }
                    };
                    let (m, n) = (text(module), text(name));
                    return Err(self.refuse_global(&m, &n));
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

    fn parse(b: &[u8]) -> Result<Pickle<'_>, PickleError> {
        Pickle::parse(b, None)
    }

    #[test]
    fn protocol_2_dict_of_list() {
        // pickle.dumps({'a': [1, 'x', None, True]}, protocol=2)
        let b = b"\x80\x02}q\x00X\x01\x00\x00\x00aq\x01]q\x02(K\x01X\x01\x00\x00\x00xq\x03N\x88es.";
        let p = parse(b).unwrap();
        let a = p.get(p.root, "a").unwrap();
        let items: Vec<u32> = p.items(a).collect();
        assert_eq!(items.len(), 4);
        assert_eq!(p.u64(items[0]), Some(1));
        assert_eq!(p.str(items[1]), Some("x"));
        assert_eq!(p.tag(items[2]), Tag::None);
        assert_eq!(p.bool(items[3]), Some(true));
    }

    #[test]
    fn long1_values() {
        // LONG1 of 2**63 (9 bytes), -1 (1 byte), 2**40
        let b = b"\x80\x02(\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00\x8a\x01\xff\x8a\x06\x00\x00\x00\x00\x00\x01t.";
        let p = parse(b).unwrap();
        let v: Vec<u32> = p.items(p.root).collect();
        assert_eq!(p.u64(v[0]), Some(1 << 63));
        assert_eq!(p.i64(v[1]), Some(-1));
        assert_eq!(p.u64(v[2]), Some(1 << 40));
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
            b"\x80\x02h\x05.",
            b"\x80\x02e.",
            b"\x80\x02u.",
            b"\x80\x02}K\x01s.",
            b"\x80\x02N.extra",
            b"\x80\x02r\xff\xff\xff\xff",
            b"\xfe",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn protocol_0_text() {
        // pickle.dumps({'k': [1, 2.5, 'é']}, protocol=0)
        let b = b"(dp0\nVk\np1\n(lp2\nI1\naF2.5\naV\\u00e9\np3\nas.";
        let p = parse(b).unwrap();
        let l: Vec<u32> = p.items(p.get(p.root, "k").unwrap()).collect();
        assert_eq!(p.u64(l[0]), Some(1));
        assert_eq!(p.f64(l[1]), Some(2.5));
        assert_eq!(p.str(l[2]), Some("é"));
    }
}
