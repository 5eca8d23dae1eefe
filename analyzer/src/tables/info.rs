//! `poolsight info`: what a trace holds — header, duration, events by kind, threads, devices,
//! and what was lost (dropped events, torn chunks, a writer that never finished).
//!
//! Not in the list of tables: `info` describes a file as stored (its header, chunks and events
//! by kind), so it is computed from the [`Trace`] and one trace at a time, where every table of
//! `report` is a function of a replayed (and possibly merged) [`Profile`].

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use poolsight_schema::fb;
use rayon::prelude::*;
use serde::Serialize;

use super::render::{humanized, seconds_or_ms};
use crate::read::names::{event_keys, mark_kind_name, mem_kind_name, scope_event_name, FrameKind};
use crate::read::{ChunkInfo, ChunkKind, Import, Trace};
use crate::replay::{Memory, MemoryKind, PoolFigures, Predicted, Profile};

#[derive(Debug, Clone, Serialize)]
pub struct ThreadInfo {
    pub id: u32,
    pub os_tid: u64,
    pub name: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct DeviceInfo {
    pub id: u32,
    pub name: String,
    pub capacity_bytes: u64,
    pub allocation_unit: u64,
    /// What memory it is: `unspecified` (before format 1.4, or a pool's simulated device),
    /// `gpu` or `cpu`.
    pub kind: &'static str,
    /// Its events observe an allocator from outside: no pool of poolsight's.
    pub observed: bool,
    /// Format 1.7: what a predicted device (`fake_cuda`) was predicted for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prediction: Option<crate::read::Prediction>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Info {
    pub path: String,
    pub format_version: String,
    pub writer: String,
    pub host: String,
    pub pid: u32,
    pub command_line: Vec<String>,
    pub rank: Option<u32>,
    pub world_size: Option<u32>,
    /// Set when the trace was converted from a PyTorch file (`poolsight import`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub imported_from: Option<Import>,
    pub mode: String,
    pub chunk_size: u32,
    pub started_unix_ns: u64,
    pub duration_ns: u64,
    /// Whether the writer finished the file (sealed its footer), as docs/format.md defines it;
    /// chunks lost since, dropped events or no events make it incomplete, not unfinished.
    pub finished: bool,
    /// A recorder holds the file now: unfinished because it is still being written.
    pub recording: bool,
    pub events: BTreeMap<&'static str, u64>,
    pub total_events: u64,
    pub threads: Vec<ThreadInfo>,
    pub devices: Vec<DeviceInfo>,
    pub chunks: usize,
    pub open_chunks: usize,
    pub torn_chunks: usize,
    pub dropped_events: u64,
    pub file_bytes: u64,
    pub bytes_per_event: f64,
    pub warnings: Vec<String>,
    /// What makes the run partial (unfinished, torn, dropped events, empty), from a replay
    /// (see [`add_replay`]); empty when it is whole.
    pub incomplete: Vec<String>,
    /// The pool's figures from a replay (see [`add_replay`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<PoolFigures>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub epochs: Option<usize>,
    /// What memory the devices' events are about; left out where the trace does not say.
    #[serde(skip_serializing_if = "Memory::unspecified")]
    pub memory: Memory,
    /// Set when the trace is a prediction (`poolsight.torch.fake_cuda`, format 1.7).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prediction: Option<Predicted>,
}

/// Adds what only a replay knows: the pool's peaks and counts, and the epochs.
pub fn add_replay(info: &mut Info, profile: &Profile) {
    if let Some(s) = profile.sources.first() {
        info.pool = Some(s.pool.clone());
        info.incomplete = crate::load::incomplete::problems(s);
        info.epochs = Some(s.epochs.len());
    }
}

/// Events counted by what they are stored as (a memory or mark event's kind byte, a scope
/// event's stack), named once at the end: naming every event costs more than reading it.
struct Tally {
    mem: [u64; 256],
    marks: [u64; 256],
    scopes: HashMap<u32, u64>,
    last_ticks: u64,
}

impl Default for Tally {
    fn default() -> Tally {
        Tally {
            mem: [0; 256],
            marks: [0; 256],
            scopes: HashMap::new(),
            last_ticks: 0,
        }
    }
}

impl Tally {
    fn merge(mut self, other: Tally) -> Tally {
        for (a, b) in self.mem.iter_mut().zip(other.mem) {
            *a += b;
        }
        for (a, b) in self.marks.iter_mut().zip(other.marks) {
            *a += b;
        }
        for (stack, n) in other.scopes {
            *self.scopes.entry(stack).or_default() += n;
        }
        self.last_ticks = self.last_ticks.max(other.last_ticks);
        self
    }

