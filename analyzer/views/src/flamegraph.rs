//! Flamegraphs of the calling-context tree: folded stacks (`frame;frame;frame VALUE`, the format
//! every flamegraph tool reads) and inferno's SVG rendering of them, plain or differential.
//!
//! Each line carries a node's *own* amount, never its subtree's: a flamegraph tool adds children
//! into their parents itself, so inclusive values would count every byte once per ancestor.
//!
//! Frames read name first, then location (`MLP (src/demo.rs:481)`, see [`frame_display`]), so
//! that a narrow frame still shows what it is (the SVG cuts a long label on the right, keeping
//! the name); sanitized so that a name from user code cannot change how a line parses (see
//! [`frame_label`] and [`folded_stack`]).

use std::fmt;
use std::str::FromStr;

use inferno::flamegraph::color::{BasicPalette, Palette};
use inferno::flamegraph::{self as inferno_fg, Options, TextTruncateDirection};

use poolsight_analyzer::read::names::FrameKind;
use poolsight_analyzer::replay::{CallTree, Frame, Profile};

pub use poolsight_frames::short_file;

/// What a flamegraph's widths measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Metric {
    /// Bytes of successful pool mallocs (CuPy's "used"), frees not subtracted.
    Used,
    /// Bytes of device allocations made on pool misses (CuPy's "acquired").
    Acquired,
    /// Bytes still live at the moment of the pool's used peak: what to cut to lower the peak.
    Peak,
    /// Self time of scopes (function, link, user scope), in ns.
    Time,
}

impl Metric {
    pub const ALL: [Metric; 4] = [Metric::Used, Metric::Acquired, Metric::Peak, Metric::Time];

    /// The unit the SVG's tooltips show after each count.
    pub fn count_name(self) -> &'static str {
        match self {
            Metric::Time => "ns",
            _ => "bytes",
        }
    }

    /// What the profile lacks when this metric has nothing to draw, for the error message.
    fn missing(self) -> &'static str {
        match self {
            Metric::Used => "no pool mallocs",
            Metric::Acquired => "no device allocations",
            Metric::Peak => {
                "no bytes live at the pool's peak (or it was replayed without live_at_peak)"
            }
            Metric::Time => "no closed scopes (function, link or scope)",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Metric::Used => "used",
            Metric::Acquired => "acquired",
            Metric::Peak => "peak",
            Metric::Time => "time",
        }
    }

    /// A node's own amount of this metric. Scope time is inclusive of nested scopes, so their
    /// time is taken out; only scope nodes have time, so subtracting every child's is the same.
    pub fn self_value(self, tree: &CallTree, i: usize) -> u64 {
        let n = &tree.nodes[i];
        match self {
            Metric::Used => n.agg.used_bytes,
            Metric::Acquired => n.agg.acquired_bytes,
            Metric::Peak => n.agg.live_at_peak_bytes,
            Metric::Time => {
                let nested = n
                    .children
                    .iter()
                    .fold(0u64, |t, &c| t.saturating_add(tree.nodes[c].agg.time_ns));
                n.agg.time_ns.saturating_sub(nested)
            }
        }
    }
}

impl fmt::Display for Metric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A metric name that is none of `used`, `acquired`, `peak`, `time`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown metric `{0}`: expected used, acquired, peak or time")]
pub struct ParseMetricError(pub String);

impl FromStr for Metric {
    type Err = ParseMetricError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Metric::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| ParseMetricError(s.to_string()))
    }
}

