//! A minimal trace reader for the recorder's own tests, so they do not depend on the analyzer
//! (which the recorder must never depend on). It walks the chunk region as trace.fbs lays it
//! out and keeps what the tests look at; it trusts the file, unlike the analyzer's reader.

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use poolsight_recorder::fb;

/// A fresh path under Cargo's per-test temporary directory.
pub fn trace_path(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    dir.join(format!("{name}-{}.pstrace", std::process::id()))
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameInfo {
    pub kind: fb::FrameKind,
    pub phase: fb::Phase,
    pub file: String,
    pub line: u32,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    pub id: u32,
    pub name: String,
    pub capacity: u64,
    pub allocation_unit: u64,
}

#[derive(Debug, Default)]
pub struct Trace {
    pub strings: HashMap<u32, String>,
    pub frames: HashMap<u32, FrameInfo>,
    /// stack id -> (parent, frame)
    pub stacks: HashMap<u32, (u32, u32)>,
    pub devices: Vec<DeviceInfo>,
    /// Memory events in chunk order, rebase markers removed.
    pub mem: Vec<fb::MemEvent>,
    /// (stack, duration), rebase markers removed.
    pub scopes: Vec<(u32, u64)>,
    pub marks: Vec<fb::MarkEvent>,
}

impl Trace {
    pub fn read(path: &Path) -> Trace {
        let data = std::fs::read(path).expect("trace file readable");
        assert_eq!(&data[..8], b"PSTRACE\0", "magic");
        let data_offset = u32::from_le_bytes(data[12..16].try_into().unwrap()) as usize;
        let mut chunks = Vec::new();
        let mut off = data_offset;
        while off + 4 <= data.len() {
            let size = u32::from_le_bytes(data[off..off + 4].try_into().unwrap()) as usize;
            if size == 0 {
                break;
            }
            let buf = &data[off..off + 4 + size];
            let chunk = fb::size_prefixed_root_as_chunk(buf).expect("chunk verifies");
            chunks.push((chunk.meta().seq(), off));
            off = (off + 4 + size + 7) & !7;
        }
        // Definitions are written before any event that uses them, in `seq` order.
        chunks.sort();
        let mut t = Trace::default();
        for (_, off) in chunks {
            let size = u32::from_le_bytes(data[off..off + 4].try_into().unwrap()) as usize;
            let chunk = fb::size_prefixed_root_as_chunk(&data[off..off + 4 + size]).unwrap();
            t.absorb(chunk);
        }
        t
    }

    fn absorb(&mut self, chunk: fb::Chunk<'_>) {
        if let Some(defs) = chunk.body_as_defs() {
            for s in defs.strings().into_iter().flatten() {
                self.strings
                    .insert(s.id(), s.text().unwrap_or("").to_owned());
            }
            for f in defs.frames().into_iter().flatten() {
                let info = FrameInfo {
                    kind: f.kind(),
                    phase: f.phase(),
                    file: self.strings[&f.file()].clone(),
                    line: f.line(),
                    name: self.strings[&f.name()].clone(),
                };
                self.frames.insert(f.id(), info);
            }
            for s in defs.stacks().into_iter().flatten() {
                self.stacks.insert(s.id(), (s.parent(), s.frame()));
            }
            for d in defs.devices().into_iter().flatten() {
                self.devices.push(DeviceInfo {
                    id: d.id(),
                    name: d.name().unwrap_or("").to_owned(),
                    capacity: d.capacity(),
                    allocation_unit: d.allocation_unit(),
                });
            }
        } else if let Some(m) = chunk.body_as_mem_events() {
            let events = m.events().into_iter().flatten();
            self.mem
                .extend(events.filter(|e| e.kind() != fb::MemKind::Rebase).copied());
        } else if let Some(s) = chunk.body_as_scope_events() {
            let events = s.events().into_iter().flatten().filter(|e| e.stack() != 0);
            self.scopes
                .extend(events.map(|e| (e.stack(), e.duration())));
        } else if let Some(m) = chunk.body_as_mark_events() {
            self.marks.extend(m.events().into_iter().flatten().copied());
        }
    }

    pub fn parent(&self, stack: u32) -> u32 {
        self.stacks[&stack].0
    }

    /// The innermost frame of `stack`.
    pub fn frame(&self, stack: u32) -> &FrameInfo {
        &self.frames[&self.stacks[&stack].1]
    }

    /// Frame names of `stack`, outermost first.
    pub fn names(&self, stack: u32) -> Vec<String> {
        let mut out = Vec::new();
        let mut s = stack;
        while s != 0 {
            out.push(self.frame(s).name.clone());
            s = self.parent(s);
        }
        out.reverse();
        out
    }

    pub fn mem_of(&self, kind: fb::MemKind) -> Vec<fb::MemEvent> {
        self.mem
            .iter()
            .filter(|e| e.kind() == kind)
            .copied()
            .collect()
    }
}
