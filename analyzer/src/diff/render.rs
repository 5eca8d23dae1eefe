//! A diff as plain text (terminal, CI log) and as markdown (a pull-request comment).

use std::cmp::Ordering;
use std::fmt::{self, Write};

use super::compare::{Change, Diff, Row, ShowOptions, Violation};
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

/// Left-aligned first column (keys), right-aligned numbers, two spaces apart: the widths
/// from a first pass, then each row's cells made again and written (with `--all` on a large
/// run, holding every cell at once would cost more than the comparison).
fn columns(out: &mut dyn Write, head: &[String; 5], rows: &[&Row]) -> fmt::Result {
    let mut widths = [0usize; 5];
    let mut widen = |cells: &[String; 5]| {
        for (w, c) in widths.iter_mut().zip(cells) {
            *w = (*w).max(c.chars().count());
        }
    };
    widen(head);
    for r in rows {
        widen(&cells(r));
    }
    let mut line = String::new();
    let mut row = |out: &mut dyn Write, cells: &[String; 5]| {
        line.clear();
        let _ = write!(line, "{:<w$}", cells[0], w = widths[0]);
        for (c, w) in cells.iter().zip(widths).skip(1) {
            let _ = write!(line, "  {c:>w$}");
        }
        out.write_str(line.trim_end())?;
        out.write_char('\n')
    };
    row(out, head)?;
    for r in rows {
        row(out, &cells(r))?;
    }
    Ok(())
}

fn cells(r: &Row) -> [String; 5] {
    [
        r.key.to_string(),
        value_text(r.quantity, r.base),
        value_text(r.quantity, r.new),
        delta_text(r),
        change_text(r),
    ]
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

fn md_table(out: &mut dyn Write, head: &str, rows: &[&Row]) -> fmt::Result {
    writeln!(out, "| {head} | base | new | delta | change |")?;
    out.write_str("|:--|--:|--:|--:|--:|\n")?;
    for r in rows {
        let c = cells(r);
        writeln!(
            out,
            "| {} | {} | {} | {} | {} |",
            code(&c[0]),
            c[1],
            c[2],
            c[3],
            c[4]
        )?;
    }
    Ok(())
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
            continue;
        }
        if s.rows.is_empty() {
            continue;
        }
        writeln!(
            out,
            "<details><summary>{}: {} row(s)</summary>\n",
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
