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
//! Figures are printed next to their targets; nothing is asserted on timing. The parts:
//! `generate` (the trace), `child` (reading and analyzing it), `figures` (what is printed).

#[path = "analyze/child.rs"]
mod child;
#[path = "analyze/figures.rs"]
mod figures;
#[path = "analyze/generate.rs"]
mod generate;

use std::path::{Path, PathBuf};
use std::time::Instant;

use poolsight::analyzer::export::pack::{pack, PackOptions};
use poolsight::analyzer::Trace;

use child::{analyze_in_child, child_analyze, read_file};
use figures::{gbps, print_figures};
use generate::{generate, WRITER_THREADS};

const DEFAULT_EVENTS: u64 = 100_000_000;
/// Bumped whenever the generated workload changes, so stale traces are not reused.
const GENERATOR_VERSION: u32 = 1;

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
