//! `report`'s first section: what was live at the peak of live bytes — in all, by memory
//! category, by line (the user's line of each allocation: [`user_line`]) and by scope (the
//! outermost `record_function` range, inferred phase or user scope, or module, of its stack) —
//! largest first, each
//! with its share. It needs the live bytes at the peak by stack
//! ([`crate::ReplayOptions::live_at_peak`]); without them it prints nothing.

use std::collections::HashMap;

use serde::Serialize;

use super::render::{aligned, humanized};
use super::{DiffKey, Figures, Quantity, ReportOptions, Table};
use crate::read::names::{FrameKind, Phase};
use crate::replay::{signed, user_line, Profile};

/// Rows shown per grouping.
const ROWS: usize = 8;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Peak {
    /// The headline's peak (the largest rank's).
    pub peak_used_bytes: u64,
    /// The bytes the groupings share out: live at the peak, or, with several ranks, at each
    /// rank's own peak, summed.
    pub live_bytes: u64,
    /// How many traces (ranks) the figures cover.
    pub ranks: usize,
    /// When, ns since the start (the rank whose peak is the headline's).
    pub peak_ns: u64,
    pub by_category: Vec<Share>,
    pub by_line: Vec<Share>,
    pub by_scope: Vec<Share>,
    /// Each device's own peak of live bytes (at its own instant), for traces whose blocks are
    /// on several devices; ranks in order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub by_device: Vec<DeviceShare>,
    /// Whether the replay computed the live bytes at the peak.
    #[serde(skip)]
    pub computed: bool,
    /// For `diff`: every category's bytes (empty when no stack has a label), untruncated.
    #[serde(skip)]
    pub all_categories: Vec<Share>,
    /// For `diff`: every line's bytes, with the largest stack behind it (its frames outermost
    /// first, one per line of the text), untruncated.
    #[serde(skip)]
    pub all_lines: Vec<(Share, String)>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Share {
    pub name: String,
    pub bytes: u64,
}

/// One device's own peak.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DeviceShare {
    pub device: String,
    /// `gpu`, `cpu` or `unspecified` (a pool's device).
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    pub peak_bytes: u64,
    pub peak_ns: u64,
}

impl Peak {
    pub fn is_empty(&self) -> bool {
        !self.computed
    }
}

/// Every entry of `map` with bytes, largest first (then by name).
fn ranked(map: HashMap<String, u64>) -> Vec<Share> {
    let mut v: Vec<Share> = map
        .into_iter()
        .filter(|(_, b)| *b > 0)
        .map(|(name, bytes)| Share { name, bytes })
        .collect();
    v.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.name.cmp(&b.name)));
    v
}

/// The first `keep` of `ranked`, the rest summed in one `(N more)` row.
fn top(ranked: &[Share], keep: usize) -> Vec<Share> {
    let mut v = ranked[..keep.min(ranked.len())].to_vec();
    if ranked.len() > keep {
        v.push(Share {
            name: format!("({} more)", ranked.len() - keep),
            bytes: ranked[keep..].iter().map(|s| s.bytes).sum(),
        });
    }
    v
}

pub fn peak(p: &Profile) -> Peak {
    let Some(source) = p.sources.iter().max_by_key(|s| s.pool.peak_used_bytes) else {
        return Peak::default();
    };
    let live: u64 = p.tree.nodes.iter().map(|n| n.agg.live_at_peak_bytes).sum();
    // Computed when the replay took the live bytes at the peak (they add up to it).
    let computed = live > 0 || source.pool.peak_used_bytes == 0;
    if !computed {
        return Peak::default();
    }
    let (mut cats, mut lines, mut scopes) = (HashMap::new(), HashMap::new(), HashMap::new());
    // Per line, its largest stack: (bytes, node).
    let mut behind: HashMap<String, (u64, usize)> = HashMap::new();
    let mut any_label = false;
    let mut any_scope = false;
    for (i, n) in p.tree.nodes.iter().enumerate() {
        let bytes = n.agg.live_at_peak_bytes;
        if bytes == 0 {
            continue;
        }
        let path = p.tree.path(i);
        let label = path.iter().rev().find(|f| f.kind == FrameKind::Label);
        any_label |= label.is_some();
        let category = label.map_or("(unlabelled)".to_string(), |f| f.name.to_string());
        *cats.entry(category).or_insert(0u64) += bytes;
        let line = user_line(&path);
        let largest = behind.entry(line.clone()).or_insert((0, i));
        if bytes > largest.0 {
            *largest = (bytes, i);
        }
        *lines.entry(line).or_insert(0u64) += bytes;
        // A `record_function` range or a scope of the user's (no phase), or a module.
        let scope = path.iter().find(|f| {
            f.kind == FrameKind::Link
                || super::categories::phase_of(std::iter::once(**f)).is_some()
                || (matches!(f.kind, FrameKind::Function | FrameKind::Scope)
                    && f.phase == Phase::None
                    && f.file.is_empty())
        });
        any_scope |= scope.is_some();
        let scope = scope.map_or("(outside every scope)".to_string(), |f| f.name.to_string());
        *scopes.entry(scope).or_insert(0u64) += bytes;
    }
    let all_categories = if any_label { ranked(cats) } else { Vec::new() };
    let by_line = ranked(lines);
    let all_lines = (by_line.iter().cloned())
        .map(|s| {
            let stack = behind
                .get(&s.name)
                .map_or(String::new(), |&(_, node)| stack_text(&p.tree.path(node)));
            (s, stack)
        })
        .collect();
    Peak {
        peak_used_bytes: source.pool.peak_used_bytes,
        live_bytes: live,
        ranks: p.sources.len(),
        peak_ns: source.pool.peak_used_ns,
        by_category: top(&all_categories, ROWS),
        by_line: top(&by_line, ROWS),
        by_scope: if any_scope {
            top(&ranked(scopes), ROWS)
        } else {
            Vec::new()
        },
        by_device: (p.sources.iter())
            .filter(|s| s.device_peaks.len() > 1)
            .flat_map(|s| {
                s.device_peaks.iter().map(|d| DeviceShare {
                    device: d.name.clone(),
                    kind: d.kind.to_string(),
                    rank: s.rank.filter(|_| p.sources.len() > 1),
                    peak_bytes: d.peak_used_bytes,
                    peak_ns: d.peak_used_ns,
                })
            })
            .collect(),
        computed: true,
        all_categories,
        all_lines,
    }
}

