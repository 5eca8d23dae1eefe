//! The Chrome/Perfetto trace event JSON, so scopes, pool counters, epochs and out-of-memory
//! events can be browsed in `ui.perfetto.dev` or `chrome://tracing`.

use std::collections::hash_map::Entry;
use std::fmt;
use std::io::{self, BufWriter, Write};

use poolsight_schema::fb;
use rustc_hash::FxHashMap;

use super::{json_str, scope_span, scope_text, ExportError, ExportSummary, BUFFER_BYTES};
use poolsight_analyzer::read::{ChunkKind, Defs, Trace};
use poolsight_analyzer::replay::{Profile, Source};

/// The thread id of the epochs track in the Chrome export. Recorder threads are numbered up
/// from 1, so the top id never names one; it stays a `u32`, which the Perfetto importer needs.
pub const EPOCHS_TID: u32 = u32::MAX;

/// Counter track of the pool's live bytes in the Chrome export.
pub const USED_TRACK: &str = "pool used bytes";
/// Counter track of the bytes the pool holds from the device (live and cached).
pub const HELD_TRACK: &str = "pool held bytes";
/// Counter track of the CPU memory the recorder read.
pub const CPU_TRACK: &str = "cpu bytes";

/// Writes the traces as Chrome/Perfetto trace event JSON (`{"traceEvents":[...]}`).
///
/// Each pair is a trace and the profile replayed from it (its source for the trace is found by
/// path, or is the only one). Every trace becomes one process: `pid` is its rank when every
/// trace has a distinct rank (ranks of one job, then aligned on their wall-clock starts), else
/// its index in `traces` (each then starting at 0). In it:
///
/// - a complete slice (`"ph":"X"`) per closed scope on its recorder thread's track, named after
///   the scope, `cat` function, link or scope, `args` phase, file and line;
/// - the pool's used (live) and held (acquired from the device) bytes as two counter tracks
///   (`"ph":"C"`, names [`USED_TRACK`] and [`HELD_TRACK`], `args.bytes`), one sample per point
///   of the profile's series: each is the maximum over its time bucket, placed at the bucket's
///   start, so each counter's peak is the pool's exact peak (a rise shows up to one bucket
///   early); a first sample of 0 at the trace's start and a last one at its end, with the bytes
///   still in use then, frame them;
/// - the CPU memory the recorder read (samples and epoch edges) as a third counter track,
///   [`CPU_TRACK`], when the trace has a CPU source;
/// - epochs as slices on their own `epochs` track (thread [`EPOCHS_TID`]);
/// - each out-of-memory event as a process-wide instant (`"ph":"i"`).
///
/// `ts` and `dur` are microseconds written with all three decimals, so no nanosecond is lost
/// to float formatting.
pub fn chrome(
    traces: &[(&Trace, &Profile)],
    out: &mut dyn Write,
) -> Result<ExportSummary, ExportError> {
    let mut w = ChromeWriter {
        out: BufWriter::with_capacity(BUFFER_BYTES, out),
        first: true,
        summary: ExportSummary::default(),
    };
    w.out.write_all(b"{\"traceEvents\":[")?;
    let ranks: Option<Vec<u32>> = traces.iter().map(|(t, _)| t.header.rank).collect();
    let by_rank = ranks.filter(|r| {
        let mut sorted = r.clone();
        sorted.sort_unstable();
        sorted.windows(2).all(|p| p[0] != p[1])
    });
    let job_start = traces
        .iter()
        .map(|(t, _)| t.header.unix_ns)
        .min()
        .unwrap_or(0);
    for (index, (trace, profile)) in traces.iter().enumerate() {
        let source = source_of(trace, profile)?;
        let (pid, offset_ns) = match &by_rank {
            Some(ranks) => (ranks[index], trace.header.unix_ns.saturating_sub(job_start)),
            None => (index as u32, 0),
        };
        let process = ChromeProcess {
            trace,
            pid,
            offset_ns,
        };
        process.write(&mut w, source)?;
    }
    w.out.write_all(b"\n],\"displayTimeUnit\":\"ns\"}\n")?;
    w.out.flush()?;
    Ok(w.summary)
}

/// The profile's figures for this trace: matched by path, so one merged profile of several
/// traces also works; a profile of a single source is taken as the trace's own.
fn source_of<'a>(trace: &Trace, profile: &'a Profile) -> Result<&'a Source, ExportError> {
    let path = trace.path.display().to_string();
    let by_path = profile.sources.iter().find(|s| s.path == path);
    match (by_path, profile.sources.as_slice()) {
        (Some(s), _) | (None, [s]) => Ok(s),
        (None, _) => Err(ExportError::NoSource { path }),
    }
}

/// The JSON array being written, and what went into it.
struct ChromeWriter<'o> {
    out: BufWriter<&'o mut dyn Write>,
    first: bool,
    summary: ExportSummary,
}

