//! A flattened view of a trace for the scope, TraceHook and epoch tests, built on the analyzer's
//! verified reader: the tests read back exactly what any user of `poolsight info` would.

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use poolsight::analyzer::read::DeviceDef;
use poolsight::analyzer::{ChunkKind, Trace as Verified};
use poolsight::schema::fb;

use super::scratch;

/// A fresh path in this test process's scratch directory, removed when the process exits.
pub fn trace_path(name: &str) -> PathBuf {
    scratch::process_file(&format!("{name}.pstrace"))
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameInfo {
    pub kind: fb::FrameKind,
    pub phase: fb::Phase,
    pub file: String,
    pub line: u32,
    pub name: String,
}

#[derive(Debug, Default)]
pub struct Trace {
    pub frames: HashMap<u32, FrameInfo>,
    /// stack id -> (parent, frame)
    pub stacks: HashMap<u32, (u32, u32)>,
    pub devices: Vec<DeviceDef>,
    /// Memory events in chunk order, rebase markers removed.
    pub mem: Vec<fb::MemEvent>,
    /// (stack, duration), rebase markers removed.
    pub scopes: Vec<(u32, u64)>,
    pub marks: Vec<fb::MarkEvent>,
}

impl Trace {
    pub fn read(path: &Path) -> Trace {
        let v = Verified::open(path).expect("trace opens");
        assert!(v.warnings.is_empty(), "{:?}", v.warnings);
        let defs = &v.defs;
        let frames = defs
            .frames
            .iter()
            .map(|(&id, f)| {
                let info = FrameInfo {
                    kind: f.kind,
                    phase: f.phase,
                    file: defs.string(f.file).to_owned(),
                    line: f.line,
                    name: defs.string(f.name).to_owned(),
                };
                (id, info)
            })
            .collect();
        let mut t = Trace {
            frames,
            stacks: defs.stacks.clone(),
            devices: defs.devices.clone(),
            ..Trace::default()
        };
        for c in &v.chunks {
            match c.kind {
                ChunkKind::Mem => t.mem.extend(v.mem_timeline(c).map(|(_, e)| e)),
                ChunkKind::Scope => t
                    .scopes
                    .extend(v.scope_timeline(c).map(|(_, e)| (e.stack(), e.duration()))),
                ChunkKind::Mark => t.marks.extend(v.mark_events(c).iter().copied()),
                ChunkKind::Defs | ChunkKind::Footer => {}
            }
        }
        t
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
