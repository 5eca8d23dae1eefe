//! The analyzer's target figures on a multi-GB trace: `report` throughput (>= 50 M events/s, and
//! <= 1.5x the time to merely read the file) and peak memory (<= 0.25x the trace size).
//!
//! ```text
//! cargo bench --bench analyze                          # 100 M events (~3 GB trace)
//! cargo bench --bench analyze -- --events 10000000     # a quick run (also: 10M, 1G suffixes)
//! POOLSIGHT_BENCH_EVENTS=10M cargo bench --bench analyze
//! cargo bench --bench analyze -- --keep /data/t.pstrace --runs 3
//! ```
//!
//! Options: `--events N` (or env `POOLSIGHT_BENCH_EVENTS`; default 100 M), `--keep PATH` (the
//! trace goes to PATH instead of `$TMPDIR/poolsight-bench-{N}.pstrace`), `--runs K` (analyze K
//! times, each in its own child process; default 1), `--fresh` (regenerate even if a matching
//! trace exists), `--delete` (remove the trace afterwards), `--packed` (also pack the trace,
//! `PATH.packed`, and analyze the packed copy the same way, after the live one). Unknown flags
//! (criterion's `--bench`) are ignored.
//!
//! How:
//! 1. **Trace.** Written with the recorder's low-level API (no pool, no hooks), so 100 M events
//!    take seconds: two writer threads each run a training-like loop over a 32-block model
//!    (forward function and link scopes, backward, an optimizer update), with a caching pool
//!    simulated per thread (its own stream): `malloc_post`/`free_post` pairs on pointers unique
//!    while live, `alloc_post` on pool misses, a `release` of the cache at each epoch boundary,
//!    and `EpochBegin`/`EpochEnd` marks every N/10 events. About 300 distinct stacks. A marker
//!    file next to the trace (`.ok`) records events and size, so a later run reuses it.
//! 2. **Read.** Every byte of the file through `std::fs::File::read` into a 4 MiB buffer, twice:
//!    the first warms the page cache, the second is the reference (both are printed).
//! 3. **Analyze**, in a child process (this binary re-executed with `--child-analyze PATH`):
//!    `Trace::open_deferred` (verification but the event chunks' checksums), `replay` (which
//!    checks those checksums as it reads each chunk), then the reports, each timed, as
//!    `poolsight report` loads a trace. The peak RSS is the
//!    child's own `VmHWM` (`/proc/self/status`), read when it is done: `wait4`'s `ru_maxrss` is
//!    not, because Linux carries the parent's high-water mark into the child through fork and
//!    exec, so a run that generated a multi-GB trace first reported the generator's peak.
//!
//! Figures are printed next to their targets; nothing is asserted on timing.

use std::fmt::Display;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use poolsight::analyzer::export::pack::{pack, PackOptions};
use poolsight::analyzer::tables::{Report, ReportOptions};
use poolsight::analyzer::{replay, ReplayOptions, Trace};
use poolsight::recorder::writer::now_ticks;
use poolsight::recorder::{
    DeviceInfo, Frame, FrameKind, Handle, MarkKind, MemKind, MemRecord, Phase, Recorder,
    RecorderConfig,
};

const DEFAULT_EVENTS: u64 = 100_000_000;
const WRITER_THREADS: u64 = 2;
const EPOCHS: u64 = 10;
/// Bumped whenever the generated workload changes, so stale traces are not reused.
const GENERATOR_VERSION: u32 = 1;
const ALLOCATION_UNIT: u64 = 512;
const READ_BUFFER: usize = 4 << 20;

const TARGET_EVENTS_PER_S: f64 = 50e6;
const TARGET_READ_RATIO: f64 = 1.5;
const TARGET_RSS_RATIO: f64 = 0.25;
const TARGET_BYTES_PER_EVENT: f64 = 32.0;
const TARGET_PACKED_BYTES_PER_EVENT: f64 = 6.0;

