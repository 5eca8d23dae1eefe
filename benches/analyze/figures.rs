//! The figures, printed next to their targets (SPEC §6).

use std::fmt::Display;

use super::child::Analysis;

const TARGET_EVENTS_PER_S: f64 = 50e6;
const TARGET_READ_RATIO: f64 = 1.5;
const TARGET_RSS_RATIO: f64 = 0.25;
const TARGET_BYTES_PER_EVENT: f64 = 32.0;
const TARGET_PACKED_BYTES_PER_EVENT: f64 = 6.0;

pub fn gbps(bytes: u64, s: f64) -> f64 {
    bytes as f64 / s.max(1e-9) / 1e9
}

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

pub fn print_figures(
    file_bytes: u64,
    read_s: f64,
    a: &Analysis,
    max_rss_kib: u64,
    live_bytes: u64,
) {
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
