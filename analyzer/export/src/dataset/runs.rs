//! Run ids and the `runs` table.
//!
//! A trace header has no job id, so the ranks of one run are found as `poolsight` finds them
//! when merging (the same command line and world size), and the run is named after its first
//! rank's header. Precisely, without `--run-id`:
//!
//! 1. Traces with a world size are grouped by (command line, world size); a trace without
//!    one is a run of its own.
//! 2. Each group, in order of start time, is cut into runs: a trace whose rank is already in
//!    the current run starts the next one (last night's rank 0 and tonight's are two runs).
//! 3. A run's id is the 64-bit FNV-1a hash, as 16 lowercase hex digits, of its lowest rank's
//!    host, wall-clock start (ns since the Unix epoch), command line and world size (each
//!    field length-prefixed, see [`hash_run`]).
//!
//! The same traces give the same ids wherever and however often they are exported; the ranks
//! of a run exported separately (a node each) agree as long as each export includes the run's
//! lowest rank — otherwise give `--run-id` (a scheduler's job id), which names every trace
//! given.

use std::sync::Arc;

use arrow_array::{
    ArrayRef, BooleanArray, Int32Array, Int64Array, RecordBatch, StringArray,
    TimestampMicrosecondArray,
};
use arrow_schema::{Field, Schema};

use super::{ExportError, SCHEMA_VERSION};
use poolsight_analyzer::read::Trace;
use poolsight_analyzer::replay::Profile;
use poolsight_analyzer::tables::columns::i64_of;

/// A trace's rank: the header's, or 0 for a process that gave none (a run of one).
pub fn rank_of(t: &Trace) -> u32 {
    t.header.rank.unwrap_or(0)
}

/// The run id of each trace, in the order given (see the module's documentation).
pub fn run_ids(traces: &[Trace], given: Option<&str>) -> Vec<String> {
    if let Some(id) = given {
        return vec![id.to_string(); traces.len()];
    }
    let mut ids = vec![String::new(); traces.len()];
    let mut order: Vec<usize> = (0..traces.len()).collect();
    order.sort_by(|&a, &b| {
        let (ha, hb) = (&traces[a].header, &traces[b].header);
        (&ha.command_line, ha.world_size, ha.unix_ns, &traces[a].path).cmp(&(
            &hb.command_line,
            hb.world_size,
            hb.unix_ns,
            &traces[b].path,
        ))
    });
    let mut run: Vec<usize> = Vec::new();
    let mut flush = |run: &mut Vec<usize>| {
        let first = run
            .iter()
            .copied()
            .min_by_key(|&i| (rank_of(&traces[i]), traces[i].header.unix_ns));
        if let Some(first) = first {
            let id = hash_run(&traces[first]);
            for &i in run.iter() {
                ids[i] = id.clone();
            }
        }
        run.clear();
    };
    for i in order {
        let t = &traces[i];
        let same_job = |j: &usize| {
            let (a, b) = (&traces[*j].header, &t.header);
            a.world_size.is_some()
                && (&a.command_line, a.world_size) == (&b.command_line, b.world_size)
        };
        let continues = run.first().is_some_and(same_job)
            && !run.iter().any(|&j| rank_of(&traces[j]) == rank_of(t));
        if !continues {
            flush(&mut run);
        }
        run.push(i);
    }
    flush(&mut run);
    ids
}

/// FNV-1a (64-bit) of the run's defining header fields, each as a little-endian u64 length
/// (or value) followed by its bytes: host, start ns, the command line's argument count and
/// each argument, world size (`u64::MAX` when none).
pub fn hash_run(t: &Trace) -> String {
    let h = &t.header;
    let mut fnv = Fnv(0xcbf2_9ce4_8422_2325);
    fnv.field(h.host.as_bytes());
    fnv.u64(h.unix_ns);
    fnv.u64(h.command_line.len() as u64);
    for arg in &h.command_line {
        fnv.field(arg.as_bytes());
    }
    fnv.u64(h.world_size.map_or(u64::MAX, u64::from));
    format!("{:016x}", fnv.0)
}

struct Fnv(u64);

impl Fnv {
    fn bytes(&mut self, b: &[u8]) {
        for &x in b {
            self.0 = (self.0 ^ u64::from(x)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }
    fn field(&mut self, b: &[u8]) {
        self.u64(b.len() as u64);
        self.bytes(b);
    }
}

/// The `runs` row of one trace: its header, whether it is whole, and the pool's figures from
/// the replay (what `poolsight info` prints).
pub fn runs_batch(trace: &Trace, profile: &Profile) -> Result<RecordBatch, ExportError> {
    let h = &trace.header;
    let source = profile.sources.first();
    let pool = source.map(|s| s.pool.clone()).unwrap_or_default();
    let int = |v: i64| -> ArrayRef { Arc::new(Int64Array::from(vec![v])) };
    let text = |v: &str| -> ArrayRef { Arc::new(StringArray::from(vec![v])) };
    let columns: Vec<(&str, ArrayRef, bool)> = vec![
        (
            "schema_version",
            Arc::new(Int32Array::from(vec![SCHEMA_VERSION as i32])),
            false,
        ),
        (
            "world_size",
            Arc::new(Int64Array::from(vec![h.world_size.map(i64::from)])),
            true,
        ),
        ("host", text(&h.host), false),
        ("pid", int(i64::from(h.pid)), false),
        ("command_line", text(&h.command_line.join(" ")), false),
        ("start_unix_ns", int(i64_of(h.unix_ns)), false),
        (
            "start_time",
            // Microseconds: engines compare it with now() without a cast (DuckDB's TIMESTAMP_NS
            // does not); the exact ns are in start_unix_ns.
            Arc::new(
                TimestampMicrosecondArray::from(vec![i64_of(h.unix_ns / 1000)])
                    .with_timezone("UTC"),
            ),
            false,
        ),
        (
            "format_version",
            text(&format!("{}.{}", h.format_major, h.format_minor)),
            false,
        ),
        ("writer", text(&h.writer), false),
        ("trace_path", text(&trace.path.display().to_string()), false),
        (
            "finished",
            Arc::new(BooleanArray::from(vec![trace.finished()])),
            false,
        ),
        (
            "dropped_events",
            int(i64_of(trace.footer.map_or(0, |f| f.dropped_events))),
            false,
        ),
        ("torn_chunks", int(trace.torn_chunks() as i64), false),
        ("warnings", int(trace.warnings.len() as i64), false),
        // The replay's count, as `info` and `report` give it, whichever tables are written.
        ("events", int(i64_of(source.map_or(0, |s| s.events))), false),
        (
            "duration_ns",
            int(i64_of(source.map_or(0, |s| s.duration_ns))),
            false,
        ),
        ("peak_used_bytes", int(i64_of(pool.peak_used_bytes)), false),
        ("peak_used_ns", int(i64_of(pool.peak_used_ns)), false),
        (
            "peak_acquired_bytes",
            int(i64_of(pool.peak_acquired_bytes)),
            false,
        ),
        (
            "peak_acquired_ns",
            int(i64_of(pool.peak_acquired_ns)),
            false,
        ),
        ("mallocs", int(i64_of(pool.mallocs)), false),
        ("out_of_memory", int(i64_of(pool.out_of_memory)), false),
    ];
    let fields: Vec<Field> = columns
        .iter()
        .map(|(name, a, nullable)| Field::new(*name, a.data_type().clone(), *nullable))
        .collect();
    let arrays = columns.into_iter().map(|(_, a, _)| a).collect();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays)
        .map_err(|e| ExportError::Arrow(e.to_string()))
}