/// Why no flamegraph could be drawn.
#[derive(Debug, thiserror::Error)]
pub enum FlameError {
    /// Every line would be zero: an SVG of nothing would only hide that from the user.
    #[error("nothing to draw for metric `{metric}`: the trace has {}", metric.missing())]
    Empty { metric: Metric },
    /// inferno refused the folded lines or the writer failed.
    #[error("flamegraph rendering failed: {0}")]
    Render(#[from] std::io::Error),
}

/// A frame as one folded-stack field: [`frame_display`], with the characters that would change
/// how a folded line parses replaced. The format splits frames at `;` (it becomes `:`), lines at
/// a newline, and reads the count after a line's last space, so ordinary spaces inside a name
/// are safe and stay ([`folded_stack`] guards the end of a line). A tab becomes a space; other
/// control characters, which XML 1.0 cannot carry even escaped, become U+FFFD.
pub fn frame_label(frame: &Frame) -> String {
    sanitize(&frame_display(frame))
}

/// A frame as people read it: the scope or function name, then its location:
/// `MLP (src/demo.rs:481)`; a file under `site-packages/` or `dist-packages/` is shown from
/// there (`torch/nn/modules/linear.py:125`). A label (an allocation's memory category) or any
/// frame without a file is its name alone. (Reports keyed by location, `lines` and `diff`, keep
/// [`Frame::key`]'s `file:line:name`.)
pub fn frame_display(frame: &Frame) -> String {
    if frame.kind == FrameKind::Label || frame.file.is_empty() {
        return frame.name.to_string();
    }
    let file = short_file(&frame.file);
    if frame.line == 0 {
        format!("{} ({file})", frame.name)
    } else {
        format!("{} ({file}:{})", frame.name, frame.line)
    }
}

fn sanitize(field: &str) -> String {
    field
        .chars()
        .map(|c| match c {
            ';' => ':',
            '\t' => ' ',
            c if c.is_control() => '\u{fffd}',
            c => c,
        })
        .collect()
}

/// Sanitized frames joined into one folded stack, made safe at its ends: flamegraph tools trim
/// a line and read up to two counts from its end (a differential line has two), so a stack
/// ending in a space and a number (a scope named `step 3`) would lose its last word to a
/// count. Spaces at either end, and the space before such a last word, become U+00A0 (no-break
/// space), which draws the same.
pub fn folded_stack<'a>(frames: impl IntoIterator<Item = &'a Frame>) -> String {
    let joined = frames
        .into_iter()
        .map(frame_label)
        .collect::<Vec<_>>()
        .join(";");
    guard_ends(joined)
}

fn guard_ends(stack: String) -> String {
    let body = stack.trim_matches(' ');
    let (lead, trail) = (
        stack.len() - stack.trim_start_matches(' ').len(),
        stack.len() - stack.trim_end_matches(' ').len(),
    );
    let mut body = body.to_string();
    if let Some(at) = body.rfind(' ') {
        let last = &body[at + 1..];
        if !last.is_empty() && last.chars().all(|c| c.is_ascii_digit() || c == '.') {
            body.replace_range(at..at + 1, "\u{a0}");
        }
    }
    let nbsp = |n: usize| "\u{a0}".repeat(n);
    if lead == stack.len() {
        return nbsp(lead);
    }
    format!("{}{body}{}", nbsp(lead), nbsp(trail))
}

/// Folded-stack lines, one per node with a nonzero own amount, in the tree's DFS order (so the
/// output is the same for the same trace). Amounts recorded at `_root` itself (no stack) get
/// the one-frame stack `_root`.
///
/// Flamegraph tools add the counts up in 64 bits; should a damaged trace's amounts not fit,
/// they are all halved until they do (no real trace comes near 2^64 bytes or ns).
pub fn folded(profile: &Profile, metric: Metric) -> Vec<String> {
    let tree = &profile.tree;
    let nodes = tree.walk();
    let mut shift = 0;
    while nodes
        .iter()
        .try_fold(0u64, |t, &(i, _)| {
            t.checked_add(metric.self_value(tree, i) >> shift)
        })
        .is_none()
    {
        shift += 1;
    }
    let mut out = Vec::new();
    for (i, _) in nodes {
        let value = metric.self_value(tree, i) >> shift;
        if value == 0 {
            continue;
        }
        let stack = if i == 0 {
            folded_stack([&tree.nodes[0].frame])
        } else {
            folded_stack(tree.path(i))
        };
        out.push(format!("{stack} {value}"));
    }
    out
}

/// Options shared by every SVG of this module: name-hashed colors instead of random ones, so
/// the same trace gives the same bytes (the embedded JavaScript is a fixed text).
fn options(metric: Metric, title: &str) -> Options<'static> {
    let mut opt = Options::default();
    opt.title = title.to_string();
    opt.count_name = metric.count_name().to_string();
    opt.deterministic = true;
    // Frames read name first: a frame too narrow for its label keeps the name, not the path.
    opt.text_truncate_direction = TextTruncateDirection::Right;
    opt.colors = Palette::Basic(match metric {
        Metric::Time => BasicPalette::Hot,
        _ => BasicPalette::Mem,
    });
    opt
}

