//! A diff as plain text (terminal, CI log) and as markdown (a pull-request comment).

use std::cmp::Ordering;
use std::fmt::{self, Write};

use rustc_hash::FxHashMap;

use super::compare::{Change, Diff, Row, ShowOptions, Violation};
use super::Parting;
use crate::tables::render::{humanized, time_auto};
use crate::tables::{Quantity, Section};

fn signed_text(v: i64, abs: impl Fn(u64) -> String) -> String {
    match v.cmp(&0) {
        Ordering::Less => format!("-{}", abs(v.unsigned_abs())),
        Ordering::Equal => abs(0),
        Ordering::Greater => format!("+{}", abs(v.unsigned_abs())),
    }
}

fn amount(q: Quantity, v: u64) -> String {
    match q {
        Quantity::Bytes => humanized(v),
        Quantity::Nanoseconds => time_auto(v),
        Quantity::Count => v.to_string(),
    }
}

pub(super) fn value_text(q: Quantity, v: Option<i64>) -> String {
    match v {
        None => "-".into(),
        Some(v) if v < 0 => format!("-{}", amount(q, v.unsigned_abs())),
        Some(v) => amount(q, v.unsigned_abs()),
    }
}

fn delta_text(r: &Row) -> String {
    signed_text(r.delta, |v| amount(r.quantity, v))
}

pub(super) fn change_text(r: &Row) -> String {
    match (r.base, r.new, r.delta_pct) {
        (None, _, _) => "added".into(),
        (_, None, _) => "removed".into(),
        (_, _, Some(p)) => format!("{p:+.2}%"),
        (_, _, None) => "from 0".into(),
    }
}

fn violation_text(d: &Diff, v: &Violation) -> String {
    let quantity = d
        .rows
        .iter()
        .find(|r| *r.key == *v.key)
        .map_or(Quantity::Count, |r| r.quantity);
    match v.value {
        Change::Percent(p) => format!("{p:+.2}%"),
        Change::FromZero => "grew from 0".into(),
        Change::Amount(a) => signed_text(a, |x| amount(quantity, x)),
    }
}

fn runs(n: usize) -> String {
    if n == 1 {
        "1 run".into()
    } else {
        format!("{n} runs (medians)")
    }
}

/// The widest a terminal table is, in characters.
pub const TABLE_WIDTH: usize = 160;
/// The longest line of the markdown.
pub const MARKDOWN_WIDTH: usize = 200;

/// Left-aligned first column (keys, shortened to fit [`TABLE_WIDTH`]: [`Labels`]),
/// right-aligned numbers, two spaces apart: the widths from a first pass, then each row's
/// cells made again and written (with `--all` on a large run, holding every cell at once
/// would cost more than the comparison).
fn columns(out: &mut dyn Write, head: &[String; 5], rows: &[&Row]) -> fmt::Result {
    let mut widths = [0usize; 5];
    let mut widen = |cells: &[String; 5]| {
        for (w, c) in widths.iter_mut().zip(cells).skip(1) {
            *w = (*w).max(c.chars().count());
        }
    };
    widen(head);
    for r in rows {
        widen(&cells(r));
    }
    let numbers: usize = widths[1..].iter().map(|w| w + 2).sum();
    let labels = Labels::new(rows, TABLE_WIDTH.saturating_sub(numbers).max(24));
    widths[0] = (labels.shown.iter().map(|l| l.chars().count()))
        .chain([head[0].chars().count()])
        .max()
        .unwrap_or(0);
    let mut line = String::new();
    let mut row = |out: &mut dyn Write, first: &str, cells: &[String; 5]| {
        line.clear();
        let _ = write!(line, "{first:<w$}", w = widths[0]);
        for (c, w) in cells.iter().zip(widths).skip(1) {
            let _ = write!(line, "  {c:>w$}");
        }
        out.write_str(line.trim_end())?;
        out.write_char('\n')
    };
    row(out, &head[0], head)?;
    for (i, r) in rows.iter().enumerate() {
        row(out, labels.get(i), &cells(r))?;
    }
    if labels.shortened {
        out.write_str("(keys with … are shortened; --format json gives them whole)\n")?;
    }
    Ok(())
}

fn cells(r: &Row) -> [String; 5] {
    [
        String::new(),
        value_text(r.quantity, r.base),
        value_text(r.quantity, r.new),
        delta_text(r),
        change_text(r),
    ]
}