    fn count(mut self, trace: &Trace, c: &ChunkInfo) -> Tally {
        let mut last = self.last_ticks;
        match c.kind {
            ChunkKind::Mem => {
                for (ticks, e) in trace.mem_timeline(c) {
                    self.mem[e.kind().0 as usize] += 1;
                    last = last.max(ticks);
                }
            }
            ChunkKind::Scope => {
                // A scope's events come in runs on one stack (its open and close, a loop's
                // iterations): count a run at a time.
                let mut run: Option<(u32, u64)> = None;
                for (ticks, e) in trace.scope_timeline(c) {
                    last = last.max(ticks);
                    match &mut run {
                        Some((stack, n)) if *stack == e.stack() => *n += 1,
                        _ => {
                            if let Some((stack, n)) = run.replace((e.stack(), 1)) {
                                *self.scopes.entry(stack).or_default() += n;
                            }
                        }
                    }
                }
                if let Some((stack, n)) = run {
                    *self.scopes.entry(stack).or_default() += n;
                }
            }
            ChunkKind::Mark => {
                for e in trace.mark_events(c) {
                    self.marks[e.kind().0 as usize] += 1;
                    last = last.max(e.ticks());
                }
            }
            ChunkKind::Defs | ChunkKind::Footer => {}
        }
        self.last_ticks = last;
        self
    }

    /// The counts under the names `info` shows (kinds it does not know share one name).
    fn named(&self, trace: &Trace) -> BTreeMap<&'static str, u64> {
        let mut counts = BTreeMap::new();
        let mut add = |name: &'static str, n: u64| {
            if n > 0 {
                *counts.entry(name).or_default() += n;
            }
        };
        for (k, &n) in self.mem.iter().enumerate() {
            add(mem_kind_name(fb::MemKind(k as u8)), n);
        }
        for (k, &n) in self.marks.iter().enumerate() {
            add(mark_kind_name(fb::MarkKind(k as u8)), n);
        }
        for (stack, &n) in &self.scopes {
            let kind = trace
                .defs
                .stacks
                .get(stack)
                .and_then(|(_, f)| trace.defs.frames.get(f))
                .map(|f| FrameKind::from(f.kind));
            add(scope_event_name(kind), n);
        }
        counts
    }
}

pub fn info(trace: &Trace) -> Info {
    let tally = trace
        .chunks
        .par_iter()
        .fold(Tally::default, |t, c| t.count(trace, c))
        .reduce(Tally::default, Tally::merge);
    let counts = tally.named(trace);
    let h = &trace.header;
    let end_ticks = trace.footer.map_or(tally.last_ticks, |f| f.end_ticks);
    let total_events: u64 = counts.values().sum();
    let file_bytes = trace.bytes().len() as u64;
    let mut threads: Vec<ThreadInfo> = trace
        .defs
        .threads
        .iter()
        .map(|t| ThreadInfo {
            id: t.id,
            os_tid: t.os_tid,
            name: t.name.clone(),
        })
        .collect();
    threads.sort_by_key(|t| t.id);
    let mut devices: Vec<DeviceInfo> = Vec::new();
    for d in &trace.defs.devices {
        if !devices.iter().any(|x| x.id == d.id) {
            devices.push(DeviceInfo {
                id: d.id,
                name: d.name.clone(),
                capacity_bytes: d.capacity,
                allocation_unit: d.allocation_unit,
                kind: d.kind.name(),
                observed: d.observed,
                prediction: d.prediction.clone(),
            });
        }
    }
    Info {
        path: trace.path.display().to_string(),
        format_version: format!(
            "{}.{}{}",
            h.format_major,
            h.format_minor,
            if h.packed { " packed" } else { "" }
        ),
        writer: h.writer.clone(),
        host: h.host.clone(),
        pid: h.pid,
        command_line: h.command_line.clone(),
        rank: h.rank,
        world_size: h.world_size,
        imported_from: h.import.clone(),
        mode: match h.ring {
            Some(slots) => format!("ring ({slots} slots)"),
            None => "grow".into(),
        },
        chunk_size: h.chunk_size,
        started_unix_ns: h.unix_ns,
        duration_ns: trace.ns_since_start(end_ticks),
        finished: trace.finished(),
        recording: trace.recording,
        events: counts,
        total_events,
        threads,
        devices,
        chunks: trace.chunks.len(),
        open_chunks: trace.chunks.iter().filter(|c| !c.sealed).count(),
        torn_chunks: trace.torn_chunks(),
        dropped_events: trace.footer.map_or(0, |f| f.dropped_events),
        file_bytes,
        bytes_per_event: if total_events > 0 {
            file_bytes as f64 / total_events as f64
        } else {
            0.0
        },
        warnings: trace.warnings.iter().map(|w| w.to_string()).collect(),
        incomplete: Vec::new(),
        pool: None,
        epochs: None,
        memory: Memory::of(&trace.defs.devices),
        prediction: Predicted::of(&trace.defs.devices),
    }
}

