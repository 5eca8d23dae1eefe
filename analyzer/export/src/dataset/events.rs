//! The `events` and `stacks` tables of one trace.
//!
//! Events are written in one time order per trace — the order the replay's time-ordered pass
//! walks them: by clock ticks; at equal ticks memory events, then marks, then scope closes;
//! then by thread, then in recorded order — and numbered by `seq`. A running sum over `seq`
//! is therefore the pool's used or held bytes exactly as the replay counts them, which
//! nanosecond timestamps (several events per ns, ticks rounded down) could not promise.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};

use arrow_array::builder::{
    BooleanBuilder, Int32Builder, Int64Builder, Int8Builder, StringBuilder,
};
use arrow_array::{ArrayRef, DictionaryArray, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use poolsight_schema::fb;
use poolsight_schema::kinds::{MarkKind, MemKind};

use super::files::ParquetFile;
use super::ExportError;
use poolsight_analyzer::read::names::{
    mark_kind_name, mem_kind_name, scope_event_name, FrameKind, Phase,
};
use poolsight_analyzer::read::{ChunkInfo, ChunkKind, Trace};
use poolsight_analyzer::replay::{row_bytes, Units};
use poolsight_analyzer::tables::columns::i64_of;

/// Rows per Arrow batch, each one row group of the `events` file: large enough for good
/// compression and few column chunks, small enough that engines pruning on `seq` or `ts_ns`
/// skip most of a large file, and small enough that the batch being merged and the one being
/// encoded (about 30 MB each) keep the export's memory near 100 MB whatever the trace's size.
const BATCH_ROWS: usize = 1 << 18;

/// A damaged trace could hold a stack that names itself as an ancestor; real stacks are
/// interned parent first (a parent id is smaller), and deeper chains are cut.
const MAX_STACK_DEPTH: u32 = 4096;

/// The `kind` column's values, in the order of their dictionary codes: `info`'s event keys
/// ([`poolsight_analyzer::read::names::event_keys`]), then two for kinds this reader does not know.
static KINDS: LazyLock<Vec<&'static str>> = LazyLock::new(|| {
    let mut kinds = poolsight_analyzer::read::names::event_keys();
    kinds.extend(["unknown_mem", "unknown_mark"]);
    kinds
});

pub static EVENTS_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("seq", DataType::Int64, false),
        Field::new("thread", DataType::Int64, false),
        Field::new("ts_ns", DataType::Int64, false),
        Field::new(
            "kind",
            DataType::Dictionary(Box::new(DataType::Int8), Box::new(DataType::Utf8)),
            false,
        ),
        Field::new("bytes", DataType::Int64, true),
        Field::new("mem_size", DataType::Int64, true),
        Field::new("ptr", DataType::Int64, true),
        Field::new("device", DataType::Int32, true),
        Field::new("stream", DataType::Int32, true),
        Field::new("stack", DataType::Int64, true),
        Field::new("epoch", DataType::Int64, true),
        Field::new("duration_ns", DataType::Int64, true),
        Field::new("cpu_bytes", DataType::Int64, true),
        Field::new("cpu_peak_bytes", DataType::Int64, true),
    ]))
});

/// Columns of mostly distinct values, delta-encoded rather than dictionary-encoded.
pub const DELTA_COLUMNS: &[&str] = &["seq", "ts_ns", "ptr", "duration_ns"];

pub static STACKS_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("stack", DataType::Int64, false),
        Field::new("depth", DataType::Int32, false),
        Field::new("innermost", DataType::Boolean, false),
        Field::new("name", DataType::Utf8, false),
        Field::new("file", DataType::Utf8, false),
        Field::new("line", DataType::Int64, false),
        Field::new("kind", DataType::Utf8, false),
        Field::new("phase", DataType::Utf8, false),
    ]))
});

/// The codes of the epoch marks in [`KINDS`]: after the memory kinds and the four scope keys
/// (the order of [`poolsight_analyzer::read::names::event_keys`]).
const EPOCH_BEGIN: i8 = (MARKS_AT + MarkKind::EpochBegin as usize) as i8;
const EPOCH_END: i8 = (MARKS_AT + MarkKind::EpochEnd as usize) as i8;
const SCOPE_ABORT: i8 = (MARKS_AT + MarkKind::ScopeAbort as usize) as i8;
const MARKS_AT: usize = MemKind::ALL.len() + 4;