impl<'o> ChromeWriter<'o> {
    /// Starts the next array element (one per line, so the output diffs and greps well) and
    /// returns the writer to put the object on.
    fn next(&mut self) -> io::Result<&mut BufWriter<&'o mut dyn Write>> {
        self.out
            .write_all(if self.first { b"\n" } else { b",\n" })?;
        self.first = false;
        self.summary.records += 1;
        Ok(&mut self.out)
    }

    /// A `"ph":"M"` metadata event: a process's or thread's name, or its place in the list.
    fn metadata(&mut self, name: &str, pid: u32, tid: u32, args: &str) -> io::Result<()> {
        let w = self.next()?;
        write!(
            w,
            "{{\"ph\":\"M\",\"name\":\"{name}\",\"pid\":{pid},\"tid\":{tid},\"args\":{args}}}"
        )
    }
}

/// One trace, as one Chrome process.
struct ChromeProcess<'t> {
    trace: &'t Trace,
    pid: u32,
    /// Added to every time: where this trace starts on the export's common time axis.
    offset_ns: u64,
}

impl ChromeProcess<'_> {
    fn write(&self, w: &mut ChromeWriter<'_>, source: &Source) -> io::Result<()> {
        self.names(w, source)?;
        self.events(w)?;
        self.counters(w, source)?;
        self.epochs(w, source)
    }

    fn names(&self, w: &mut ChromeWriter<'_>, source: &Source) -> io::Result<()> {
        let (trace, pid) = (self.trace, self.pid);
        let label = match trace.header.rank {
            Some(rank) => format!("rank {rank}: {}", trace.path.display()),
            None => trace.path.display().to_string(),
        };
        w.metadata("process_name", pid, 0, &name_args("name", &label)?)?;
        w.metadata(
            "process_sort_index",
            pid,
            0,
            &format!("{{\"sort_index\":{pid}}}"),
        )?;
        let mut threads: Vec<_> = trace.defs.threads.iter().collect();
        threads.sort_by_key(|t| t.id);
        threads.dedup_by_key(|t| t.id);
        for t in threads {
            w.metadata("thread_name", pid, t.id, &name_args("name", &t.name)?)?;
        }
        if !source.epochs.is_empty() {
            w.metadata("thread_name", pid, EPOCHS_TID, "{\"name\":\"epochs\"}")?;
            // Above the recorder threads, where a reader looks first.
            w.metadata("thread_sort_index", pid, EPOCHS_TID, "{\"sort_index\":-1}")?;
        }
        Ok(())
    }

    /// Scope slices and out-of-memory instants, chunk by chunk.
    fn events(&self, w: &mut ChromeWriter<'_>) -> io::Result<()> {
        let trace = self.trace;
        // `"name":..,"cat":..,"args":{..}` of each scope stack, escaped once.
        let mut fields: FxHashMap<u32, String> = FxHashMap::default();
        for c in &trace.chunks {
            match c.kind {
                ChunkKind::Scope => {
                    for (end_ticks, e) in trace.scope_timeline(c) {
                        let stack = e.stack();
                        let text = match fields.entry(stack) {
                            Entry::Occupied(o) => o.into_mut(),
                            Entry::Vacant(v) => v.insert(scope_fields(&trace.defs, stack)?),
                        };
                        let (start_ns, end_ns) = scope_span(trace, end_ticks, e.duration());
                        let out = w.next()?;
                        write!(
                            out,
                            "{{\"ph\":\"X\",\"pid\":{},\"tid\":{},\"ts\":{},\"dur\":{},{text}}}",
                            self.pid,
                            c.thread,
                            Micros(self.offset_ns.saturating_add(start_ns)),
                            Micros(end_ns - start_ns),
                        )?;
                        w.summary.scopes += 1;
                    }
                }
                ChunkKind::Mem => {
                    let ooms = trace
                        .mem_timeline(c)
                        .filter(|(_, e)| e.kind() == fb::MemKind::OutOfMemory);
                    for (ticks, e) in ooms {
                        let out = w.next()?;
                        write!(
                            out,
                            "{{\"ph\":\"i\",\"s\":\"p\",\"name\":\"out_of_memory\",\"cat\":\"memory\",\"pid\":{},\"tid\":{},\"ts\":{},\"args\":{{\"requested_bytes\":{},\"pool_bytes\":{},\"device\":{},\"stream\":{}}}}}",
                            self.pid,
                            c.thread,
                            Micros(self.offset_ns.saturating_add(trace.ns_since_start(ticks))),
                            e.bytes(),
                            e.ptr(),
                            e.device(),
                            e.stream(),
                        )?;
                        w.summary.mem_events += 1;
                    }
                }
                ChunkKind::Mark | ChunkKind::Defs | ChunkKind::Footer => {}
            }
            trace.release_pages(c);
        }
        Ok(())
    }

    fn counters(&self, w: &mut ChromeWriter<'_>, source: &Source) -> io::Result<()> {
        let points = &source.series.points;
        // The pool starts empty with the trace and holds its final figures at the end; the
        // two extra samples make the track span the whole trace instead of the busy part.
        let opening = match points.first() {
            Some(p) if p.0 > 0 => Some((0, 0, 0)),
            _ => None,
        };
        let end = (
            source.duration_ns,
            source.pool.used_at_end_bytes,
            source.pool.acquired_at_end_bytes,
        );
        let closing = match points.last() {
            Some(p) if p.0 < end.0 => Some(end),
            _ => None,
        };
        let samples = opening
            .into_iter()
            .chain(points.iter().copied())
            .chain(closing);
        // One track per figure: a counter event with several args is drawn stacked, which
        // would add live bytes to held bytes.
        for (ns, used, acquired) in samples {
            let ts = self.offset_ns.saturating_add(ns);
            self.counter(w, USED_TRACK, ts, used)?;
            self.counter(w, HELD_TRACK, ts, acquired)?;
        }
        self.cpu_counter(w)
    }

    fn counter(&self, w: &mut ChromeWriter<'_>, name: &str, ns: u64, bytes: i64) -> io::Result<()> {
        let out = w.next()?;
        write!(
            out,
            "{{\"ph\":\"C\",\"name\":\"{name}\",\"pid\":{},\"ts\":{},\"args\":{{\"bytes\":{bytes}}}}}",
            self.pid,
            Micros(ns),
        )?;
        w.summary.counters += 1;
        Ok(())
    }

    /// The CPU memory the recorder sampled (its samples and the readings at epoch edges), on a
    /// track of its own; none when the trace has no CPU source.
    fn cpu_counter(&self, w: &mut ChromeWriter<'_>) -> io::Result<()> {
        let trace = self.trace;
        if trace.header.cpu_source == fb::CpuSource::None {
            return Ok(());
        }
        let mut samples: Vec<(u64, u64)> = Vec::new();
        for c in trace.chunks.iter().filter(|c| c.kind == ChunkKind::Mark) {
            samples.extend(
                trace
                    .mark_events(c)
                    .iter()
                    .map(|m| (trace.ns_since_start(m.ticks()), m.a())),
            );
        }
        samples.sort_unstable();
        for (ns, bytes) in samples {
            let bytes = i64::try_from(bytes).unwrap_or(i64::MAX);
            self.counter(w, CPU_TRACK, self.offset_ns.saturating_add(ns), bytes)?;
        }
        Ok(())
    }

    fn epochs(&self, w: &mut ChromeWriter<'_>, source: &Source) -> io::Result<()> {
        for e in &source.epochs {
            let out = w.next()?;
            write!(
                out,
                "{{\"ph\":\"X\",\"name\":\"epoch {}\",\"cat\":\"epoch\",\"pid\":{},\"tid\":{EPOCHS_TID},\"ts\":{},\"dur\":{},\"args\":{{\"epoch\":{},\"complete\":{},\"gpu_begin_bytes\":{},\"gpu_max_bytes\":{},\"gpu_end_bytes\":{}}}}}",
                e.epoch,
                self.pid,
                Micros(self.offset_ns.saturating_add(e.begin_ns)),
                Micros(e.end_ns.saturating_sub(e.begin_ns)),
                e.epoch,
                e.complete,
                e.gpu_begin_bytes,
                e.gpu_max_bytes,
                e.gpu_end_bytes,
            )?;
            w.summary.marks += 1;
        }
        Ok(())
    }
}