pub fn render_table(i: &Info) -> String {
    let mut o = String::new();
    if let Some(p) = &i.prediction {
        let _ = writeln!(o, "{}", p.line());
    }
    let _ = writeln!(o, "trace        {}", i.path);
    let _ = writeln!(
        o,
        "format       {} (written by {})",
        i.format_version, i.writer
    );
    // An imported file's header names the process that converted it (PyTorch's files say
    // nothing of the process that wrote them).
    let _ = writeln!(
        o,
        "{}pid {} on {}",
        if i.imported_from.is_some() {
            "converted by "
        } else {
            "process      "
        },
        i.pid,
        if i.host.is_empty() { "?" } else { &i.host }
    );
    if !i.command_line.is_empty() {
        let _ = writeln!(o, "command      {}", i.command_line.join(" "));
    }
    if let (Some(r), Some(w)) = (i.rank, i.world_size) {
        let _ = writeln!(o, "rank         {r} of {w}");
    }
    if let Some(im) = &i.imported_from {
        let _ = writeln!(
            o,
            "imported     from {} ({}, {} bytes): {} entries",
            im.path, im.kind, im.bytes, im.entries
        );
        let _ = writeln!(
            o,
            "  start      {}",
            if im.overflowed {
                "mid-run: blocks freed but never allocated in the file (the trace ring overflowed, or recording began late) count as live from the start"
            } else {
                "whole: every block freed was allocated in the file"
            }
        );
        if im.unmapped.is_empty() {
            let _ = writeln!(o, "  unmapped   nothing");
        }
        for u in &im.unmapped {
            let _ = writeln!(o, "  unmapped   {u}");
        }
        if let Some(a) = &im.allocator {
            let settings = match crate::whatif::Recorded::from_state(a) {
                Ok(r) => r.settings.label(),
                Err(e) => format!("unreadable ({e})"),
            };
            let _ = writeln!(
                o,
                "  allocator  recorded settings {settings}; {} segments held when it was taken",
                a.segments.len()
            );
        }
    }
    let _ = writeln!(o, "mode         {}, {} B chunks", i.mode, i.chunk_size);
    let _ = writeln!(o, "duration     {}", seconds_or_ms(i.duration_ns));
    let _ = writeln!(
        o,
        "finished     {}",
        if i.finished {
            "yes".to_string()
        } else if i.recording {
            format!(
                "no: process {} is still recording it; every event it wrote so far is readable",
                i.pid
            )
        } else {
            "no: the writer did not seal the file (killed or crashed); every complete event is still readable".to_string()
        }
    );
    let _ = writeln!(
        o,
        "complete     {}",
        if i.incomplete.is_empty() {
            "yes".to_string()
        } else {
            format!("no: {}", i.incomplete.join(", "))
        }
    );
    let _ = writeln!(
        o,
        "size         {} bytes, {:.1} bytes/event",
        i.file_bytes, i.bytes_per_event
    );
    let _ = writeln!(o, "events       {}", i.total_events);
    let width = i.events.keys().map(|k| k.len()).max().unwrap_or(0);
    let mut kinds: Vec<(&str, u64)> = i.events.iter().map(|(k, v)| (*k, *v)).collect();
    let order = event_keys();
    kinds.sort_by_key(|(k, _)| order.iter().position(|x| x == k).unwrap_or(usize::MAX));
    for (k, v) in kinds {
        let _ = writeln!(o, "  {k:<width$}  {v}");
    }
    let _ = writeln!(o, "threads      {}", i.threads.len());
    for t in &i.threads {
        let _ = writeln!(o, "  {:>3}  {} (tid {})", t.id, t.name, t.os_tid);
    }
    let _ = writeln!(o, "devices      {}", i.devices.len());
    for d in &i.devices {
        let _ = writeln!(o, "  {:>3}  {} ({})", d.id, d.name, device_words(d));
    }
    if let Some(p) = &i.pool {
        if i.memory.observed {
            // No pool: nothing is held beyond what is live, and nothing comes from a device.
            let _ = writeln!(
                o,
                "memory       peak live {} at {} ({}, {})",
                humanized(p.peak_used_bytes),
                seconds_or_ms(p.peak_used_ns),
                i.memory.what(),
                if i.prediction.is_some() {
                    "predicted: no pool"
                } else {
                    "observed: no pool"
                }
            );
            let _ = writeln!(
                o,
                "             {} allocations, {} frees, {} out-of-memory errors",
                p.mallocs, p.frees, p.out_of_memory
            );
        } else {
            let _ = writeln!(
                o,
                "pool         peak used {} at {}, peak acquired {} at {}",
                humanized(p.peak_used_bytes),
                seconds_or_ms(p.peak_used_ns),
                humanized(p.peak_acquired_bytes),
                seconds_or_ms(p.peak_acquired_ns)
            );
            let device_allocations = if i.memory.kind == MemoryKind::Cpu {
                "allocations from host memory"
            } else {
                "device allocations"
            };
            let _ = writeln!(
                o,
                "             {} mallocs, {} {device_allocations}, {} releases, {} out-of-memory errors",
                p.mallocs, p.device_allocs, p.releases, p.out_of_memory
            );
        }
    }
    if let Some(e) = i.epochs {
        let _ = writeln!(o, "epochs       {e}");
    }
    let _ = writeln!(o, "chunks       {} ({} open)", i.chunks, i.open_chunks);
    let _ = writeln!(o, "dropped      {} events", i.dropped_events);
    let _ = writeln!(o, "torn         {} chunks", i.torn_chunks);
    for w in &i.warnings {
        let _ = writeln!(o, "warning      {w}");
    }
    o
}

