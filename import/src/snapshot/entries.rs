//! What the pickle reader makes of a snapshot's dicts and lists as each completes: a frame
//! dict a frame id, a list of frames an interned list of ids, a trace entry a row ([`Entry`]).

use rustc_hash::FxHashMap;

use crate::pickle::{Build, Store, StrId, Value};

/// The strings a snapshot's many dicts are recognized by, interned first so that each is a
/// known [`StrId`]: the keys of trace entries and frames, then the actions in
/// [`ACTIONS`]' order.
pub(super) const KNOWN: [&str; 23] = [
    "action",
    "addr",
    "size",
    "stream",
    "time_us",
    "frames",
    "user_metadata",
    "category",
    "device_free",
    "filename",
    "name",
    "line",
    "compile_context",
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "oom",
    "snapshot",
    "annotate",
];
pub(super) const ACTION: StrId = 0;
pub(super) const ADDR: StrId = 1;
pub(super) const SIZE: StrId = 2;
pub(super) const STREAM: StrId = 3;
pub(super) const TIME_US: StrId = 4;
pub(super) const FRAMES: StrId = 5;
pub(super) const USER_METADATA: StrId = 6;
pub(super) const CATEGORY: StrId = 7;
pub(super) const DEVICE_FREE: StrId = 8;
pub(super) const FILENAME: StrId = 9;
pub(super) const NAME: StrId = 10;
pub(super) const LINE: StrId = 11;
pub(super) const COMPILE_CONTEXT: StrId = 12;
pub(super) const FIRST_ACTION: StrId = 13;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Action {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Oom,
    Snapshot,
    Annotate,
}

/// The actions, in the order of their names in [`KNOWN`].
pub(super) const ACTIONS: [Action; 10] = [
    Action::Alloc,
    Action::FreeRequested,
    Action::FreeCompleted,
    Action::SegmentAlloc,
    Action::SegmentFree,
    Action::SegmentMap,
    Action::SegmentUnmap,
    Action::Oom,
    Action::Snapshot,
    Action::Annotate,
];

/// No string, frame list or entry.
pub(super) const NONE: u32 = u32::MAX;

/// One trace entry, as read.
#[derive(Debug, Clone, Copy)]
pub(super) struct Entry {
    /// The action, or the name of one this reader does not know (`NONE`: not a string).
    pub(super) action: Result<Action, StrId>,
    pub(super) addr: u64,
    pub(super) size: u64,
    pub(super) stream: u64,
    pub(super) time_us: Option<u64>,
    /// Its frames, an index of [`Tables::lists`] (`NONE`: none).
    pub(super) frames: u32,
    /// Its `user_metadata` string (`_set_memory_metadata`'s, empty when unset; an `annotate`
    /// entry's annotation).
    pub(super) note: StrId,
    /// Its `compile_context` string (torch.compile's, `N/A` outside it).
    pub(super) context: StrId,
    /// Its `category` string (profiler snapshots).
    pub(super) category: StrId,
    pub(super) device_free: u64,
}

/// A frame, by its strings (`NONE`: absent or not a string, read as `?` and `??`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct FrameKey {
    pub(super) name: StrId,
    pub(super) file: StrId,
    pub(super) line: u32,
}

/// What the reader makes of a complete dict or list of a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Made {
    /// A frame dict (a dict with `filename`): an index of [`Tables::frames`].
    Frame(u32),
    /// A list of frames: an index of [`Tables::lists`].
    Frames(u32),
    /// A trace entry (a dict with `action`): an index of [`Tables::entries`].
    Entry(u32),
}

/// The frames, lists of frames and entries of a snapshot, each distinct frame and list once.
#[derive(Default)]
pub(super) struct Tables {
    pub(super) frames: Vec<FrameKey>,
    pub(super) frame_ids: FxHashMap<FrameKey, u32>,
    pub(super) lists: Vec<Box<[u32]>>,
    pub(super) list_ids: FxHashMap<Box<[u32]>, u32>,
    pub(super) entries: Vec<Entry>,
    pub(super) scratch: Vec<u32>,
}

impl Build for Tables {
    type Made = Made;

    fn dict(&mut self, s: &Store<Made>, kv: &[Value<Made>]) -> Option<Made> {
        // One pass: a frame's fields are read on the way, in case it is one.
        let mut key = FrameKey {
            name: NONE,
            file: NONE,
            line: 0,
        };
        let mut frame = false;
        for p in kv.chunks_exact(2) {
            match p[0] {
                Value::Str(ACTION) => {
                    let e = self.entry(s, kv);
                    let id = u32::try_from(self.entries.len()).unwrap_or(NONE);
                    self.entries.push(e);
                    return Some(Made::Entry(id));
                }
                Value::Str(FILENAME) => {
                    frame = true;
                    key.file = str_id(p[1]);
                }
                Value::Str(NAME) => key.name = str_id(p[1]),
                Value::Str(LINE) => key.line = line(p[1]),
                _ => {}
            }
        }
        frame.then(|| Made::Frame(self.intern_frame(key)))
    }

    fn list(&mut self, _: &Store<Made>, items: &[Value<Made>]) -> Option<Made> {
        if items.is_empty() {
            return None;
        }
        let mut ids = std::mem::take(&mut self.scratch);
        ids.clear();
        for v in items {
            match v {
                Value::Made(Made::Frame(f)) => ids.push(*f),
                _ => {
                    self.scratch = ids;
                    return None;
                }
            }
        }
        let id = self.intern_list(&ids);
        self.scratch = ids;
        Some(Made::Frames(id))
    }
}