/// `{"<key>":"<text>"}` with the text escaped.
fn name_args(key: &str, text: &str) -> io::Result<String> {
    let mut buf = Vec::new();
    write!(buf, "{{\"{key}\":")?;
    json_str(&mut buf, text)?;
    buf.push(b'}');
    String::from_utf8(buf).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// The fields a scope slice takes from its stack's innermost frame.
fn scope_fields(defs: &Defs, stack: u32) -> io::Result<String> {
    let f = scope_text(defs, stack);
    let mut buf = Vec::new();
    buf.extend_from_slice(b"\"name\":");
    json_str(&mut buf, &f.name)?;
    write!(
        buf,
        ",\"cat\":\"{}\",\"args\":{{\"phase\":\"{}\",\"file\":",
        f.category(),
        f.phase.as_str()
    )?;
    json_str(&mut buf, f.file)?;
    write!(buf, ",\"line\":{}}}", f.line)?;
    String::from_utf8(buf).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Nanoseconds written as microseconds with exactly three decimals: Chrome's unit, without the
/// rounding a float conversion would add.
struct Micros(u64);

impl fmt::Display for Micros {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:03}", self.0 / 1000, self.0 % 1000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn micros_keep_every_nanosecond() {
        assert_eq!(Micros(0).to_string(), "0.000");
        assert_eq!(Micros(7).to_string(), "0.007");
        assert_eq!(Micros(1_234_567).to_string(), "1234.567");
        assert_eq!(Micros(u64::MAX).to_string(), "18446744073709551.615");
    }

    #[test]
    fn undefined_frames_and_stacks_print_instead_of_failing() {
        let defs = Defs::default();
        let f = scope_fields(&defs, 9).expect("fields");
        let v: serde_json::Value =
            serde_json::from_str(&format!("{{{f}}}")).expect("valid JSON fields");
        assert_eq!(v["name"], "<undefined stack 9>");
        assert_eq!(v["cat"], "scope");
        assert_eq!(v["args"]["file"], "?");
    }
}
