//! poolsight's trace files, read and written as files: the verified reader over memory-mapped
//! traces, packed traces decoded and encoded ([`pack`]), and the stable names of every kind. It
//! depends on the format (`poolsight-schema`) and zstd, and knows nothing of reports: what
//! the events mean is the analyzer's.
//!
//! Opening a trace: the file is untrusted input (CI analyzes artifacts of other people's
//! branches). Every chunk is checked — bounds, FlatBuffers verification, identifier, checksum
//! of sealed chunks — before anything reads it. A bad chunk becomes a warning naming its
//! offset and what is wrong, and is skipped; a file that is not a trace at all, or of a major
//! version this reader does not know, is an error. Nothing allocates by a size read from the
//! file: the index holds one small entry per chunk that actually exists.
//!
//! The layout and the rules checked here are those of docs/format.md. Walk order: the footer slot
//! at `data_offset`, then (ring mode) the ring slots, then chunks one after another until the end
//! of the file. Zero bytes where a chunk should start are space that was reserved but never
//! written; the walk skips to the next non-zero word. Where a chunk should start but none does
//! (a damaged size prefix, a cut), the walk warns and resumes at the next offset that starts a
//! chunk, so one damaged chunk hides nothing else. Every count read from the file is bounded by
//! the file's size, and every offset sum is checked.
//!
//! The parts, by what they do:
//!
//! - [`types`]: what a reader gets: the trace's header, definitions, footer, chunk index and
//!   warnings, and the errors;
//! - [`trace`]: [`Trace`], opening a file and reading its events in place (or decoded, for a
//!   packed chunk);
//! - `walk`: finding the chunks in the file, resynchronizing after damage;
//! - `verify`: the checks every chunk passes before anything reads it;
//! - `defs`: merging the definitions chunks (strings, frames, stacks, threads, devices);
//! - `pages`: giving pages back to the kernel, so a pass keeps little resident;
//! - [`packed`]: the columns of packed event chunks, decoded (and encoded, for the packer);
//! - [`names`]: the stable names of kinds in every output;
//! - [`pack`]: writing a packed copy of a trace;
//! - [`resolve`]: the [`Resolver`](resolve::Resolver) through which another tool's files are
//!   read as traces.
//!
//! Opening the traces of one job together, replaying them and converting other tools' files is
//! the analyzer's loading step (`poolsight_analyzer::load`).

mod defs;
pub mod names;
pub mod pack;
pub mod packed;
mod pages;
pub mod resolve;
mod trace;
mod types;
mod verify;
mod walk;

pub use pages::WINDOW;
pub use trace::Trace;
pub use types::{
    ChunkInfo, ChunkKind, Defs, DeviceDef, Events, EventsIter, Footer, FrameDef, Header, Import,
    Prediction, ReadError, ThreadDef, Warning,
};

/// Size prefix, root offset and file identifier.
pub(crate) const MIN_PREFIXED_LEN: usize = 12;

/// What the FlatBuffers verifier allows of any buffer of a trace.
pub(crate) const VERIFIER: flatbuffers::VerifierOptions = flatbuffers::VerifierOptions {
    max_depth: 16,
    max_tables: 1 << 20,
    max_apparent_size: 1 << 31,
    ignore_missing_null_terminator: false,
};
