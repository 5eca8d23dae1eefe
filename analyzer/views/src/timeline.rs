//! The timeline plot: the pool's used and acquired bytes over time, one panel per trace (rank),
//! epochs shaded, the used peak marked. Hand-written SVG: a plot this simple does not justify a
//! plotting dependency, and writing it ourselves keeps the output byte-for-byte deterministic.
//!
//! The series holds each bucket's maximum, so the lines are drawn as steps that hold a bucket's
//! maximum across it: no peak falls between two points, and a gap (no event) holds the level.

use std::fmt::Write as _;

use poolsight_analyzer::replay::{Profile, Source};
use poolsight_analyzer::tables::render::{humanized, time_auto};

/// Why no timeline could be drawn.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimelineError {
    /// An empty plot would read as "memory stayed at zero", which the trace does not say.
    #[error("nothing to plot: the trace has no memory events (no pool malloc, free or device allocation)")]
    NoMemoryEvents,
}

const WIDTH: f64 = 1000.0;
const HEADER: f64 = 56.0;
const PANEL: f64 = 300.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 24.0;
/// Space above a panel's plot area (its subtitle) and below it (the time axis labels).
const PANEL_TOP: f64 = 28.0;
const PANEL_BOTTOM: f64 = 44.0;
const USED_COLOR: &str = "#d62728";
const ACQUIRED_COLOR: &str = "#1f77b4";

/// An SVG of the pool's used and acquired bytes over time for each trace of `profile`.
pub fn timeline_svg(profile: &Profile) -> Result<Vec<u8>, TimelineError> {
    if profile.sources.iter().all(|s| s.series.points.is_empty()) {
        return Err(TimelineError::NoMemoryEvents);
    }
    let height = HEADER + PANEL * profile.sources.len() as f64;
    let paths: Vec<&str> = profile.sources.iter().map(|s| s.path.as_str()).collect();
    let mut svg = String::new();
    // Writing into a String cannot fail; the results of `write!` below are ignored for that.
    let _ = write!(
        svg,
        concat!(
            r#"<?xml version="1.0" encoding="UTF-8"?>"#,
            "\n",
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="Verdana, sans-serif" font-size="12">"#,
            "\n",
            r#"<rect x="0" y="0" width="{w}" height="{h}" fill="white"/>"#,
            "\n",
            r#"<text x="{cx}" y="24" text-anchor="middle" font-size="17">poolsight timeline: {title}</text>"#,
            "\n"
        ),
        w = WIDTH,
        h = height,
        cx = WIDTH / 2.0,
        title = escape(&paths.join(", ")),
    );
    legend(&mut svg);
    for (k, source) in profile.sources.iter().enumerate() {
        let alone = profile.sources.len() == 1;
        panel(&mut svg, source, HEADER + PANEL * k as f64, alone);
    }
    svg.push_str("</svg>\n");
    Ok(svg.into_bytes())
}

fn legend(svg: &mut String) {
    let x = WIDTH - RIGHT - 230.0;
    for (i, (color, label)) in [
        (USED_COLOR, "used bytes"),
        (ACQUIRED_COLOR, "acquired bytes"),
    ]
    .into_iter()
    .enumerate()
    {
        let x = x + 120.0 * i as f64;
        let _ = writeln!(
            svg,
            r#"<g class="legend"><line x1="{x}" y1="42" x2="{x2}" y2="42" stroke="{color}" stroke-width="2"/><text x="{tx}" y="46">{label}</text></g>"#,
            x2 = x + 20.0,
            tx = x + 26.0,
        );
    }
}