/// A stack as a person reads it, one frame per line, outermost first: a located frame as
/// `file:line:function`, one without a file (an operator, a module, a scope) by its name, a
/// phase as `phase: NAME`; its category (a label) is left out, the key says it.
pub fn stack_text(path: &[&crate::replay::Frame]) -> String {
    let mut out = String::new();
    for f in path.iter().filter(|f| f.kind != FrameKind::Label) {
        if !out.is_empty() {
            out.push('\n');
        }
        if super::categories::phase_of(std::iter::once(*f)).is_some() {
            out.push_str(&format!("phase: {}", f.name));
        } else if !f.file.is_empty() && f.line > 0 {
            out.push_str(&format!("{}:{}:{}", f.file, f.line, f.name));
        } else {
            out.push_str(&f.name);
        }
    }
    out
}

fn pct(part: u64, whole: u64) -> String {
    if whole == 0 {
        "-".into()
    } else {
        format!("{:.0}%", part as f64 * 100.0 / whole as f64)
    }
}

fn block(out: &mut String, title: &str, rows: &[Share], whole: u64) {
    if rows.is_empty() {
        return;
    }
    out.push_str(&format!("  {title}:\n"));
    let figures: Vec<Vec<String>> = rows
        .iter()
        .map(|s| vec![format!("    {}", humanized(s.bytes)), pct(s.bytes, whole)])
        .collect();
    for (f, s) in aligned(&figures, false).lines().zip(rows) {
        out.push_str(&format!("{f}  {}\n", s.name));
    }
}

pub fn render_table(t: &Peak) -> String {
    if t.is_empty() || t.peak_used_bytes == 0 {
        return String::new();
    }
    let mut out = if t.ranks > 1 {
        format!(
            "live at each rank's own peak ({} ranks): {} in all\n",
            t.ranks,
            humanized(t.live_bytes)
        )
    } else {
        format!(
            "live at the peak: {} at {:.6} s\n",
            humanized(t.peak_used_bytes),
            t.peak_ns as f64 / 1e9
        )
    };
    block(&mut out, "by category", &t.by_category, t.live_bytes);
    block(&mut out, "by line", &t.by_line, t.live_bytes);
    block(&mut out, "by scope", &t.by_scope, t.live_bytes);
    if !t.by_device.is_empty() {
        out.push_str("  each device's own peak:\n");
        let figures: Vec<Vec<String>> = (t.by_device.iter())
            .map(|d| vec![format!("    {}", humanized(d.peak_bytes))])
            .collect();
        for (f, d) in aligned(&figures, false).lines().zip(&t.by_device) {
            let rank = d.rank.map_or(String::new(), |r| format!("rank {r} "));
            let at = d.peak_ns as f64 / 1e9;
            out.push_str(&format!("{f}  {rank}{} at {at:.6} s\n", d.device));
        }
    }
    out
}

#[derive(Serialize, Default)]
struct ShareRow {
    grouping: &'static str,
    name: String,
    bytes: u64,
}

impl Table for Peak {
    const NAME: &'static str = "peak";
    const FIGURES: &'static [DiffKey] = &[
        DiffKey::named("peak.category", Quantity::Bytes),
        DiffKey::named("peak.line", Quantity::Bytes),
    ];

    fn compute(p: &Profile, _: &ReportOptions) -> Peak {
        peak(p)
    }

    fn render_table(&self, _: &ReportOptions) -> String {
        render_table(self)
    }

    fn render_csv(&self) -> String {
        let rows: Vec<ShareRow> = [
            ("category", &self.by_category),
            ("line", &self.by_line),
            ("scope", &self.by_scope),
        ]
        .iter()
        .flat_map(|(g, v)| {
            v.iter().map(move |s| ShareRow {
                grouping: g,
                name: s.name.clone(),
                bytes: s.bytes,
            })
        })
        .chain(self.by_device.iter().map(|d| ShareRow {
            grouping: "device_peak",
            name: d.device.clone(),
            bytes: d.peak_bytes,
        }))
        .collect();
        super::csv::to_csv(&rows)
    }

    /// What was live at the peak, by category and by line (the user's line and the operator
    /// under it, [`user_line`]), each with the largest stack behind it.
    fn figures(&self, out: &mut Figures) {
        for c in &self.all_categories {
            out.named::<Self>("peak.category", &c.name, signed(c.bytes), None);
        }
        for (l, stack) in &self.all_lines {
            let stack = (!stack.is_empty()).then_some(stack.as_str());
            out.named::<Self>("peak.line", &l.name, signed(l.bytes), stack);
        }
    }
}