/// Event classes, in their order at equal ticks (as the replay merges them).
const MEMORY: u8 = 0;
const MARK: u8 = 1;
const SCOPE: u8 = 2;

/// One event, before it becomes a row.
#[derive(Clone, Copy)]
struct Event {
    ticks: u64,
    /// [`MEMORY`], [`MARK`] or [`SCOPE`].
    class: u8,
    thread: u32,
    kind: i8,
    bytes: Option<u64>,
    mem_size: Option<u64>,
    ptr: Option<u64>,
    device: Option<u8>,
    stream: Option<u16>,
    stack: Option<u32>,
    /// Marks: the epoch number; scopes: the duration in ticks.
    aux: u64,
    cpu: Option<(u64, u64)>,
}

impl Event {
    fn key(&self) -> (u64, u8, u32) {
        (self.ticks, self.class, self.thread)
    }
}

fn kind_code(name: &str) -> i8 {
    KINDS
        .iter()
        .position(|k| *k == name)
        .unwrap_or(KINDS.len() - 1) as i8
}

/// One thread's chunks of one kind, as a stream of events; each chunk's pages go back to the
/// kernel once its events are taken.
struct Stream<'a> {
    trace: &'a Trace,
    chunks: std::vec::IntoIter<&'a ChunkInfo>,
    current: Option<&'a ChunkInfo>,
    events: Box<dyn Iterator<Item = Event> + Send + 'a>,
    head: Option<Event>,
    progress: Option<&'a AtomicU64>,
}

impl<'a> Stream<'a> {
    fn new(trace: &'a Trace, chunks: Vec<&'a ChunkInfo>, progress: Option<&'a AtomicU64>) -> Self {
        let mut s = Stream {
            trace,
            chunks: chunks.into_iter(),
            current: None,
            events: Box::new(std::iter::empty()),
            head: None,
            progress,
        };
        s.advance();
        s
    }

    /// A stream of events already read (the marks, which are few and sorted up front).
    fn of_events(trace: &'a Trace, events: Box<dyn Iterator<Item = Event> + Send + 'a>) -> Self {
        let mut s = Stream::new(trace, Vec::new(), None);
        s.events = events;
        s.advance();
        s
    }

    fn advance(&mut self) {
        loop {
            if let Some(e) = self.events.next() {
                self.head = Some(e);
                return;
            }
            if let Some(c) = self.current.take() {
                self.trace.release_pages(c);
                if let Some(p) = self.progress {
                    p.fetch_add(u64::from(c.len), Ordering::Relaxed);
                }
            }
            let Some(c) = self.chunks.next() else {
                self.head = None;
                return;
            };
            self.current = Some(c);
            self.events = chunk_events(self.trace, c);
        }
    }
}

fn chunk_events<'a>(
    trace: &'a Trace,
    c: &'a ChunkInfo,
) -> Box<dyn Iterator<Item = Event> + Send + 'a> {
    let thread = c.thread;
    match c.kind {
        ChunkKind::Mem => {
            let units = Units::of(trace);
            Box::new(trace.mem_timeline(c).map(move |(ticks, e)| {
                let kind = e.kind();
                let mem_size = row_bytes(&e, &units);
                Event {
                    ticks,
                    class: MEMORY,
                    thread,
                    kind: kind_code(mem_kind_name(kind)),
                    bytes: Some(e.bytes()),
                    mem_size,
                    ptr: Some(e.ptr()),
                    device: Some(e.device()),
                    stream: Some(e.stream()),
                    stack: Some(e.stack()),
                    aux: 0,
                    cpu: None,
                }
            }))
        }
        ChunkKind::Scope => Box::new(trace.scope_timeline(c).map(move |(ticks, e)| {
            let innermost = trace
                .defs
                .stacks
                .get(&e.stack())
                .and_then(|(_, f)| trace.defs.frames.get(f))
                .map(|f| FrameKind::from(f.kind));
            Event {
                ticks,
                class: SCOPE,
                thread,
                kind: kind_code(scope_event_name(innermost)),
                bytes: None,
                mem_size: None,
                ptr: None,
                device: None,
                stream: None,
                stack: Some(e.stack()),
                aux: e.duration(),
                cpu: None,
            }
        })),
        ChunkKind::Mark | ChunkKind::Defs | ChunkKind::Footer => Box::new(std::iter::empty()),
    }
}