type Res<T> = Result<T, String>;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.iter().position(|a| a == "--child-analyze") {
        Some(i) => match args.get(i + 1) {
            Some(path) => child_analyze(Path::new(path)),
            None => Err("--child-analyze needs a path".into()),
        },
        None => Options::parse(&args).and_then(|o| run(&o)),
    };
    if let Err(e) = result {
        eprintln!("analyze bench: {e}");
        std::process::exit(2);
    }
}

struct Options {
    events: u64,
    path: PathBuf,
    runs: u32,
    fresh: bool,
    delete: bool,
    packed: bool,
}

impl Options {
    fn parse(args: &[String]) -> Res<Options> {
        let mut events = match std::env::var("POOLSIGHT_BENCH_EVENTS") {
            Ok(v) => parse_count(&v).map_err(|e| format!("POOLSIGHT_BENCH_EVENTS: {e}"))?,
            Err(_) => DEFAULT_EVENTS,
        };
        let mut keep = None;
        let mut runs = 1;
        let mut fresh = false;
        let mut delete = false;
        let mut packed = false;
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut value = |name: &str| {
                it.next()
                    .cloned()
                    .ok_or_else(|| format!("{name} needs a value"))
            };
            match a.as_str() {
                "--events" => {
                    events =
                        parse_count(&value("--events")?).map_err(|e| format!("--events: {e}"))?
                }
                "--keep" => keep = Some(PathBuf::from(value("--keep")?)),
                "--runs" => {
                    runs = value("--runs")?
                        .parse()
                        .map_err(|e| format!("--runs: {e}"))?
                }
                "--fresh" => fresh = true,
                "--delete" => delete = true,
                "--packed" => packed = true,
                _ => {} // criterion's --bench and anything else cargo passes
            }
        }
        if events < 1000 {
            return Err(format!("--events {events}: use at least 1000 events"));
        }
        let path = keep.unwrap_or_else(|| {
            std::env::temp_dir().join(format!("poolsight-bench-{events}.pstrace"))
        });
        Ok(Options {
            events,
            path,
            runs: runs.max(1),
            fresh,
            delete,
            packed,
        })
    }
}

/// `100000000`, `100_000_000`, `100M`, `10k`, `1G`.
fn parse_count(s: &str) -> Res<u64> {
    let s = s.trim().replace('_', "");
    let (digits, mult) = match s.char_indices().last() {
        Some((i, 'k' | 'K')) => (&s[..i], 1_000),
        Some((i, 'm' | 'M')) => (&s[..i], 1_000_000),
        Some((i, 'g' | 'G')) => (&s[..i], 1_000_000_000),
        _ => (&s[..], 1),
    };
    digits
        .parse::<u64>()
        .map(|n| n.saturating_mul(mult))
        .map_err(|e| format!("{s:?} is not a count ({e})"))
}

