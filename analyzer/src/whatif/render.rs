//! `whatif` as a person reads it: one table per device, the settings side by side, and the
//! check's agreement in words. The JSON is the result types' own ([`super::json`]).

use super::{Check, Report};

/// Bytes as people read them: `20.0 MiB`.
pub fn human(b: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// A time since the run began: `147.0 us`, `3.2 ms`, `12.345 s`.
fn duration(ns: u64) -> String {
    let t = ns as f64;
    if ns < 1_000 {
        format!("{ns} ns")
    } else if ns < 1_000_000 {
        format!("{:.1} us", t / 1e3)
    } else if ns < 1_000_000_000 {
        format!("{:.1} ms", t / 1e6)
    } else {
        format!("{:.3} s", t / 1e9)
    }
}

/// Every report, one table each, a blank line between them.
pub fn tables(reports: &[Report], min: bool) -> String {
    reports
        .iter()
        .map(|r| table(r, min))
        .collect::<Vec<_>>()
        .join("\n")
}

/// One device's table: the heading, the settings side by side, and what was live at each
/// first failure.
pub fn table(r: &Report, min: bool) -> String {
    let mut s = String::new();
    let cap = match r.capacity_bytes {
        Some(c) => format!("{} ({})", human(c), r.capacity_source),
        None => "none known (pass --capacity; nothing fails)".into(),
    };
    s.push_str(&format!(
        "{}: {} requests; recorded reserved peak {}; capacity {cap}\n",
        r.heading,
        r.requests,
        human(r.recorded_reserved_peak_bytes)
    ));
    for n in &r.notes {
        s.push_str(&format!("note: {n}\n"));
    }
    let mut header: Vec<String> = [
        "settings",
        "reserved peak",
        "allocated peak",
        "fragmentation",
        "inactive split",
        "fits",
    ]
    .map(String::from)
    .to_vec();
    if min {
        header.push("min capacity".into());
    }
    header.push("first failure".into());
    let rows: Vec<Vec<String>> = r
        .runs
        .iter()
        .map(|run| {
            let mut row = vec![
                if run.recorded {
                    format!("recorded ({})", run.label)
                } else {
                    run.label.clone()
                },
                human(run.reserved_peak_bytes),
                human(run.allocated_peak_bytes),
                human(run.fragmentation_bytes),
                human(run.inactive_split_bytes),
                match (r.capacity_bytes, run.fits) {
                    (None, _) => "-".into(),
                    (Some(_), true) => "yes".into(),
                    (Some(_), false) => "no".into(),
                },
            ];
            if min {
                row.push(run.min_capacity_bytes.map_or("-".into(), human));
            }
            row.push(match &run.first_failure {
                None => "-".into(),
                Some(f) => format!(
                    "{} at {} ({} allocated of {} reserved){}",
                    human(f.requested_bytes),
                    duration(f.ns),
                    human(f.allocated_bytes),
                    human(f.reserved_bytes),
                    f.line
                        .as_deref()
                        .map_or(String::new(), |l| format!(", {l}"))
                ),
            });
            row
        })
        .collect();
    s.push_str(&aligned(&header, &rows));
    for run in &r.runs {
        let Some(f) = &run.first_failure else {
            continue;
        };
        let live: Vec<String> = f
            .live_top_lines
            .iter()
            .map(|l| {
                format!(
                    "{} {}",
                    human(l.bytes),
                    l.line.as_deref().unwrap_or("(no stack)")
                )
            })
            .collect();
        if !live.is_empty() {
            s.push_str(&format!(
                "live at the first failure of {}: {}\n",
                if run.recorded {
                    "the recorded settings"
                } else {
                    &run.label
                },
                live.join(", ")
            ));
        }
    }
    s
}

/// Columns two spaces apart: figures right-aligned, the settings and the failure left.
fn aligned(header: &[String], rows: &[Vec<String>]) -> String {
    let cols = header.len();
    let width: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .map(|r| r[c].chars().count())
                .chain([header[c].chars().count()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: &[String]| {
        let mut l = String::new();
        for (c, cell) in cells.iter().enumerate() {
            if c > 0 {
                l.push_str("  ");
            }
            let pad = width[c] - cell.chars().count();
            if c == 0 || c == cols - 1 {
                l.push_str(cell);
                l.push_str(&" ".repeat(pad));
            } else {
                l.push_str(&" ".repeat(pad));
                l.push_str(cell);
            }
        }
        l.trim_end().to_string() + "\n"
    };
    let mut s = line(header);
    for row in rows {
        s.push_str(&line(row));
    }
    s
}

/// The checks in words, device by device.
pub fn checks(checks: &[Check]) -> String {
    let mut s = String::new();
    for c in checks {
        s.push_str(&format!(
            "{} (device {}, settings {}): {}\n",
            c.trace,
            c.device,
            c.settings,
            if c.exact {
                "the model agrees with every recorded segment and block"
            } else {
                "the model disagrees"
            }
        ));
        s.push_str(&format!(
            "  segments: {} recorded, {} simulated, {} matching in size and order\n",
            c.segments_recorded, c.segments_simulated, c.segments_matching
        ));
        s.push_str(&format!(
            "  blocks: {} of {} at the recorded offset in the recorded segment\n",
            c.block_offsets_matching, c.blocks_checked
        ));
        if !c.starts_empty && c.initial_segments > 0 {
            s.push_str(&format!(
                "  the recording began with {} segments held: the model starts from them, as the snapshot's segments imply\n",
                c.initial_segments
            ));
        } else if !c.starts_empty {
            s.push_str(
                "  note: the recording did not start with the allocator empty and its segments do not say how it was: the model started empty\n",
            );
        }
        if c.recorded_by != "pytorch" {
            s.push_str(
                "  note: only a PyTorch snapshot records the caching allocator's own segments: agreement is not expected here\n",
            );
        }
        if let Some(m) = &c.first_mismatch {
            s.push_str(&format!("  first difference: {m}\n"));
        }
    }
    if checks.is_empty() {
        s.push_str("no memory events to check\n");
    }
    s
}