/// The keys of a section's rows as shown: whole where they fit `width`, else a `line:`
/// stack by its innermost frames (`line:…;a.py:3:f;:0:aten::mm.used`, as many as keep it
/// unique), any other key cut in the middle; a key still shared after that gets `~N`.
/// Rules name keys whole: a shortened one says so with its `…`.
struct Labels {
    /// By the rows' order.
    shown: Vec<String>,
    shortened: bool,
}

/// A `line:` key's stack and figure: `line:a.py:1:f;b.py:2:g.used` is (`a.py:1:f;b.py:2:g`,
/// `used`).
fn line_key(key: &str) -> Option<(&str, &str)> {
    key.strip_prefix("line:")?.rsplit_once('.')
}

impl Labels {
    fn new(rows: &[&Row], width: usize) -> Labels {
        let mut shown: Vec<String> = rows.iter().map(|r| r.key.to_string()).collect();
        // `line:` stacks too wide: (row, frames, figure, innermost frames kept).
        let mut pending: Vec<(usize, Vec<&str>, &str, usize)> = Vec::new();
        for (i, r) in rows.iter().enumerate() {
            if r.key.chars().count() <= width {
                continue;
            }
            match line_key(&r.key) {
                Some((stack, figure)) => pending.push((i, stack.split(';').collect(), figure, 1)),
                None => shown[i] = cut_middle(&r.key, width),
            }
        }
        let innermost = |frames: &[&str], k: usize, figure: &str| {
            let k = k.min(frames.len());
            let dots = if k < frames.len() { "…;" } else { "" };
            format!(
                "line:{dots}{}.{figure}",
                frames[frames.len() - k..].join(";")
            )
        };
        // One more frame where two rows read the same, until none do.
        loop {
            let mut seen: FxHashMap<String, usize> = FxHashMap::default();
            for (_, frames, figure, k) in &pending {
                *seen.entry(innermost(frames, *k, figure)).or_default() += 1;
            }
            let mut grew = false;
            for (_, frames, figure, k) in &mut pending {
                if seen[&innermost(frames, *k, figure)] > 1 && *k < frames.len() {
                    *k += 1;
                    grew = true;
                }
            }
            if !grew {
                break;
            }
        }
        for (i, frames, figure, k) in &pending {
            shown[*i] = cut_middle(&innermost(frames, *k, figure), width);
        }
        // Whatever still reads the same (cut in the middle alike): numbered.
        let mut count: FxHashMap<String, usize> = FxHashMap::default();
        for label in &mut shown {
            let n = count.entry(label.clone()).or_default();
            *n += 1;
            if *n > 1 {
                // Numbered within the width: the label cut again to make room.
                let suffix = format!("~{n}");
                let room = width.saturating_sub(suffix.len());
                if label.chars().count() > room {
                    *label = cut_middle(label, room);
                }
                label.push_str(&suffix);
            }
        }
        let shortened = (rows.iter().zip(&shown)).any(|(r, l)| *l != *r.key);
        Labels { shown, shortened }
    }

    /// The label of the `i`th row.
    fn get(&self, i: usize) -> &str {
        &self.shown[i]
    }
}

/// `text` in at most `width` characters: its start and end, `…` between.
fn cut_middle(text: &str, width: usize) -> String {
    let n = text.chars().count();
    if n <= width {
        return text.to_string();
    }
    let keep = width.saturating_sub(1);
    let head = keep / 3;
    let tail = keep - head;
    let start: String = text.chars().take(head).collect();
    let end: String = text.chars().skip(n - tail).collect();
    format!("{start}…{end}")
}

/// The peak section's heading: how far the peak moved, then what its rows are.
fn peak_heading(d: &Diff) -> String {
    let moved = (d.rows.iter())
        .find(|r| r.section == Section::HEADLINE && &*r.key == "peak_used")
        .map(|r| match r.delta {
            0 => "the peak did not move".to_string(),
            v if v > 0 => format!("the peak grew {}", humanized(v as u64)),
            v => format!("the peak shrank {}", humanized(v.unsigned_abs())),
        });
    let what = "what was live at each run's peak, by category and by line";
    match moved {
        Some(m) => format!("{m}; {what}:"),
        None => format!("{what}:"),
    }
}