fn run(o: &Options) -> Res<()> {
    println!(
        "poolsight analyzer benchmark: {} events, trace {}, {} CPUs available",
        o.events,
        o.path.display(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let file_bytes = ensure_trace(o)?;
    if let Ok(load) = std::fs::read_to_string("/proc/loadavg") {
        println!("load average before measuring: {}", load.trim());
    }

    let (cold_s, _) = read_file(&o.path)?;
    let (read_s, read_bytes) = read_file(&o.path)?;
    if read_bytes != file_bytes {
        return Err(format!(
            "read {read_bytes} bytes but the file has {file_bytes}: was it changed meanwhile?"
        ));
    }
    println!(
        "read: first {cold_s:.3} s ({:.2} GB/s, warms the page cache), second {read_s:.3} s ({:.2} GB/s)",
        gbps(file_bytes, cold_s),
        gbps(file_bytes, read_s)
    );

    analyze_runs(o, &o.path, file_bytes, read_s, file_bytes)?;
    if o.packed {
        let packed_path = PathBuf::from(format!("{}.packed", o.path.display()));
        let trace = Trace::open(&o.path).map_err(|e| e.to_string())?;
        let start = Instant::now();
        let s = pack(&trace, &packed_path, &PackOptions::default()).map_err(|e| e.to_string())?;
        drop(trace);
        println!(
            "\npacked in {:.2} s: {} -> {} bytes, {:.2} bytes/event ({:.1}x smaller)",
            start.elapsed().as_secs_f64(),
            s.bytes_in,
            s.bytes_out,
            s.bytes_out as f64 / s.events.max(1) as f64,
            s.bytes_in as f64 / s.bytes_out.max(1) as f64
        );
        let _ = read_file(&packed_path)?;
        let (packed_read_s, _) = read_file(&packed_path)?;
        println!("read of the packed file (warm): {packed_read_s:.3} s");
        analyze_runs(o, &packed_path, s.bytes_out, packed_read_s, file_bytes)?;
        if o.delete {
            let _ = std::fs::remove_file(&packed_path);
        }
    }

    if o.delete {
        remove_trace(&o.path);
        println!("deleted {}", o.path.display());
    } else {
        println!(
            "trace kept for reuse: {} (--delete removes it)",
            o.path.display()
        );
    }
    Ok(())
}

/// Analyzes `path` `o.runs` times and prints the figures; `live_bytes` is the size of the live
/// (unpacked) trace, the reference of the memory target.
fn analyze_runs(
    o: &Options,
    path: &Path,
    file_bytes: u64,
    read_s: f64,
    live_bytes: u64,
) -> Res<()> {
    let mut results = Vec::new();
    for run in 1..=o.runs {
        let r = analyze_in_child(path)?;
        println!(
            "analyze run {run}: open {:.3} s, replay {:.3} s, report {}, total {:.3} s, child CPU {:.3} s, peak RSS {:.1} MB",
            r.open_s,
            r.replay_s,
            r.report_s
                .map_or("not run".to_string(), |s| format!("{s:.3} s")),
            r.total_s(),
            r.cpu_s,
            r.max_rss_kib as f64 / 1024.0
        );
        results.push(r);
    }
    // The fastest run is the figure (the machine is shared); RSS is the largest seen.
    let best = results
        .iter()
        .min_by(|a, b| a.total_s().total_cmp(&b.total_s()))
        .ok_or("no analyze run")?;
    let max_rss = results.iter().map(|r| r.max_rss_kib).max().unwrap_or(0);
    print_figures(file_bytes, read_s, best, max_rss, live_bytes);
    Ok(())
}

fn gbps(bytes: u64, s: f64) -> f64 {
    bytes as f64 / s.max(1e-9) / 1e9
}

fn marker_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".ok");
    PathBuf::from(p)
}

fn remove_trace(path: &Path) {
    let _ = std::fs::remove_file(marker_path(path));
    let _ = std::fs::remove_file(path);
}

/// The marker's content for a trace of `events` events and `bytes` bytes.
fn marker(events: u64, bytes: u64) -> String {
    format!("poolsight-bench v{GENERATOR_VERSION} events={events} bytes={bytes}\n")
}

/// Generates the trace unless a matching one (marker and size) is there; returns its size.
fn ensure_trace(o: &Options) -> Res<u64> {
    if !o.fresh {
        if let (Ok(m), Ok(meta)) = (
            std::fs::read_to_string(marker_path(&o.path)),
            std::fs::metadata(&o.path),
        ) {
            if m == marker(o.events, meta.len()) {
                println!(
                    "reusing {} ({:.2} GB, marker matches; --fresh regenerates)",
                    o.path.display(),
                    meta.len() as f64 / 1e9
                );
                return Ok(meta.len());
            }
        }
    }
    remove_trace(&o.path);
    let start = Instant::now();
    let (events, bytes) = generate(&o.path, o.events)?;
    let secs = start.elapsed().as_secs_f64();
    std::fs::write(marker_path(&o.path), marker(o.events, bytes))
        .map_err(|e| format!("cannot write {}: {e}", marker_path(&o.path).display()))?;
    println!(
        "generated {events} events in {secs:.2} s ({:.1} M events/s, {WRITER_THREADS} writer threads): {:.2} GB, {:.2} bytes/event",
        events as f64 / secs / 1e6,
        bytes as f64 / 1e9,
        bytes as f64 / events as f64
    );
    Ok(bytes)
}

