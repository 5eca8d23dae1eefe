//! What a reader gets from a trace file: the header, the definitions, the footer, the index of
//! verified chunks, the warnings about damaged parts, the events of a chunk; and why a file
//! could not be read.

use std::collections::HashMap;
use std::fmt;
use std::ops::Deref;
use std::path::PathBuf;

use poolsight_schema::{fb, PreludeError};

/// The header, its devices and an import's origin, as the format defines them.
pub use poolsight_schema::header::{Device as DeviceDef, Header, Import, Prediction};

/// Why a file could not be read at all.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {source}", path.display())]
    Prelude {
        path: PathBuf,
        #[source]
        source: PreludeError,
    },
    #[error("{}: bad header at offset {offset}: {what}", path.display())]
    Header {
        path: PathBuf,
        offset: u64,
        what: String,
    },
}

/// What kind of chunk an index entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChunkKind {
    Mem,
    Scope,
    Mark,
    Defs,
    Footer,
}

/// One verified chunk.
#[derive(Debug, Clone, Copy)]
pub struct ChunkInfo {
    pub offset: u64,
    /// Bytes of the size-prefixed buffer, prefix included.
    pub len: u32,
    pub kind: ChunkKind,
    pub seq: u64,
    pub thread: u32,
    pub base_ticks: u64,
    pub sealed: bool,
    /// Events (for event chunks), rebase events included.
    pub events: u32,
    /// A packed chunk (format 1.2): its events are decoded when read.
    pub packed: bool,
    /// A sealed event chunk whose checksum is still to be checked (a trace opened with
    /// [`Trace::open_deferred`]): the replay checks it when it first reads the chunk.
    pub crc_deferred: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadDef {
    pub id: u32,
    pub os_tid: u64,
    pub name: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameDef {
    pub kind: fb::FrameKind,
    pub phase: fb::Phase,
    pub line: u32,
    pub file: u32,
    pub name: u32,
}

/// Interned definitions, by id.
#[derive(Debug, Default, Clone)]
pub struct Defs {
    pub strings: HashMap<u32, String>,
    pub frames: HashMap<u32, FrameDef>,
    /// stack id -> (parent stack id, frame id)
    pub stacks: HashMap<u32, (u32, u32)>,
    pub threads: Vec<ThreadDef>,
    pub devices: Vec<DeviceDef>,
}

impl Defs {
    pub fn string(&self, id: u32) -> &str {
        self.strings.get(&id).map(String::as_str).unwrap_or("?")
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Footer {
    pub end_ticks: u64,
    pub end_mono_ns: u64,
    pub end_unix_ns: u64,
    pub dropped_events: u64,
    pub chunks: u64,
    pub data_end: u64,
}

/// Something wrong with part of a file that did not stop the rest from being read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    pub offset: u64,
    pub what: String,
    /// Whether the problem is a chunk lost to a torn or corrupt write.
    pub torn: bool,
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "offset {}: {}", self.offset, self.what)
    }
}

/// The events of one chunk: in place in the mapping, or decoded from a packed chunk.
pub enum Events<'a, T> {
    Mapped(&'a [T]),
    Decoded(Vec<T>),
}

impl<T> Deref for Events<'_, T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match self {
            Events::Mapped(s) => s,
            Events::Decoded(v) => v,
        }
    }
}

impl<T> Default for Events<'_, T> {
    fn default() -> Self {
        Events::Mapped(&[])
    }
}

impl<'a, T: Copy> IntoIterator for Events<'a, T> {
    type Item = T;
    type IntoIter = EventsIter<'a, T>;

    fn into_iter(self) -> EventsIter<'a, T> {
        match self {
            Events::Mapped(s) => EventsIter::Mapped(s.iter()),
            Events::Decoded(v) => EventsIter::Decoded(v.into_iter()),
        }
    }
}

impl<'b, T> IntoIterator for &'b Events<'_, T> {
    type Item = &'b T;
    type IntoIter = std::slice::Iter<'b, T>;

    fn into_iter(self) -> std::slice::Iter<'b, T> {
        self.iter()
    }
}

/// Iterates [`Events`] by value.
pub enum EventsIter<'a, T> {
    Mapped(std::slice::Iter<'a, T>),
    Decoded(std::vec::IntoIter<T>),
}

impl<T: Copy> Iterator for EventsIter<'_, T> {
    type Item = T;

    #[inline]
    fn next(&mut self) -> Option<T> {
        match self {
            EventsIter::Mapped(i) => i.next().copied(),
            EventsIter::Decoded(i) => i.next(),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match self {
            EventsIter::Mapped(i) => i.size_hint(),
            EventsIter::Decoded(i) => i.size_hint(),
        }
    }
}