/// One trace's plot, its top edge at `top`. A trace `alone` is named by the title already.
fn panel(svg: &mut String, s: &Source, top: f64, alone: bool) {
    let (x0, x1) = (LEFT, WIDTH - RIGHT);
    let (y0, y1) = (top + PANEL_TOP, top + PANEL - PANEL_BOTTOM);
    let last_ns = s.series.points.last().map_or(0, |p| p.0);
    let end_ns = s.epochs.iter().map(|e| e.end_ns).max().unwrap_or(0);
    let t_max = s.duration_ns.max(last_ns).max(end_ns).max(1) as f64;
    let b_max = s
        .series
        .points
        .iter()
        .map(|p| p.1.max(p.2))
        .max()
        .unwrap_or(0)
        .max(s.pool.peak_used_bytes.min(i64::MAX as u64) as i64)
        .max(1) as f64;
    let x = |ns: f64| x0 + (x1 - x0) * (ns / t_max).clamp(0.0, 1.0);
    let y = |b: f64| y1 - (y1 - y0) * (b.max(0.0) / b_max).min(1.0);

    let subtitle = match (s.rank, alone) {
        (Some(r), _) => format!("rank {r}: {}", s.path),
        (None, false) => s.path.clone(),
        (None, true) => String::new(),
    };
    if !subtitle.is_empty() {
        let _ = writeln!(
            svg,
            r#"<text x="{x0}" y="{ty}" font-size="13">{}</text>"#,
            escape(&subtitle),
            ty = top + 18.0,
        );
    }
    if s.series.points.is_empty() {
        let _ = writeln!(
            svg,
            r#"<text x="{cx}" y="{cy}" text-anchor="middle">no memory events in this trace</text>"#,
            cx = (x0 + x1) / 2.0,
            cy = (y0 + y1) / 2.0,
        );
        return;
    }

    for (i, e) in s.epochs.iter().enumerate() {
        let (ex0, ex1) = (x(e.begin_ns as f64), x(e.end_ns as f64));
        let opacity = if i % 2 == 0 { 0.10 } else { 0.20 };
        let _ = writeln!(
            svg,
            r##"<g class="epoch"><rect x="{ex0:.1}" y="{y0}" width="{w:.1}" height="{h}" fill="#7f7f7f" fill-opacity="{opacity}"/><text x="{tx:.1}" y="{ty}" font-size="10" fill="#555">epoch {n}</text></g>"##,
            w = (ex1 - ex0).max(0.5),
            h = y1 - y0,
            tx = ex0 + 3.0,
            ty = y0 + 12.0,
            n = e.epoch,
        );
    }

    let (t_unit, t_name) = time_unit(t_max);
    let t_step = nice_step(t_max / t_unit) * t_unit;
    for t in ticks(t_max, t_step) {
        let _ = writeln!(
            svg,
            r##"<line x1="{tx:.1}" y1="{y1}" x2="{tx:.1}" y2="{ty}" stroke="#333"/><text x="{tx:.1}" y="{ly}" text-anchor="middle">{}</text>"##,
            tick_label(t / t_unit, t_name),
            tx = x(t),
            ty = y1 + 5.0,
            ly = y1 + 18.0,
        );
    }
    let (b_unit, b_name) = byte_unit(b_max);
    let b_step = nice_step(b_max / b_unit) * b_unit;
    for b in ticks(b_max, b_step) {
        let _ = writeln!(
            svg,
            r##"<line x1="{x0}" y1="{by:.1}" x2="{x1}" y2="{by:.1}" stroke="#ddd"/><text x="{lx}" y="{ly:.1}" text-anchor="end">{}</text>"##,
            tick_label(b / b_unit, b_name),
            by = y(b),
            lx = x0 - 6.0,
            ly = y(b) + 4.0,
        );
    }
    let _ = writeln!(
        svg,
        r##"<path d="M{x0},{y0} V{y1} H{x1}" fill="none" stroke="#333"/><text x="{cx}" y="{ty}" text-anchor="middle">time</text>"##,
        cx = (x0 + x1) / 2.0,
        ty = y1 + 34.0,
    );

    for (color, pick) in [
        (
            ACQUIRED_COLOR,
            (|p: &(u64, i64, i64)| p.2) as fn(&(u64, i64, i64)) -> i64,
        ),
        (USED_COLOR, |p| p.1),
    ] {
        let mut d = String::new();
        let points = &s.series.points;
        let mut level = None;
        for (i, p) in points.iter().enumerate() {
            let next = points
                .get(i + 1)
                .map_or(p.0 as f64 + s.series.bucket_ns, |n| n.0 as f64);
            let (px, py) = (
                format!("{:.1}", x(p.0 as f64)),
                format!("{:.1}", y(pick(p) as f64)),
            );
            // A bucket at the level of the one before only extends the horizontal run.
            if level.as_ref() != Some(&py) {
                let cmd = if i == 0 { 'M' } else { 'L' };
                let _ = write!(d, "{cmd}{px},{py} ");
            }
            let _ = write!(d, "H{:.1} ", x(next));
            level = Some(py);
        }
        let _ = writeln!(
            svg,
            r#"<path d="{}" fill="none" stroke="{color}" stroke-width="1.5"/>"#,
            d.trim_end()
        );
    }

    if s.pool.peak_used_bytes > 0 {
        let (px, py) = (
            x(s.pool.peak_used_ns as f64),
            y(s.pool.peak_used_bytes as f64),
        );
        let anchor = if px > (x0 + x1) / 2.0 { "end" } else { "start" };
        let lx = if anchor == "end" { px - 8.0 } else { px + 8.0 };
        let _ = writeln!(
            svg,
            r#"<g class="peak"><circle cx="{px:.1}" cy="{py:.1}" r="4" fill="{USED_COLOR}"/><text x="{lx:.1}" y="{ly:.1}" text-anchor="{anchor}">peak {} at {}</text></g>"#,
            humanized(s.pool.peak_used_bytes),
            time_auto(s.pool.peak_used_ns),
            ly = (py - 6.0).max(y0 + 24.0),
        );
    }
}