// ------------------------------------------------------------------------------------------
// Trace generation

/// One layer function: a forward scope under its block's link, its allocation site, and the
/// backward scope and site (outside any link, as Chainer's `loss.backward()` runs).
struct Func {
    fwd_scope: u32,
    fwd_site: u32,
    bwd_scope: u32,
    bwd_site: u32,
    size: Size,
}

struct Block {
    link: u32,
    funcs: Vec<Func>,
    update_scope: u32,
    update_site: u32,
    params: Size,
}

#[derive(Clone, Copy)]
struct Size {
    requested: u64,
    mem: u64,
    /// Free-list index (one per distinct `mem`).
    bin: usize,
}

struct Model {
    model_link: u32,
    data_site: u32,
    batch: Size,
    blocks: Vec<Block>,
    bins: usize,
}

const FUNCS: [(&str, &str, u32); 4] = [
    (
        "LinearFunction",
        "chainer/functions/connection/linear.py",
        21,
    ),
    (
        "LayerNormalization",
        "chainer/functions/normalization/layer_normalization.py",
        48,
    ),
    ("ReLU", "chainer/functions/activation/relu.py", 37),
    ("Dropout", "chainer/functions/noise/dropout.py", 30),
];
const BLOCKS: usize = 32;
const BATCH: u64 = 64;

impl Model {
    fn build(h: &Handle) -> Model {
        let frame = |kind, phase, file: &str, line, name: &str| {
            h.intern_frame(&Frame {
                kind,
                phase,
                file: file.to_owned(),
                line,
                name: name.to_owned(),
            })
        };
        let (fk, ph) = (FrameKind::Link, Phase::Forward);
        let classifier = h.intern_stack(0, frame(fk, ph, "train.py", 88, "Classifier"));
        let model_link = h.intern_stack(classifier, frame(fk, ph, "model.py", 140, "Model"));
        let data_site = h.intern_stack(
            0,
            frame(
                FrameKind::Site,
                Phase::None,
                "chainer/dataset/convert.py",
                62,
                "<top>",
            ),
        );
        let mut mems: Vec<u64> = Vec::new();
        let mut size = |requested: u64| {
            let mem = requested.div_ceil(ALLOCATION_UNIT) * ALLOCATION_UNIT;
            let bin = match mems.iter().position(|&m| m == mem) {
                Some(b) => b,
                None => {
                    mems.push(mem);
                    mems.len() - 1
                }
            };
            Size {
                requested,
                mem,
                bin,
            }
        };
        let batch = size(BATCH * 784 * 4);
        let update = frame(
            FrameKind::Function,
            Phase::None,
            "chainer/optimizers/sgd.py",
            25,
            "SGD.update",
        );
        let update_scope = h.intern_stack(0, update);
        let update_site = h.intern_stack(
            update_scope,
            frame(
                FrameKind::Site,
                Phase::None,
                "chainer/optimizers/sgd.py",
                31,
                "SGD.update",
            ),
        );
        let blocks = (0..BLOCKS)
            .map(|i| {
                let width = 512 + 128 * (i as u64 % 6);
                let link = h.intern_stack(
                    model_link,
                    frame(fk, ph, "model.py", 60 + i as u32, &format!("block{i}")),
                );
                let funcs = FUNCS
                    .iter()
                    .enumerate()
                    .map(|(k, &(name, file, line))| {
                        let fwd = frame(FrameKind::Function, ph, file, line, name);
                        let bwd = frame(FrameKind::Function, Phase::Backward, file, line, name);
                        let site = frame(FrameKind::Site, Phase::None, file, line + 9, name);
                        let fwd_scope = h.intern_stack(link, fwd);
                        let bwd_scope = h.intern_stack(0, bwd);
                        Func {
                            fwd_scope,
                            fwd_site: h.intern_stack(fwd_scope, site),
                            bwd_scope,
                            bwd_site: h.intern_stack(bwd_scope, site),
                            // Dropout keeps a mask next to its output: odd sizes on purpose.
                            size: size(BATCH * width * 4 + 8 * k as u64),
                        }
                    })
                    .collect();
                Block {
                    link,
                    funcs,
                    update_scope,
                    update_site,
                    params: size(width * width * 4 + 12),
                }
            })
            .collect();
        Model {
            model_link,
            data_site,
            batch,
            blocks,
            bins: mems.len(),
        }
    }
}