/// A device's line of `info`: its size and allocation unit, and since format 1.4 what memory
/// it is and whether its events are observed from outside a pool.
fn device_words(d: &DeviceInfo) -> String {
    let size = format!("{} bytes, unit {}", d.capacity_bytes, d.allocation_unit);
    let what = match d.kind {
        "gpu" => "GPU memory",
        "cpu" => "CPU memory",
        _ => return size,
    };
    if let Some(p) = &d.prediction {
        format!(
            "{what}, predicted for {}: {} bytes for the allocator, unit {}",
            p.gpu, d.capacity_bytes, d.allocation_unit
        )
    } else if d.observed {
        // An observer knows no capacity: the allocator it watches does.
        format!("{what}, observed: no pool, unit {}", d.allocation_unit)
    } else {
        format!("{what}, {size}")
    }
}

/// One CSV row per trace: the scalar figures of [`Info`], lists joined by `; `.
#[derive(Default, Serialize)]
struct CsvRow<'a> {
    path: &'a str,
    format_version: &'a str,
    rank: Option<u32>,
    world_size: Option<u32>,
    duration_ns: u64,
    finished: bool,
    complete: bool,
    incomplete: String,
    total_events: u64,
    threads: usize,
    devices: usize,
    chunks: usize,
    torn_chunks: usize,
    dropped_events: u64,
    file_bytes: u64,
    warnings: String,
}

/// The traces' figures as one CSV table, one row per trace.
pub fn render_csv(infos: &[Info]) -> String {
    let rows: Vec<CsvRow> = infos
        .iter()
        .map(|i| CsvRow {
            path: &i.path,
            format_version: &i.format_version,
            rank: i.rank,
            world_size: i.world_size,
            duration_ns: i.duration_ns,
            finished: i.finished,
            complete: i.incomplete.is_empty(),
            incomplete: i.incomplete.join("; "),
            total_events: i.total_events,
            threads: i.threads.len(),
            devices: i.devices.len(),
            chunks: i.chunks,
            torn_chunks: i.torn_chunks,
            dropped_events: i.dropped_events,
            file_bytes: i.file_bytes,
            warnings: i.warnings.join("; "),
        })
        .collect();
    super::csv::to_csv(&rows)
}
