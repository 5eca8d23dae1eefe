//! The opcode loop: what each opcode of protocols 0 to 5 does, and the ones refused.

use super::reader::{Item, Kind, Reader};
use super::{Build, Parsed, PickleError, Progress, Value, MAX_STACK};

impl<'a, B: Build> Reader<'a, '_, B> {
    pub(super) fn run(
        mut self,
        mut progress: Option<Progress<'_>>,
    ) -> Result<Parsed<B::Made>, PickleError> {
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

pub(super) fn text_index(line: &[u8]) -> Option<usize> {
    std::str::from_utf8(line).ok()?.trim().parse().ok()
}

pub(super) fn latin1(b: &[u8]) -> String {
    b.iter().map(|&c| c as char).collect()
}

/// Python's `raw-unicode-escape`: `\uXXXX` and `\UXXXXXXXX`, every other byte Latin-1.
pub(super) fn raw_unicode_escape(b: &[u8]) -> Option<String> {
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
pub(super) fn python_str_literal(line: &[u8]) -> Option<String> {
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