/// The "where they part" line ([`super::parting`]).
fn parting_text(p: &Parting) -> String {
    let margin = format!("{}, {}", humanized(p.margin_bytes), p.margin);
    match &p.at {
        None => format!(
            "where they part: nowhere; the new run never holds more than the base by over the margin ({margin})"
        ),
        Some(at) => {
            let when = match at.step {
                Some(step) => format!("in step {step}, {:.0}% into it", at.share * 100.0),
                None if at.share == 0.0 => "from the start".to_string(),
                None if p.by_steps => format!(
                    "before the first step, {:.0}% into the time before it",
                    at.share * 100.0
                ),
                None => format!("{:.0}% into the run", at.share * 100.0),
            };
            let more = (at.new_bytes - at.base_bytes).max(0) as u64;
            // Two lines, each well inside a terminal's 160 columns.
            format!(
                "where they part: {when}, the new run holds {} more ({} against {})\n  \
                 at {} into the new run, {} into the base; margin {margin}",
                humanized(more),
                humanized(at.new_bytes.max(0) as u64),
                humanized(at.base_bytes.max(0) as u64),
                time_auto(at.new_ns),
                time_auto(at.base_ns),
            )
        }
    }
}

/// Plain text for a terminal or a CI log: sections, then the verdict last, where a log
/// reader's eye lands.
pub fn render_table(d: &Diff, opts: &ShowOptions) -> String {
    let mut out = String::new();
    let _ = write_table(&mut out, d, opts);
    out
}

/// [`render_table`], written as it is made.
pub fn write_table(out: &mut dyn Write, d: &Diff, opts: &ShowOptions) -> fmt::Result {
    writeln!(
        out,
        "poolsight diff: base {}, new {}",
        runs(d.base_runs),
        runs(d.new_runs)
    )?;
    for s in d.shown(opts) {
        out.write_char('\n')?;
        if s.rows.is_empty() {
            writeln!(out, "{}: no change", s.section)?;
            continue;
        }
        if s.section == Section::PEAK {
            writeln!(out, "{}", peak_heading(d))?;
        }
        let head = [
            s.section.to_string(),
            "base".into(),
            "new".into(),
            "delta".into(),
            "change".into(),
        ];
        columns(out, &head, &s.rows)?;
        if s.more > 0 {
            writeln!(out, "... {} more changed rows (--top)", s.more)?;
        }
        if s.section == Section::HEADLINE {
            if let Some(p) = &d.parting {
                writeln!(out, "{}", parting_text(p))?;
            }
        }
    }
    out.write_char('\n')?;
    for r in &d.unmatched_rules {
        writeln!(out, "warning: rule `{r}` matched no figure of either run")?;
    }
    if d.failed() {
        writeln!(
            out,
            "FAIL: {} violation(s) of {} rule(s):",
            d.violations.len(),
            d.rules_checked
        )?;
        for v in &d.violations {
            writeln!(out, "  {}  {}  {}", v.rule, v.key, violation_text(d, v))?;
        }
    } else {
        writeln!(out, "OK: no rule crossed ({} checked)", d.rules_checked)?;
    }
    Ok(())
}

/// Inline code for a markdown table cell: `|` would end the cell and a backtick the span.
pub(super) fn code(s: &str) -> String {
    let s = s.replace('|', "\\|").replace(['\n', '\r'], " ");
    if s.contains('`') {
        format!("`` {s} ``")
    } else {
        format!("`{s}`")
    }
}

/// A section's table, keys shortened to keep each line within [`MARKDOWN_WIDTH`]; then,
/// folded, the stack behind each row that has one (a `peak.line` row's largest stack, a
/// shortened `line:` key's whole stack), a frame per line.
fn md_table(out: &mut dyn Write, head: &str, rows: &[&Row]) -> fmt::Result {
    let numbers = rows
        .iter()
        .map(|r| {
            cells(r)[1..]
                .iter()
                .map(|c| c.chars().count() + 3)
                .sum::<usize>()
        })
        .max()
        .unwrap_or(0);
    // `| `` … `` |` around the key and the escapes of `|` in it: room for 16.
    let labels = Labels::new(rows, MARKDOWN_WIDTH.saturating_sub(numbers + 16).max(24));
    writeln!(out, "| {head} | base | new | delta | change |")?;
    out.write_str("|:--|--:|--:|--:|--:|\n")?;
    for (i, r) in rows.iter().enumerate() {
        let c = cells(r);
        writeln!(
            out,
            "| {} | {} | {} | {} | {} |",
            code(labels.get(i)),
            c[1],
            c[2],
            c[3],
            c[4]
        )?;
    }
    let stacks: Vec<(&str, Vec<&str>)> = (rows.iter().enumerate())
        .filter_map(|(i, r)| {
            let label = labels.get(i);
            match &r.stack {
                Some(stack) => Some((label, stack.split('\n').collect())),
                None if label != &*r.key => {
                    line_key(&r.key).map(|(stack, _)| (label, stack.split(';').collect()))
                }
                None => None,
            }
        })
        .collect();
    if stacks.is_empty() {
        return Ok(());
    }
    out.write_str("\n<details><summary>the stacks behind these rows</summary>\n\n")?;
    for (label, frames) in stacks {
        writeln!(out, "{}\n", code(&cut_middle(label, MARKDOWN_WIDTH - 10)))?;
        out.write_str("```text\n")?;
        for f in frames {
            writeln!(out, "{}", cut_middle(&f.replace('`', "'"), MARKDOWN_WIDTH))?;
        }
        out.write_str("```\n\n")?;
    }
    out.write_str("</details>\n")
}