/// A mark's row: its figures in the columns that name them (the format's `MarkKind` says what
/// `aux`, `a` and `b` hold for each kind).
fn mark_event(e: &fb::MarkEvent) -> Event {
    let mut ev = Event {
        ticks: e.ticks(),
        class: MARK,
        thread: 0,
        kind: kind_code(mark_kind_name(e.kind())),
        bytes: None,
        mem_size: None,
        ptr: None,
        device: None,
        stream: None,
        stack: None,
        aux: u64::from(e.aux()),
        cpu: None,
    };
    match MarkKind::try_from(e.kind()) {
        Ok(MarkKind::EpochBegin | MarkKind::EpochEnd | MarkKind::CpuSample) => {
            ev.cpu = Some((e.a(), e.b()));
        }
        // The call's stack, and how long it ran before it raised (`a`: when it opened).
        Ok(MarkKind::ScopeAbort) => {
            ev.stack = Some(e.aux());
            ev.aux = e.ticks().saturating_sub(e.a());
        }
        // The device's free bytes at an out-of-memory (the request is the OOM row's bytes).
        Ok(MarkKind::DeviceFree) => {
            ev.device = u8::try_from(e.aux()).ok();
            ev.bytes = Some(e.a());
        }
        Ok(MarkKind::Snapshot) => ev.device = u8::try_from(e.aux()).ok(),
        // The block annotated (0: a moment, no block) and its device.
        Ok(MarkKind::Annotation) => {
            ev.ptr = Some(e.a());
            ev.device = u8::try_from(e.b()).ok();
        }
        Err(_) => {}
    }
    ev
}

/// Column builders for one batch of event rows.
struct EventColumns {
    seq: Int64Builder,
    thread: Int64Builder,
    ts_ns: Int64Builder,
    kind: Int8Builder,
    bytes: Int64Builder,
    mem_size: Int64Builder,
    ptr: Int64Builder,
    device: Int32Builder,
    stream: Int32Builder,
    stack: Int64Builder,
    epoch: Int64Builder,
    duration_ns: Int64Builder,
    cpu_bytes: Int64Builder,
    cpu_peak_bytes: Int64Builder,
    rows: usize,
}

impl EventColumns {
    fn new() -> EventColumns {
        let i64b = || Int64Builder::with_capacity(BATCH_ROWS);
        let i32b = || Int32Builder::with_capacity(BATCH_ROWS);
        EventColumns {
            seq: i64b(),
            thread: i64b(),
            ts_ns: i64b(),
            kind: Int8Builder::with_capacity(BATCH_ROWS),
            bytes: i64b(),
            mem_size: i64b(),
            ptr: i64b(),
            device: i32b(),
            stream: i32b(),
            stack: i64b(),
            epoch: i64b(),
            duration_ns: i64b(),
            cpu_bytes: i64b(),
            cpu_peak_bytes: i64b(),
            rows: 0,
        }
    }

    fn push(&mut self, trace: &Trace, seq: u64, e: &Event, epoch: Option<u64>) {
        let ns = trace.ns_since_start(e.ticks);
        self.seq.append_value(i64_of(seq));
        self.thread.append_value(i64::from(e.thread));
        self.ts_ns.append_value(i64_of(ns));
        self.kind.append_value(e.kind);
        self.bytes.append_option(e.bytes.map(i64_of));
        self.mem_size.append_option(e.mem_size.map(i64_of));
        self.ptr.append_option(e.ptr.map(i64_of));
        self.device.append_option(e.device.map(i32::from));
        self.stream.append_option(e.stream.map(i32::from));
        self.stack.append_option(e.stack.map(i64::from));
        self.epoch.append_option(epoch.map(i64_of));
        // A scope's start is converted on its own, as the other exports do, so its duration
        // is end minus start in ns.
        let duration = (e.class == SCOPE || e.kind == SCOPE_ABORT).then(|| {
            let start = trace.ns_since_start(e.ticks.saturating_sub(e.aux));
            i64_of(ns - start.min(ns))
        });
        self.duration_ns.append_option(duration);
        self.cpu_bytes.append_option(e.cpu.map(|c| i64_of(c.0)));
        self.cpu_peak_bytes
            .append_option(e.cpu.filter(|_| e.kind == EPOCH_END).map(|c| i64_of(c.1)));
        self.rows += 1;
    }