#[derive(Clone, Copy)]
struct Alloc {
    ptr: u64,
    pmem: u32,
    size: Size,
}

/// One thread's simulated caching pool (its own stream), writing the events a `TraceHook`
/// would write for it.
struct Pool {
    h: Handle,
    stream: u16,
    free: Vec<Vec<(u64, u32)>>,
    cached: u64,
    next_ptr: u64,
    next_pmem: u32,
    events: u64,
}

impl Pool {
    fn new(h: Handle, thread: u64, bins: usize) -> Pool {
        Pool {
            h,
            stream: thread as u16 + 1,
            free: vec![Vec::new(); bins],
            cached: 0,
            next_ptr: 0x7f00_0000_0000 + (thread << 40),
            next_pmem: (thread as u32) << 28,
            events: 0,
        }
    }

    #[inline]
    fn mem(&mut self, kind: MemKind, ptr: u64, bytes: u64, stack: u32, pmem: u32) {
        self.h.record_mem(MemRecord {
            kind,
            device: 0,
            stream: self.stream,
            ptr,
            bytes,
            stack,
            pmem,
        });
        self.events += 1;
    }

    fn malloc(&mut self, stack: u32, size: Size) -> Alloc {
        let (ptr, pmem) = match self.free[size.bin].pop() {
            Some(hit) => {
                self.cached -= size.mem;
                hit
            }
            None => {
                let ptr = self.next_ptr;
                self.next_ptr += size.mem;
                self.next_pmem = self.next_pmem.wrapping_add(1);
                self.mem(MemKind::AllocPost, ptr, size.mem, stack, 0);
                (ptr, self.next_pmem)
            }
        };
        self.mem(MemKind::MallocPost, ptr, size.requested, stack, pmem);
        Alloc { ptr, pmem, size }
    }

    fn free(&mut self, b: Alloc) {
        self.mem(MemKind::FreePost, b.ptr, b.size.mem, 0, b.pmem);
        self.free[b.size.bin].push((b.ptr, b.pmem));
        self.cached += b.size.mem;
    }

    /// `free_all_blocks`: the cache goes back to the device.
    fn release(&mut self) {
        if self.cached > 0 {
            self.mem(MemKind::Release, 0, self.cached, 0, 0);
            self.free.iter_mut().for_each(Vec::clear);
            self.cached = 0;
        }
    }

    #[inline]
    fn scope(&mut self, stack: u32, start: u64) {
        self.h.record_scope(stack, start);
        self.events += 1;
    }
}