/// Markdown to post as a pull-request comment: the verdict and violations first, the
/// headline table, then each changed section folded in a `<details>` block.
pub fn render_markdown(d: &Diff, opts: &ShowOptions) -> String {
    let mut out = String::new();
    let _ = write_markdown(&mut out, d, opts);
    out
}

/// [`render_markdown`], written as it is made.
pub fn write_markdown(out: &mut dyn Write, d: &Diff, opts: &ShowOptions) -> fmt::Result {
    out.write_str("### poolsight diff\n\n")?;
    if d.failed() {
        writeln!(
            out,
            "❌ **{} violation(s)** of {} rule(s) (base: {}, new: {})\n",
            d.violations.len(),
            d.rules_checked,
            runs(d.base_runs),
            runs(d.new_runs)
        )?;
        out.write_str("| rule | key | change |\n|:--|:--|--:|\n")?;
        for v in &d.violations {
            writeln!(
                out,
                "| {} | {} | {} |",
                code(&v.rule),
                code(&v.key),
                violation_text(d, v)
            )?;
        }
        out.write_char('\n')?;
    } else {
        writeln!(
            out,
            "✅ **No rule crossed** ({} checked; base: {}, new: {})\n",
            d.rules_checked,
            runs(d.base_runs),
            runs(d.new_runs)
        )?;
    }
    for r in &d.unmatched_rules {
        writeln!(out, "⚠️ rule {} matched no figure of either run\n", code(r))?;
    }
    for s in d.shown(opts) {
        if s.section == Section::HEADLINE {
            md_table(out, "headline", &s.rows)?;
            out.write_char('\n')?;
            if let Some(p) = &d.parting {
                writeln!(out, "{}\n", parting_text(p))?;
            }
            continue;
        }
        if s.rows.is_empty() {
            continue;
        }
        // The peak's rows are the answer a reviewer came for: open; the rest folded.
        if s.section == Section::PEAK {
            writeln!(out, "{}\n", peak_heading(d))?;
        }
        writeln!(
            out,
            "<details{}><summary>{}: {} row(s)</summary>\n",
            if s.section == Section::PEAK {
                " open"
            } else {
                ""
            },
            s.section,
            s.rows.len() + s.more
        )?;
        md_table(out, s.section.as_str(), &s.rows)?;
        if s.more > 0 {
            writeln!(out, "\n… and {} more", s.more)?;
        }
        out.write_str("\n</details>\n\n")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn row(key: String) -> Row {
        Row {
            base: Some(1),
            delta: 1,
            delta_pct: Some(100.0),
            key: Arc::from(key),
            new: Some(2),
            quantity: Quantity::Bytes,
            section: Section("lines"),
            stack: None,
        }
    }

    #[test]
    fn shortened_keys_fit_their_width_and_stay_unique() {
        // Stacks that differ only in the middle: cut alike, then numbered, within the width.
        let rows: Vec<Row> = (0..12)
            .map(|i| {
                let outer = "a/very/long/path/train.py:1:main;".repeat(4);
                let inner = "model.py:9:forward;".repeat(4);
                let long = "x".repeat(40);
                row(format!("line:{outer}{long}{i}.py:1:f;{inner}aten::mm.used"))
            })
            .collect();
        let refs: Vec<&Row> = rows.iter().collect();
        let labels = Labels::new(&refs, 60);
        let shown: Vec<&str> = (0..refs.len()).map(|i| labels.get(i)).collect();
        assert!(labels.shortened);
        assert!(shown.iter().any(|l| l.contains('~')), "{shown:#?}");
        for l in &shown {
            assert!(l.chars().count() <= 60, "{l}: {}", l.chars().count());
        }
        let unique: std::collections::HashSet<_> = shown.iter().collect();
        assert_eq!(unique.len(), shown.len(), "{shown:#?}");
    }
}