    fn batch(&mut self) -> Result<RecordBatch, arrow_schema::ArrowError> {
        self.rows = 0;
        let values: ArrayRef = Arc::new(StringArray::from(KINDS.to_vec()));
        let kind = DictionaryArray::try_new(self.kind.finish(), values)?;
        let columns: Vec<ArrayRef> = vec![
            Arc::new(self.seq.finish()),
            Arc::new(self.thread.finish()),
            Arc::new(self.ts_ns.finish()),
            Arc::new(kind),
            Arc::new(self.bytes.finish()),
            Arc::new(self.mem_size.finish()),
            Arc::new(self.ptr.finish()),
            Arc::new(self.device.finish()),
            Arc::new(self.stream.finish()),
            Arc::new(self.stack.finish()),
            Arc::new(self.epoch.finish()),
            Arc::new(self.duration_ns.finish()),
            Arc::new(self.cpu_bytes.finish()),
            Arc::new(self.cpu_peak_bytes.finish()),
        ];
        RecordBatch::try_new(EVENTS_SCHEMA.clone(), columns)
    }
}

/// Writes every event of the trace to `out` in time order; returns how many.
pub fn write_events(
    trace: &Trace,
    out: &mut ParquetFile,
    progress: Option<&AtomicU64>,
) -> Result<u64, ExportError> {
    let mut merge = Merge {
        trace,
        streams: streams(trace, progress),
        seq: 0,
        open_epoch: None,
    };
    // The next batch is merged while the last one is encoded.
    let mut batch = merge.next_batch()?;
    while let Some(b) = batch {
        let (written, next) = rayon::join(|| out.write(&b), || merge.next_batch());
        written?;
        batch = next?;
    }
    Ok(merge.seq)
}

/// The k-way merge of a trace's event streams, in `seq` order.
struct Merge<'a> {
    trace: &'a Trace,
    streams: Vec<Stream<'a>>,
    seq: u64,
    open_epoch: Option<u64>,
}

impl Merge<'_> {
    /// Up to [`BATCH_ROWS`] next events as a batch; None once every event is out.
    fn next_batch(&mut self) -> Result<Option<RecordBatch>, ExportError> {
        let mut cols = EventColumns::new();
        while cols.rows < BATCH_ROWS {
            // Threads are few: a scan of the heads beats a heap. Ties go to the first
            // stream, and streams are ordered memory, marks, scopes, each by thread.
            let mut best: Option<(usize, (u64, u8, u32))> = None;
            for (i, s) in self.streams.iter().enumerate() {
                if let Some(e) = &s.head {
                    let k = e.key();
                    if best.is_none_or(|(_, bk)| k < bk) {
                        best = Some((i, k));
                    }
                }
            }
            let Some((i, _)) = best else { break };
            let Some(e) = self.streams[i].head else { break };
            self.streams[i].advance();
            let epoch = match e.kind {
                EPOCH_BEGIN => {
                    self.open_epoch = Some(e.aux);
                    self.open_epoch
                }
                EPOCH_END => {
                    self.open_epoch = None;
                    Some(e.aux)
                }
                _ => self.open_epoch,
            };
            cols.push(self.trace, self.seq, &e, epoch);
            self.seq += 1;
        }
        if cols.rows == 0 {
            return Ok(None);
        }
        cols.batch().map(Some).map_err(arrow_error)
    }
}

fn arrow_error(e: arrow_schema::ArrowError) -> ExportError {
    ExportError::Arrow(e.to_string())
}