/// One training step: batch in, forward through the blocks, backward, optimizer update.
fn step(p: &mut Pool, m: &Model, acts: &mut Vec<Alloc>) {
    let x = p.malloc(m.data_site, m.batch);
    let model_start = now_ticks();
    for b in &m.blocks {
        let link_start = now_ticks();
        for f in &b.funcs {
            let s = now_ticks();
            acts.push(p.malloc(f.fwd_site, f.size));
            p.scope(f.fwd_scope, s);
        }
        p.scope(b.link, link_start);
    }
    p.scope(m.model_link, model_start);
    let mut grad: Option<Alloc> = None;
    for b in m.blocks.iter().rev() {
        for f in b.funcs.iter().rev() {
            let s = now_ticks();
            let g = p.malloc(f.bwd_site, f.size);
            if let Some(a) = acts.pop() {
                p.free(a);
            }
            if let Some(old) = grad.replace(g) {
                p.free(old);
            }
            p.scope(f.bwd_scope, s);
        }
    }
    if let Some(g) = grad {
        p.free(g);
    }
    for b in &m.blocks {
        let s = now_ticks();
        let tmp = p.malloc(b.update_site, b.params);
        p.free(tmp);
        p.scope(b.update_scope, s);
    }
    p.free(x);
}

/// Events one writer thread records: its share, epochs marked by thread 0.
fn writer_thread(h: Handle, m: &Model, thread: u64, quota: u64) -> u64 {
    let marks = thread == 0;
    let mut p = Pool::new(h.clone(), thread, m.bins);
    let mut acts = Vec::with_capacity(BLOCKS * FUNCS.len());
    let mut marks_written = 0u64;
    let mut epoch = 0u64;
    if marks {
        h.record_mark(MarkKind::EpochBegin, 0, 0, 0);
        marks_written += 1;
    }
    while p.events + marks_written < quota {
        step(&mut p, m, &mut acts);
        let due = (epoch + 1) * quota / EPOCHS;
        if p.events + marks_written >= due && epoch + 1 < EPOCHS {
            if marks {
                h.record_mark(MarkKind::EpochEnd, epoch as u32, 0, 0);
            }
            p.release();
            epoch += 1;
            if marks {
                h.record_mark(MarkKind::EpochBegin, epoch as u32, 0, 0);
                marks_written += 2;
            }
        }
    }
    if marks {
        h.record_mark(MarkKind::EpochEnd, epoch as u32, 0, 0);
        marks_written += 1;
    }
    p.events + marks_written
}

/// Writes a trace of about `events` events (whole steps); returns (events, file bytes).
fn generate(path: &Path, events: u64) -> Res<(u64, u64)> {
    let config = RecorderConfig {
        devices: vec![DeviceInfo::pool(0, "bench:0", 80 << 30, ALLOCATION_UNIT)],
        command_line: Some(vec!["poolsight-bench-analyze".into(), events.to_string()]),
        calibration: Duration::from_millis(2),
        ..RecorderConfig::default()
    };
    let rec = Recorder::create(path, config).map_err(|e| e.to_string())?;
    let model = Arc::new(Model::build(&rec.handle()));
    let written: Vec<u64> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..WRITER_THREADS)
            .map(|t| {
                let (h, m) = (rec.handle(), &model);
                let quota = events / WRITER_THREADS + u64::from(t < events % WRITER_THREADS);
                std::thread::Builder::new()
                    .name(format!("trainer-{t}"))
                    .spawn_scoped(s, move || writer_thread(h, m, t, quota))
            })
            .collect();
        threads
            .into_iter()
            .map(|t| match t {
                Ok(j) => j.join().unwrap_or(0),
                Err(_) => 0,
            })
            .collect()
    });
    if written.contains(&0) {
        return Err("a writer thread could not be started or panicked".into());
    }
    let summary = rec.finish().map_err(|e| e.to_string())?;
    if summary.dropped_events > 0 {
        return Err(format!(
            "the recorder dropped {} events",
            summary.dropped_events
        ));
    }
    Ok((written.iter().sum(), summary.file_bytes))
}

// ------------------------------------------------------------------------------------------
// Reading and analyzing

/// Seconds to read every byte through `read`, and the bytes read.
fn read_file(path: &Path) -> Res<(f64, u64)> {
    let mut f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut buf = vec![0u8; READ_BUFFER];
    let mut total = 0u64;
    let mut sum = 0u64;
    let start = Instant::now();
    loop {
        let n = match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        sum += buf[..n]
            .iter()
            .step_by(4096)
            .map(|&b| b as u64)
            .sum::<u64>();
        total += n as u64;
    }
    let secs = start.elapsed().as_secs_f64();
    std::hint::black_box(sum);
    Ok((secs, total))
}

