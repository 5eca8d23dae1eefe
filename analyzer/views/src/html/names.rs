//! What a band of the timeline is called in its legend, its tooltip and the live table: a name
//! that says where the bytes come from and that no other band of the run shares.
//!
//! A stack's (or a module's) name leads with its innermost frame that has a location — the
//! function, module or line that allocated — as frames read everywhere (`MultiheadAttention
//! (torch/nn/modules/activation.py:1256)`), followed by the frames inside it, which have no
//! location (an operator, the memory category): `... › aten::bmm › activation`. A label reads
//! as the label alone. Where two bands would read the same, both name their callers, outermost
//! last, by name, then by name and location; bands that still read the same (stacks that
//! differ only in what frames do not show) are numbered. A name holds at most
//! [`INSIDE`] frames inside its lead and [`CALLERS`] callers, whatever the stack's depth (a
//! runaway recursion is 100,000 frames deep).

use std::collections::{HashMap, HashSet};

use crate::flamegraph::frame_display;
use poolsight_analyzer::read::names::{FrameKind, Phase};
use poolsight_analyzer::replay::Frame;

/// Between the frames of a name.
const SEP: &str = " \u{203a} ";

/// Frames a name shows inside its lead (the innermost ones; `…` stands for the others).
pub const INSIDE: usize = 6;

/// Callers a name may show.
pub const CALLERS: usize = 8;

/// Distinct names of `paths` (each outermost first); an empty path is called `empty`.
pub fn distinct(paths: &[&[Frame]], empty: &str) -> Vec<String> {
    let candidates: Vec<Vec<String>> = paths.iter().map(|p| candidates(p, empty)).collect();
    let mut at = vec![0usize; paths.len()];
    loop {
        let mut groups: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, c) in candidates.iter().enumerate() {
            groups.entry(c[at[i]].as_str()).or_default().push(i);
        }
        let mut moved = false;
        for g in groups.values().filter(|g| g.len() > 1) {
            for &i in g {
                if at[i] + 1 < candidates[i].len() {
                    at[i] += 1;
                    moved = true;
                }
            }
        }
        if !moved {
            break;
        }
    }
    let mut used: HashSet<String> = HashSet::new();
    candidates
        .iter()
        .zip(&at)
        .map(|(c, &k)| {
            let mut name = c[k].clone();
            let mut n = 1;
            while used.contains(&name) {
                n += 1;
                name = format!("{} #{n}", c[k]);
            }
            used.insert(name.clone());
            name
        })
        .collect()
}

/// A path's names, shortest first (see the module documentation).
fn candidates(path: &[Frame], empty: &str) -> Vec<String> {
    if path.is_empty() {
        return vec![empty.to_string()];
    }
    let lead = path
        .iter()
        .rposition(|f| f.kind != FrameKind::Label && !f.file.is_empty())
        .unwrap_or(0);
    let mut parts = vec![shown(&path[lead])];
    let inside = &path[lead + 1..];
    if inside.len() > INSIDE {
        parts.push("\u{2026}".to_string());
    }
    parts.extend(
        inside[inside.len().saturating_sub(INSIDE)..]
            .iter()
            .map(shown),
    );
    let own = parts.join(SEP);
    let callers = |n: usize, show: fn(&Frame) -> String| {
        let mut parts: Vec<String> = path[lead - n..lead].iter().map(show).collect();
        parts.push(own.clone());
        parts.join(SEP)
    };
    let most = lead.min(CALLERS);
    let mut out = vec![own.clone()];
    out.extend((1..=most).map(|n| callers(n, named)));
    out.extend((1..=most).map(|n| callers(n, shown)));
    out
}

/// A frame as frames read everywhere, a backward operator marked as such (unless its name
/// says so).
fn shown(f: &Frame) -> String {
    frame_display(f) + backward(f)
}

/// A frame's name alone, a backward operator marked as such.
fn named(f: &Frame) -> String {
    f.name.to_string() + backward(f)
}