/// The event streams in tie-break order: memory chunks by thread, the marks, scope chunks by
/// thread.
fn streams<'a>(trace: &'a Trace, progress: Option<&'a AtomicU64>) -> Vec<Stream<'a>> {
    let by_thread = |kind: ChunkKind| {
        let mut threads: Vec<(u32, Vec<&ChunkInfo>)> = Vec::new();
        for c in trace.chunks.iter().filter(|c| c.kind == kind) {
            match threads.iter_mut().find(|(t, _)| *t == c.thread) {
                Some((_, v)) => v.push(c),
                None => threads.push((c.thread, vec![c])),
            }
        }
        threads.sort_by_key(|(t, _)| *t);
        threads
    };
    let mut out: Vec<Stream> = by_thread(ChunkKind::Mem)
        .into_iter()
        .map(|(_, chunks)| Stream::new(trace, chunks, progress))
        .collect();
    let mark_chunks: Vec<&ChunkInfo> = trace
        .chunks
        .iter()
        .filter(|c| c.kind == ChunkKind::Mark)
        .collect();
    let mut marks: Vec<Event> = mark_chunks
        .iter()
        .flat_map(|c| trace.mark_events(c))
        .map(|e| mark_event(&e))
        .collect();
    // Stable: marks at one tick keep their recorded order.
    marks.sort_by_key(|m| m.ticks);
    if let Some(p) = progress {
        p.fetch_add(
            mark_chunks.iter().map(|c| u64::from(c.len)).sum(),
            Ordering::Relaxed,
        );
    }
    out.push(Stream::of_events(trace, Box::new(marks.into_iter())));
    out.extend(
        by_thread(ChunkKind::Scope)
            .into_iter()
            .map(|(_, chunks)| Stream::new(trace, chunks, progress)),
    );
    out
}

/// Writes the `stacks` table: one row per frame of every interned stack, outermost first.
pub fn write_stacks(trace: &Trace, out: &mut ParquetFile) -> Result<u64, ExportError> {
    let defs = &trace.defs;
    let mut ids: Vec<u32> = defs.stacks.keys().copied().collect();
    ids.sort_unstable();
    let mut stack = Int64Builder::new();
    let mut depth = Int32Builder::new();
    let mut innermost = BooleanBuilder::new();
    let mut name = StringBuilder::new();
    let mut file = StringBuilder::new();
    let mut line = Int64Builder::new();
    let mut kind = StringBuilder::new();
    let mut phase = StringBuilder::new();
    let mut rows = 0u64;
    for id in ids {
        let mut frames = Vec::new();
        let mut cur = id;
        while let Some(&(parent, frame)) = defs.stacks.get(&cur) {
            frames.push(frame);
            if parent >= cur || frames.len() as u32 >= MAX_STACK_DEPTH {
                break;
            }
            cur = parent;
        }
        let n = frames.len();
        for (i, frame) in frames.into_iter().rev().enumerate() {
            let f = defs.frames.get(&frame);
            stack.append_value(i64::from(id));
            depth.append_value(i as i32 + 1);
            innermost.append_value(i + 1 == n);
            match f {
                Some(f) => {
                    name.append_value(defs.string(f.name));
                    file.append_value(defs.string(f.file));
                    line.append_value(i64::from(f.line));
                    kind.append_value(FrameKind::from(f.kind).as_str());
                    phase.append_value(Phase::from(f.phase).as_str());
                }
                None => {
                    name.append_value(format!("<undefined frame {frame}>"));
                    file.append_value("?");
                    line.append_value(0);
                    kind.append_value(FrameKind::Unknown.as_str());
                    phase.append_value(Phase::None.as_str());
                }
            }
            rows += 1;
        }
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(stack.finish()),
        Arc::new(depth.finish()),
        Arc::new(innermost.finish()),
        Arc::new(name.finish()),
        Arc::new(file.finish()),
        Arc::new(line.finish()),
        Arc::new(kind.finish()),
        Arc::new(phase.finish()),
    ];
    let batch = RecordBatch::try_new(STACKS_SCHEMA.clone(), columns).map_err(arrow_error)?;
    out.write(&batch)?;
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoch_codes_name_the_epoch_kinds() {
        assert_eq!(KINDS[EPOCH_BEGIN as usize], "epoch_begin");
        assert_eq!(KINDS[EPOCH_END as usize], "epoch_end");
        assert_eq!(kind_code("epoch_end"), EPOCH_END);
    }
}