struct Analysis {
    open_s: f64,
    replay_s: f64,
    report_s: Option<f64>,
    events: u64,
    chunks: u64,
    warnings: u64,
    max_rss_kib: u64,
    /// User and system CPU seconds of the child: on a shared machine, how much of the wall
    /// time it actually ran.
    cpu_s: f64,
}

impl Analysis {
    fn total_s(&self) -> f64 {
        self.open_s + self.replay_s + self.report_s.unwrap_or(0.0)
    }
}

/// The child side: analyze `path`, print one `key=value` line for the parent.
fn child_analyze(path: &Path) -> Res<()> {
    // As `poolsight report` loads a trace (`load::load`): checksums are checked as the replay
    // reads each chunk; were one not to hold, the file would be opened again, checked whole.
    let t0 = Instant::now();
    let trace = Trace::open_deferred(path).map_err(|e| e.to_string())?;
    let t1 = Instant::now();
    let after_open = memory_status();
    let profile = replay(&trace, 0, &ReplayOptions::default());
    if !trace.checksums_hold() {
        return Err(format!(
            "{}: a chunk's checksum does not hold",
            path.display()
        ));
    }
    let t2 = Instant::now();
    let after_replay = memory_status();
    // The reports, computed and rendered as `poolsight report` prints them.
    let opts = ReportOptions::default();
    let report = Report::compute(&profile, &opts);
    std::hint::black_box(report.render_table(&opts));
    let report_s = Some(t2.elapsed().as_secs_f64());
    let events: u64 = profile.sources.iter().map(|s| s.events).sum();
    std::hint::black_box(&profile);
    println!("memory after open: {after_open}");
    println!("memory after replay: {after_replay}");
    println!(
        "CHILD open_s={} replay_s={} report_s={} events={} chunks={} warnings={} hwm_kib={}",
        (t1 - t0).as_secs_f64(),
        (t2 - t1).as_secs_f64(),
        report_s.map_or(-1.0, |s| s),
        events,
        trace.chunks.len(),
        trace.warnings.len(),
        status_kib("VmHWM:").ok_or("no VmHWM in /proc/self/status")?
    );
    Ok(())
}

/// One `kB` field of `/proc/self/status`.
fn status_kib(key: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(key))?;
    line[key.len()..].split_whitespace().next()?.parse().ok()
}

/// This process's resident memory now and its high-water mark, from `/proc/self/status`.
fn memory_status() -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let fields: Vec<String> = status
        .lines()
        .filter(|l| {
            ["VmHWM:", "VmRSS:", "RssAnon:", "RssFile:"]
                .iter()
                .any(|k| l.starts_with(k))
        })
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    if fields.is_empty() {
        "(no /proc/self/status)".into()
    } else {
        fields.join(", ")
    }
}

fn analyze_in_child(path: &Path) -> Res<Analysis> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
    let mut child = Command::new(exe)
        .arg("--child-analyze")
        .arg(path)
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start the analyze child: {e}"))?;
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        for l in BufReader::new(out).lines() {
            let l = l.map_err(|e| format!("reading the child's output: {e}"))?;
            if l.starts_with("CHILD ") {
                line = l;
            } else {
                println!("  child: {l}");
            }
        }
    }
    let (status, cpu_s) = wait_with_rusage(child.id())?;
    if status != 0 {
        return Err(format!("the analyze child failed (wait status {status})"));
    }
    let field = |k: &str| -> Res<f64> {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("the child did not report {k}: {line:?}"))
    };
    let report_s = field("report_s")?;
    Ok(Analysis {
        open_s: field("open_s")?,
        replay_s: field("replay_s")?,
        report_s: (report_s >= 0.0).then_some(report_s),
        events: field("events")? as u64,
        chunks: field("chunks")? as u64,
        warnings: field("warnings")? as u64,
        max_rss_kib: field("hwm_kib")? as u64,
        cpu_s,
    })
}