/// The largest of B, KB, ... (1024 steps) that keeps `max` at 1 or more, so labels stay short.
fn byte_unit(max: f64) -> (f64, &'static str) {
    let mut unit = (1.0, "B");
    for name in ["KB", "MB", "GB", "TB", "PB"] {
        let next = unit.0 * 1024.0;
        if max < next {
            break;
        }
        unit = (next, name);
    }
    unit
}

fn time_unit(max: f64) -> (f64, &'static str) {
    [(1e9, "s"), (1e6, "ms"), (1e3, "us")]
        .into_iter()
        .find(|&(u, _)| max >= u)
        .unwrap_or((1.0, "ns"))
}

/// A tick step of 1, 2 or 5 times a power of ten giving 4 to 10 ticks over `span`.
fn nice_step(span: f64) -> f64 {
    let raw = (span / 5.0).max(f64::MIN_POSITIVE);
    let mag = 10f64.powf(raw.log10().floor());
    let n = raw / mag;
    let f = if n <= 1.0 {
        1.0
    } else if n <= 2.0 {
        2.0
    } else if n <= 5.0 {
        5.0
    } else {
        10.0
    };
    f * mag
}

/// 0, step, 2 step, ... up to `max`; multiplied rather than summed so that no error accumulates.
fn ticks(max: f64, step: f64) -> impl Iterator<Item = f64> {
    (0u32..)
        .map(move |i| f64::from(i) * step)
        .take_while(move |&v| v <= max * (1.0 + 1e-9))
}

/// A tick value without trailing zeros: `2`, `2.5`, `0.25`; zero as `0` since a unit on it
/// says nothing.
fn tick_label(v: f64, unit: &str) -> String {
    if v == 0.0 {
        return "0".to_string();
    }
    format!("{}{unit}", trim(v))
}

fn trim(v: f64) -> String {
    let s = format!("{v:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Text from traces (paths, names) is user data; it must not be read as markup (SVG or
/// HTML); control characters, which XML forbids, become spaces.
pub(crate) fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_and_ticks_read_as_people_write_them() {
        assert_eq!(nice_step(10.0), 2.0);
        assert_eq!(nice_step(1000.0), 200.0);
        assert_eq!(trim(2.50), "2.5");
        assert_eq!(
            escape("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
    }
}
