//! Reading the trace (the reference time) and analyzing it in a child process, as `poolsight
//! report` loads a trace.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use poolsight::analyzer::tables::{Report, ReportOptions};
use poolsight::analyzer::{replay, ReplayOptions, Trace};

use super::Res;

const READ_BUFFER: usize = 4 << 20;

/// Seconds to read every byte through `read`, and the bytes read.
pub fn read_file(path: &Path) -> Res<(f64, u64)> {
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

pub struct Analysis {
    pub open_s: f64,
    pub replay_s: f64,
    pub report_s: Option<f64>,
    pub events: u64,
    pub chunks: u64,
    pub warnings: u64,
    pub max_rss_kib: u64,
    /// User and system CPU seconds of the child: on a shared machine, how much of the wall
    /// time it actually ran.
    pub cpu_s: f64,
}

impl Analysis {
    pub fn total_s(&self) -> f64 {
        self.open_s + self.replay_s + self.report_s.unwrap_or(0.0)
    }
}

/// The child side: analyze `path`, print one `key=value` line for the parent.
pub fn child_analyze(path: &Path) -> Res<()> {
    // As `poolsight report` loads a trace (`analyzer::load`): checksums are checked as the replay
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

pub fn analyze_in_child(path: &Path) -> Res<Analysis> {
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