/// Renders sorted folded lines; inferno requires them sorted.
fn render(mut lines: Vec<String>, opt: &mut Options<'_>) -> Result<Vec<u8>, FlameError> {
    lines.sort_unstable();
    let mut svg = Vec::new();
    inferno_fg::from_lines(opt, lines.iter().map(String::as_str), &mut svg)?;
    Ok(svg)
}

/// An SVG flamegraph of `metric`. Errors when the profile has nothing of that metric.
pub fn flamegraph_svg(
    profile: &Profile,
    metric: Metric,
    title: &str,
) -> Result<Vec<u8>, FlameError> {
    let lines = folded(profile, metric);
    if lines.is_empty() {
        return Err(FlameError::Empty { metric });
    }
    render(lines, &mut options(metric, title))
}

/// Differential folded lines `stack BASE NEW`, sorted: every stack of either side, with 0 where
/// a side lacks it. Computed by inferno's `differential`, whose output order is a hash map's.
pub fn diff_folded(base: &[String], new: &[String]) -> Result<Vec<String>, FlameError> {
    let mut out = Vec::new();
    inferno::differential::from_readers(
        inferno::differential::Options::default(),
        base.join("\n").as_bytes(),
        new.join("\n").as_bytes(),
        &mut out,
    )?;
    let text = String::from_utf8(out)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    lines.sort_unstable();
    Ok(lines)
}

/// A differential flamegraph: widths are `new`'s amounts, red where `new` has more than `base`,
/// blue where less (Brendan Gregg's convention). Stacks only `base` has are zero wide; render
/// with the two profiles swapped to see them.
pub fn differential_svg(
    base: &Profile,
    new: &Profile,
    metric: Metric,
    title: &str,
) -> Result<Vec<u8>, FlameError> {
    let new_lines = folded(new, metric);
    if new_lines.is_empty() {
        return Err(FlameError::Empty { metric });
    }
    let lines = diff_folded(&folded(base, metric), &new_lines)?;
    render(lines, &mut options(metric, title))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: FrameKind, file: &str, line: u32, name: &str) -> Frame {
        Frame::new(kind, file, line, name)
    }

    #[test]
    fn labels_and_frames_without_a_file_read_as_their_name() {
        assert_eq!(
            frame_display(&frame(FrameKind::Label, "", 0, "activation")),
            "activation"
        );
        assert_eq!(
            frame_display(&frame(FrameKind::Function, "", 0, "aten::addmm")),
            "aten::addmm"
        );
        assert_eq!(
            frame_display(&frame(FrameKind::Link, "model.py", 12, "Linear")),
            "Linear (model.py:12)"
        );
        assert_eq!(
            frame_display(&frame(FrameKind::Link, "model.py", 0, "Linear")),
            "Linear (model.py)"
        );
    }

    #[test]
    fn installed_packages_show_from_the_package_on() {
        let conv = "/venv/lib/python3.11/site-packages/torch/nn/modules/conv.py";
        assert_eq!(short_file(conv), "torch/nn/modules/conv.py");
        assert_eq!(
            short_file("/usr/lib/python3/dist-packages/numpy/core.py"),
            "numpy/core.py"
        );
        assert_eq!(
            short_file(r"C:\py\Lib\site-packages\torch\nn\functional.py"),
            r"torch\nn\functional.py"
        );
        // The last marker counts; a path that ends at one, or has none, stays.
        assert_eq!(short_file("/a/site-packages/b/site-packages/c.py"), "c.py");
        assert_eq!(short_file("/a/site-packages/"), "/a/site-packages/");
        assert_eq!(short_file("src/model.rs"), "src/model.rs");
    }

    /// inferno's `rfind_samples`: the count is what follows a line's last space, and a
    /// differential line has a second one before it.
    #[test]
    fn a_stack_never_ends_in_what_reads_as_a_count() {
        let f = |name: &str| folded_stack([&frame(FrameKind::Scope, "", 0, name)]);
        assert_eq!(f("step 3"), "step\u{a0}3");
        assert_eq!(f("lr 0.5"), "lr\u{a0}0.5");
        assert_eq!(f("warm up"), "warm up");
        assert_eq!(f(" pad "), "\u{a0}pad\u{a0}");
        assert_eq!(f("a 5 "), "a\u{a0}5\u{a0}");
        assert_eq!(f("   "), "\u{a0}\u{a0}\u{a0}");
        assert_eq!(f("x;y\tz\u{7}"), "x:y z\u{fffd}");
    }
}