/// Reaps `pid`: (wait status, user + system CPU seconds).
fn wait_with_rusage(pid: u32) -> Res<(i32, f64)> {
    let mut status = 0;
    // SAFETY: rusage is plain data; zeroed is a valid value for it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: pid is our own child, not yet reaped (std's Child is never waited on); the
        // pointers are valid for the call.
        let rc = unsafe { libc::wait4(pid as libc::pid_t, &mut status, 0, &mut usage) };
        if rc == pid as libc::pid_t {
            break;
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(format!("wait4 on the analyze child: {err}"));
        }
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let cpu = secs(usage.ru_utime) + secs(usage.ru_stime);
    Ok((status, cpu))
}

// ------------------------------------------------------------------------------------------
// Output

fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "NOT met"
    }
}

fn row(what: &str, value: impl Display, target: &str, ok: Option<bool>) {
    let v = ok.map_or("", verdict);
    println!("  {what:<34} {value:>16}   {target:<28} {v}");
}

fn print_figures(file_bytes: u64, read_s: f64, a: &Analysis, max_rss_kib: u64, live_bytes: u64) {
    let total = a.total_s();
    let eps = a.events as f64 / total.max(1e-9);
    let ratio = total / read_s.max(1e-9);
    let rss = max_rss_kib * 1024;
    // Against the live trace's size, packed or not: what the analysis would map unpacked.
    let rss_ratio = rss as f64 / live_bytes.max(1) as f64;
    let bpe = file_bytes as f64 / a.events.max(1) as f64;
    println!();
    println!("analyzer figures against their targets (fastest analyze run; peak RSS of the analyze child):");
    row("events (analyzer's count)", a.events, "", None);
    row(
        "chunks / warnings",
        format!("{} / {}", a.chunks, a.warnings),
        "",
        None,
    );
    row("file bytes", file_bytes, "", None);
    let packed = file_bytes != live_bytes;
    row(
        "bytes/event",
        format!("{bpe:.2}"),
        if packed {
            "<= 6 (packed)"
        } else {
            "<= 32 (live)"
        },
        Some(
            bpe <= if packed {
                TARGET_PACKED_BYTES_PER_EVENT
            } else {
                TARGET_BYTES_PER_EVENT
            },
        ),
    );
    row("read (warm page cache)", format!("{read_s:.3} s"), "", None);
    row(
        "read throughput",
        format!("{:.2} GB/s", gbps(file_bytes, read_s)),
        "",
        None,
    );
    row(
        "open (checksums deferred)",
        format!("{:.3} s", a.open_s),
        "",
        None,
    );
    row("replay", format!("{:.3} s", a.replay_s), "", None);
    match a.report_s {
        Some(s) => row("report (compute + render)", format!("{s:.3} s"), "", None),
        None => row(
            "report (compute + render)",
            "not run",
            "(module not wired yet)",
            None,
        ),
    }
    row("analyze total", format!("{total:.3} s"), "", None);
    row(
        "analyze child CPU (user+sys)",
        format!("{:.3} s", a.cpu_s),
        "",
        None,
    );
    row(
        "analyze throughput",
        format!("{:.1} M events/s", eps / 1e6),
        ">= 50 M events/s",
        Some(eps >= TARGET_EVENTS_PER_S),
    );
    row(
        "analyze / read",
        format!("{ratio:.2}x"),
        "<= 1.5x",
        Some(ratio <= TARGET_READ_RATIO),
    );
    row(
        "analyze peak RSS",
        format!("{:.1} MB", rss as f64 / 1e6),
        "",
        None,
    );
    row(
        "peak RSS / live trace size",
        format!("{rss_ratio:.4}x"),
        "<= 0.25x",
        Some(rss_ratio <= TARGET_RSS_RATIO),
    );
}