impl Tables {
    pub(super) fn entry(&mut self, s: &Store<Made>, kv: &[Value<Made>]) -> Entry {
        let mut e = Entry {
            action: Err(NONE),
            addr: 0,
            size: 0,
            stream: 0,
            time_us: None,
            frames: NONE,
            note: NONE,
            context: NONE,
            category: NONE,
            device_free: 0,
        };
        for p in kv.chunks_exact(2) {
            let (Value::Str(k), v) = (p[0], p[1]) else {
                continue;
            };
            match k {
                ACTION => {
                    let id = str_id(v);
                    e.action = match id.checked_sub(FIRST_ACTION) {
                        Some(i) if (i as usize) < ACTIONS.len() => Ok(ACTIONS[i as usize]),
                        _ => Err(id),
                    };
                }
                ADDR => e.addr = v.u64().unwrap_or(0),
                SIZE => e.size = v.u64().unwrap_or(0),
                STREAM => e.stream = v.u64().unwrap_or(0),
                TIME_US => e.time_us = v.u64(),
                FRAMES => e.frames = self.frames_of(s, v),
                USER_METADATA => e.note = str_id(v),
                COMPILE_CONTEXT => e.context = str_id(v),
                CATEGORY => e.category = str_id(v),
                DEVICE_FREE => e.device_free = v.u64().unwrap_or(0),
                _ => {}
            }
        }
        e
    }

    /// A frame dict's `name`, `filename` and `line` as a frame id.
    pub(super) fn frame(&mut self, kv: &[Value<Made>]) -> u32 {
        let mut key = FrameKey {
            name: NONE,
            file: NONE,
            line: 0,
        };
        for p in kv.chunks_exact(2) {
            match p[0] {
                Value::Str(NAME) => key.name = str_id(p[1]),
                Value::Str(FILENAME) => key.file = str_id(p[1]),
                Value::Str(LINE) => key.line = line(p[1]),
                _ => {}
            }
        }
        self.intern_frame(key)
    }

    pub(super) fn intern_frame(&mut self, key: FrameKey) -> u32 {
        if let Some(&id) = self.frame_ids.get(&key) {
            return id;
        }
        let id = u32::try_from(self.frames.len()).unwrap_or(NONE);
        self.frames.push(key);
        self.frame_ids.insert(key, id);
        id
    }

    pub(super) fn intern_list(&mut self, ids: &[u32]) -> u32 {
        if let Some(&id) = self.list_ids.get(ids) {
            return id;
        }
        let id = u32::try_from(self.lists.len()).unwrap_or(NONE);
        self.lists.push(ids.into());
        self.list_ids.insert(ids.into(), id);
        id
    }

    /// The frames of a `frames` value: a list of frames as read, or any other list (an empty
    /// one, or one with items that are not frame dicts: each is a frame with what it has of
    /// `name`, `filename` and `line`). `NONE` for anything but a list.
    pub(super) fn frames_of(&mut self, s: &Store<Made>, v: Value<Made>) -> u32 {
        match v {
            Value::Made(Made::Frames(id)) => id,
            Value::List(_) => {
                let mut ids = Vec::new();
                for &item in s.items(v) {
                    let id = match item {
                        Value::Made(Made::Frame(f)) => f,
                        Value::Dict(_) => self.frame(s.items(item)),
                        _ => self.frame(&[]),
                    };
                    ids.push(id);
                }
                self.intern_list(&ids)
            }
            _ => NONE,
        }
    }
}

/// The string a value is, or `NONE`.
pub(super) fn str_id(v: Value<Made>) -> StrId {
    match v {
        Value::Str(id) => id,
        _ => NONE,
    }
}

/// A frame's line number.
pub(super) fn line(v: Value<Made>) -> u32 {
    v.u64().unwrap_or(0).min(u32::MAX as u64) as u32
}

/// What a value is, for error messages.
pub(super) fn kind_name(v: Value<Made>) -> &'static str {
    match v {
        Value::Made(Made::Frame(_)) => "a frame (a dict with `filename`)",
        Value::Made(Made::Frames(_)) => "a list of frames",
        Value::Made(Made::Entry(_)) => "a trace entry (a dict with `action`)",
        other => other.kind_name(),
    }
}

/// A block's frames and the bytes the viewer counts for it (`requested_size`; the legacy
/// layout keeps both in `history[0]`).
pub(super) fn block_extra(
    s: &Store<Made>,
    t: &mut Tables,
    b: Value<Made>,
    size: u64,
) -> (u32, u64) {
    let requested = |d: Value<Made>, key: &str| s.get(d, key).and_then(|v| v.u64()).unwrap_or(size);
    if let Some(f) = s.get(b, "frames") {
        return (t.frames_of(s, f), requested(b, "requested_size"));
    }
    if let Some(h) = s
        .get(b, "history")
        .and_then(|h| s.items(h).first().copied())
    {
        let frames = s.get(h, "frames").map_or(NONE, |f| t.frames_of(s, f));
        return (frames, requested(h, "real_size"));
    }
    (NONE, requested(b, "requested_size"))
}

/// A frame of [`Tables::frames`] as `(name, file, line)`: absent strings read `?` and `??`;
/// `_memory_viz._profile_to_snapshot` writes a profiler's Python call as
/// {filename: "none", line: 0, name: "file.py(18): function"}: its file and line.
pub(super) fn raw_frame<'s>(t: &Tables, s: &'s Store<Made>, f: u32) -> (&'s str, &'s str, u32) {
    let Some(k) = t.frames.get(f as usize) else {
        return ("?", "??", 0);
    };
    let text = |id: StrId, absent: &'static str| if id == NONE { absent } else { s.text(id) };
    let (name, file, line) = (text(k.name, "?"), text(k.file, "??"), k.line);
    if file == "none" && line == 0 {
        if let Some((f, l, n)) = crate::frames::profiler_location(name) {
            return (n, f, l);
        }
    }
    (name, file, line)
}
