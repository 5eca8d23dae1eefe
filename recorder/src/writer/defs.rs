//! Interning: strings, frames and stacks get small ids, defined once in a `Defs` chunk that is
//! written (and sealed) before the id is returned, so no event can reach the file ahead of the
//! definition it refers to — even if the process is killed right after.
//!
//! This runs under a mutex, which is fine: callers keep their own caches in front (a stack is
//! interned once per distinct calling context, not once per event).

use std::collections::HashMap;

use flatbuffers::FlatBufferBuilder;
use poolsight_schema::{align8, fb};

use super::chunk::write_sealed;
use super::Shared;
use crate::kinds::{FrameKind, Phase};
use poolsight_schema::finish_chunk;

/// A frame as the trace stores it: `file:line:name`, plus what opened it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Frame {
    pub kind: FrameKind,
    pub phase: Phase,
    pub file: String,
    pub line: u32,
    pub name: String,
}

/// A device as the trace's readers see it (the format's one definition).
pub use poolsight_schema::header::Device as DeviceInfo;

#[derive(Default)]
pub(crate) struct Interner {
    strings: HashMap<String, u32>,
    frames: HashMap<(FrameKind, Phase, u32, u32, u32), u32>,
    stacks: HashMap<(u32, u32), u32>,
    pending: Pending,
}

#[derive(Default)]
struct Pending {
    strings: Vec<(u32, String)>,
    frames: Vec<fb::FrameDef>,
    stacks: Vec<fb::StackDef>,
    threads: Vec<(u32, u64, String)>,
    devices: Vec<DeviceInfo>,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.strings.is_empty()
            && self.frames.is_empty()
            && self.stacks.is_empty()
            && self.threads.is_empty()
            && self.devices.is_empty()
    }
}

impl Interner {
    fn string(&mut self, s: &str) -> u32 {
        if let Some(&id) = self.strings.get(s) {
            return id;
        }
        let id = self.strings.len() as u32 + 1;
        self.strings.insert(s.to_owned(), id);
        self.pending.strings.push((id, s.to_owned()));
        id
    }

    fn frame(&mut self, f: &Frame) -> u32 {
        let file = self.string(&f.file);
        let name = self.string(&f.name);
        let key = (f.kind, f.phase, f.line, file, name);
        if let Some(&id) = self.frames.get(&key) {
            return id;
        }
        let id = self.frames.len() as u32 + 1;
        self.frames.insert(key, id);
        self.pending.frames.push(fb::FrameDef::new(
            id,
            f.kind.into(),
            f.phase.into(),
            f.line,
            file,
            name,
        ));
        id
    }

    fn stack(&mut self, parent: u32, frame: u32) -> u32 {
        if let Some(&id) = self.stacks.get(&(parent, frame)) {
            return id;
        }
        let id = self.stacks.len() as u32 + 1;
        self.stacks.insert((parent, frame), id);
        self.pending
            .stacks
            .push(fb::StackDef::new(id, parent, frame));
        id
    }
}

impl Shared {
    fn with_interner<R>(&self, f: impl FnOnce(&mut Interner) -> R) -> R {
        if self.forked() {
            // A forked child writes no definitions to its parent's trace, and takes no lock
            // that a thread of the parent may have held when it forked.
            return f(&mut Interner::default());
        }
        let mut guard = match self.interner.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        let out = f(&mut guard);
        if !guard.pending.is_empty() {
            let pending = std::mem::take(&mut guard.pending);
            self.write_defs(&pending);
        }
        out
    }

    pub(crate) fn intern_string(&self, s: &str) -> u32 {
        self.with_interner(|i| i.string(s))
    }

    pub(crate) fn intern_frame(&self, frame: &Frame) -> u32 {
        self.with_interner(|i| i.frame(frame))
    }

    pub(crate) fn intern_stack(&self, parent: u32, frame: u32) -> u32 {
        self.with_interner(|i| i.stack(parent, frame))
    }

    /// Interns `frames`, then each stack of indices into them (outermost first), as one
    /// definitions chunk; returns each stack's innermost id.
    pub(crate) fn intern_stacks<S: AsRef<[u32]>>(
        &self,
        frames: &[Frame],
        stacks: &[S],
    ) -> Vec<u32> {
        self.with_interner(|i| {
            let ids: Vec<u32> = frames.iter().map(|f| i.frame(f)).collect();
            stacks
                .iter()
                .map(|s| {
                    s.as_ref()
                        .iter()
                        .filter_map(|&f| ids.get(f as usize))
                        .fold(0, |parent, &f| i.stack(parent, f))
                })
                .collect()
        })
    }

    /// Interns a whole stack, outermost frame first; returns the innermost stack id.
    pub(crate) fn intern_frames(&self, frames: &[Frame]) -> u32 {
        self.with_interner(|i| {
            frames.iter().fold(0, |parent, f| {
                let fid = i.frame(f);
                i.stack(parent, fid)
            })
        })
    }

    pub(crate) fn define_thread(&self, id: u32, os_tid: u64, name: &str) {
        self.with_interner(|i| i.pending.threads.push((id, os_tid, name.to_owned())));
    }

    pub(crate) fn define_device(&self, device: DeviceInfo) {
        self.with_interner(|i| i.pending.devices.push(device));
    }

    fn write_defs(&self, p: &Pending) {
        let mut fbb = FlatBufferBuilder::with_capacity(1024);
        let strings: Vec<_> = p
            .strings
            .iter()
            .map(|(id, s)| {
                let text = fbb.create_string(s);
                fb::StringDef::create(
                    &mut fbb,
                    &fb::StringDefArgs {
                        id: *id,
                        text: Some(text),
                    },
                )
            })
            .collect();
        let threads: Vec<_> = p
            .threads
            .iter()
            .map(|(id, os_tid, name)| {
                let name = fbb.create_string(name);
                fb::ThreadDef::create(
                    &mut fbb,
                    &fb::ThreadDefArgs {
                        id: *id,
                        os_tid: *os_tid,
                        name: Some(name),
                    },
                )
            })
            .collect();
        let devices: Vec<_> = p.devices.iter().map(|d| d.build(&mut fbb)).collect();
        let strings = fbb.create_vector(&strings);
        let frames = fbb.create_vector(&p.frames);
        let stacks = fbb.create_vector(&p.stacks);
        let threads = fbb.create_vector(&threads);
        let devices = fbb.create_vector(&devices);
        let defs = fb::Defs::create(
            &mut fbb,
            &fb::DefsArgs {
                strings: Some(strings),
                frames: Some(frames),
                stacks: Some(stacks),
                threads: Some(threads),
                devices: Some(devices),
            },
        );
        let bytes = finish_chunk(&mut fbb, fb::ChunkBody::Defs, defs.as_union_value());
        match self.file.reserve(align8(bytes.len() as u64)) {
            Some(region) => {
                let seq = self.next_seq();
                write_sealed(&self.file, &region, &bytes, seq);
            }
            None => self.count_dropped(1),
        }
    }
}