fn backward(f: &Frame) -> &'static str {
    let said = f.name.to_ascii_lowercase().contains("backward");
    if f.kind == FrameKind::Function && f.phase == Phase::Backward && !said {
        " [backward]"
    } else {
        ""
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: FrameKind, file: &str, line: u32, name: &str) -> Frame {
        Frame::new(kind, file, line, name)
    }

    fn torch(module: (&str, &str, u32), op: &str, label: &str) -> Vec<Frame> {
        vec![
            frame(FrameKind::Foreign, "train.py", 24, "<module>"),
            frame(FrameKind::Link, "model.py", 10, "Net"),
            frame(FrameKind::Link, module.1, module.2, module.0),
            frame(FrameKind::Function, "", 0, op),
            frame(FrameKind::Label, "", 0, label),
        ]
    }

    fn names(paths: &[Vec<Frame>]) -> Vec<String> {
        let refs: Vec<&[Frame]> = paths.iter().map(Vec::as_slice).collect();
        distinct(&refs, "(none)")
    }

    #[test]
    fn a_band_leads_with_its_located_frame_and_reads_labels_alone() {
        let mha = ("MultiheadAttention", "torch/nn/modules/activation.py", 1256);
        let got = names(&[
            torch(mha, "aten::bmm", "activation"),
            torch(mha, "aten::bmm", "temporary"),
            vec![frame(FrameKind::Label, "", 0, "parameter")],
            Vec::new(),
        ]);
        assert_eq!(
            got,
            [
                "MultiheadAttention (torch/nn/modules/activation.py:1256) \u{203a} aten::bmm \u{203a} activation",
                "MultiheadAttention (torch/nn/modules/activation.py:1256) \u{203a} aten::bmm \u{203a} temporary",
                "parameter",
                "(none)",
            ]
        );
    }

    #[test]
    fn a_name_stays_short_however_deep_its_stack() {
        let deep: Vec<Frame> = (0..100_000)
            .map(|i| frame(FrameKind::Link, "deep.py", i % 7, "Recurse"))
            .chain([frame(FrameKind::Function, "", 0, "aten::mm")])
            .collect();
        let mut twin = deep.clone();
        twin[0].line = 99;
        let mut unlocated: Vec<Frame> = (0..1000)
            .map(|i| frame(FrameKind::Function, "", 0, &format!("f{i}")))
            .collect();
        unlocated.push(frame(FrameKind::Label, "", 0, "activation"));
        let got = names(&[deep, twin, unlocated]);
        assert!(got.iter().all(|n| n.len() < 600), "{got:?}");
        // Twins to the last caller shown: the lead, what is inside and 8 callers, then a number.
        assert!(
            got[0].ends_with("Recurse (deep.py:4) \u{203a} aten::mm"),
            "{got:?}"
        );
        assert_eq!(got[0].matches(SEP).count(), 1 + CALLERS);
        assert_eq!(got[1], format!("{} #2", got[0]));
        assert_eq!(
            got[2],
            "f0 \u{203a} \u{2026} \u{203a} f995 \u{203a} f996 \u{203a} f997 \u{203a} f998 \u{203a} f999 \u{203a} activation"
        );
    }

    #[test]
    fn bands_that_would_read_the_same_name_their_callers_then_a_number() {
        let linear = ("Linear", "torch/nn/modules/linear.py", 130);
        let mut inner = torch(linear, "aten::mm", "activation");
        inner.insert(
            2,
            frame(
                FrameKind::Link,
                "torch/nn/modules/transformer.py",
                799,
                "Encoder",
            ),
        );
        let outer = torch(linear, "aten::mm", "activation");
        let mut other_line = outer.clone();
        other_line[0].line = 25;
        let mut backward = outer.clone();
        backward[3].phase = Phase::Backward;
        let twin = outer.clone();
        let got = names(&[inner, outer, other_line, backward, twin]);
        let own = "Linear (torch/nn/modules/linear.py:130) \u{203a} aten::mm \u{203a} activation";
        assert_eq!(got[0], format!("Encoder \u{203a} {own}"));
        assert_eq!(
            got[1],
            format!("<module> (train.py:24) \u{203a} Net (model.py:10) \u{203a} {own}")
        );
        assert_eq!(
            got[2],
            format!("<module> (train.py:25) \u{203a} Net (model.py:10) \u{203a} {own}")
        );
        assert_eq!(
            got[3],
            "Linear (torch/nn/modules/linear.py:130) \u{203a} aten::mm [backward] \u{203a} activation"
        );
        assert_eq!(got[4], format!("{} #2", got[1]));
        let unique: HashSet<&String> = got.iter().collect();
        assert_eq!(unique.len(), got.len());
    }
}
