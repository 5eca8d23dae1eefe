//! What a page carries, bounded by what a screen can show, so that a page stays a few MB and
//! opens in a second whatever the trace's size (a 1 GB snapshot has hundreds of thousands of
//! calling contexts; its page used to carry each of them twice, as a flamegraph node and as a
//! row of the lines table):
//!
//! - a flamegraph keeps its [`MAX_TREE_NODES`] widest nodes (by each node's share of the root
//!   on whichever metric gives it the most: a node too narrow on every metric to be drawn one
//!   pixel wide at the top is not kept); a node left out gives its amounts to its nearest kept
//!   caller, so every kept node's width and the root's totals are exact;
//! - a table keeps its [`MAX_TABLE_ROWS`] largest rows by its first bytes column, in their
//!   order; for a tree table (`lines`: each row's bytes include its callees') the rows kept
//!   still hold every caller of a row kept.
//!
//! Small traces' pages are left as they are: both bounds are far above what they have. The
//! page says what it left out, and that the CLI prints it all.

use serde::Serialize;

use super::data::{DiffTree, TreeData};
use poolsight_analyzer::tables::{Cell, HtmlTable};

/// Flamegraph nodes a page keeps: a screen is a few thousand pixels wide.
pub const MAX_TREE_NODES: usize = 5_000;

/// Rows a table keeps.
pub const MAX_TABLE_ROWS: usize = 1_000;

/// What a view left out.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Elided {
    /// Flamegraph nodes folded into their callers.
    pub tree_nodes: usize,
    /// Per table (`id`), the rows left out.
    pub table_rows: Vec<(&'static str, usize)>,
}

impl Elided {
    pub fn is_empty(&self) -> bool {
        self.tree_nodes == 0 && self.table_rows.is_empty()
    }
}

/// `t` with at most `max` nodes (see the module documentation), and how many were folded.
pub fn tree(t: TreeData, max: usize) -> (TreeData, usize) {
    let n = t.parent.len();
    if n <= max.max(1) {
        return (t, 0);
    }
    let keep = kept(&t.parent, &[&t], max);
    let (parent, frame, mut sides) = fold(&t.parent, &t.frame, &keep, &[&t]);
    let mut out = sides.pop().unwrap_or_default();
    out.parent = parent;
    out.frame = frame;
    let folded = n - out.parent.len();
    (out, folded)
}

/// A diff's tree with at most `max` nodes, as [`tree`] bounds one: a node is kept by its
/// widest share on either side, and both sides' amounts of a node left out go to its nearest
/// kept caller (each side's totals stay exact).
pub fn diff_tree(d: DiffTree, max: usize) -> (DiffTree, usize) {
    let n = d.parent.len();
    if n <= max.max(1) {
        return (d, 0);
    }
    let keep = kept(&d.parent, &[&d.base, &d.new], max);
    let (parent, frame, mut sides) = fold(&d.parent, &d.frame, &keep, &[&d.base, &d.new]);
    let new = sides.pop().unwrap_or_default();
    let base = sides.pop().unwrap_or_default();
    let folded = n - parent.len();
    (
        DiffTree {
            parent,
            frame,
            base,
            new,
            folded: d.folded + folded,
        },
        folded,
    )
}

/// Which nodes of a tree (`parent`: each node's, parents before children) a bound keeps: the
/// root and the `max - 1` nodes of largest share of the root on any metric of any side.
fn kept(parent: &[u32], sides: &[&TreeData], max: usize) -> Vec<bool> {
    let (n, max) = (parent.len(), max.max(1));
    // Each node's amounts with its callees', every metric of every side.
    let mut incl: Vec<Vec<u64>> = (0..n)
        .map(|i| {
            sides
                .iter()
                .flat_map(|t| [&t.used, &t.acquired, &t.peak, &t.time])
                .map(|m| m.get(i).copied().unwrap_or(0))
                .collect()
        })
        .collect();
    for i in (1..n).rev() {
        let p = parent[i] as usize;
        if p < i {
            let child = std::mem::take(&mut incl[i]);
            for (a, b) in incl[p].iter_mut().zip(&child) {
                *a = a.saturating_add(*b);
            }
            incl[i] = child;
        }
    }
    let root = incl[0].clone();
    let share = |i: usize| -> f64 {
        root.iter()
            .zip(&incl[i])
            .filter(|(r, _)| **r > 0)
            .map(|(r, v)| *v as f64 / *r as f64)
            .fold(0.0, f64::max)
    };
    let shares: Vec<f64> = (0..n).map(share).collect();
    let mut order: Vec<usize> = (1..n).collect();
    // A caller's share is at least its callee's, and it comes first at equal shares.
    order.sort_by(|&a, &b| shares[b].total_cmp(&shares[a]).then(a.cmp(&b)));
    let mut keep = vec![false; n];
    keep[0] = true;
    for &i in order.iter().take(max - 1) {
        keep[i] = true;
    }
    keep
}

/// The kept nodes' parents and frames (renumbered), and each side's amounts with every node
/// left out counted in its nearest kept caller.
fn fold(
    parent: &[u32],
    frame: &[u32],
    keep: &[bool],
    sides: &[&TreeData],
) -> (Vec<u32>, Vec<u32>, Vec<TreeData>) {
    let n = parent.len();
    let (mut out_parent, mut out_frame) = (Vec::new(), Vec::new());
    let mut out: Vec<TreeData> = vec![TreeData::default(); sides.len()];
    let mut into = vec![0usize; n];
    let mut index = vec![u32::MAX; n];
    for i in 0..n {
        let p = parent[i] as usize;
        if keep[i] && (i == 0 || (p < i && keep[p])) {
            index[i] = out_parent.len() as u32;
            out_parent.push(if i == 0 { 0 } else { index[p] });
            out_frame.push(frame[i]);
            for o in &mut out {
                o.used.push(0);
                o.acquired.push(0);
                o.peak.push(0);
                o.time.push(0);
            }
            into[i] = i;
        } else {
            into[i] = if p < i { into[p] } else { 0 };
        }
        let k = index[into[i]] as usize;
        for (o, t) in out.iter_mut().zip(sides) {
            let at = |v: &Vec<u64>| v.get(i).copied().unwrap_or(0);
            o.used[k] = o.used[k].saturating_add(at(&t.used));
            o.acquired[k] = o.acquired[k].saturating_add(at(&t.acquired));
            o.peak[k] = o.peak[k].saturating_add(at(&t.peak));
            o.time[k] = o.time[k].saturating_add(at(&t.time));
        }
    }
    (out_parent, out_frame, out)
}

/// `t` with at most `max` rows (see the module documentation), and how many were left out.
pub fn table(mut t: HtmlTable, max: usize) -> (HtmlTable, usize) {
    let n = t.rows.len();
    if n <= max {
        return (t, 0);
    }
    let key = t
        .columns
        .iter()
        .find(|c| c.cell == Cell::Bytes)
        .map(|c| c.key);
    let value = |r: &serde_json::Value| -> i128 {
        key.and_then(|k| r.get(k))
            .and_then(|v| v.as_i64().map(i128::from).or(v.as_u64().map(i128::from)))
            .unwrap_or(0)
    };
    let values: Vec<i128> = t.rows.iter().map(value).collect();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| values[b].cmp(&values[a]).then(a.cmp(&b)));
    let mut keep = vec![false; n];
    for &i in order.iter().take(max) {
        keep[i] = true;
    }
    let mut i = 0;
    t.rows.retain(|_| {
        i += 1;
        keep[i - 1]
    });
    (t, n - max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use poolsight_analyzer::tables::HtmlColumn;

    /// A root with `n` children, child `i` owning `i + 1` bytes of every metric, each with a
    /// child of its own owning 1.
    fn wide(n: usize) -> TreeData {
        let mut t = TreeData::default();
        let mut push = |parent: u32, frame: u32, v: u64| {
            t.parent.push(parent);
            t.frame.push(frame);
            t.used.push(v);
            t.acquired.push(v);
            t.peak.push(v);
            t.time.push(v);
        };
        push(0, u32::MAX, 0);
        for i in 0..n {
            let at = 1 + 2 * i as u32;
            push(0, i as u32, i as u64 + 1);
            push(at, 100_000 + i as u32, 1);
        }
        t
    }

    fn total(v: &[u64]) -> u64 {
        v.iter().sum()
    }

    #[test]
    fn a_large_tree_keeps_its_widest_nodes_and_its_totals() {
        let t = wide(1000);
        let (b, folded) = tree(t.clone(), 101);
        assert_eq!(b.parent.len(), 101);
        assert_eq!(folded, 2001 - 101);
        for (a, z) in [
            (&t.used, &b.used),
            (&t.acquired, &b.acquired),
            (&t.peak, &b.peak),
            (&t.time, &b.time),
        ] {
            assert_eq!(total(a), total(z));
        }
        // The widest children are kept, each with its own amount plus its folded callee's.
        let kept: Vec<u32> = b.frame[1..].to_vec();
        assert!(kept.contains(&999) && kept.contains(&900), "{kept:?}");
        assert!(!kept.contains(&0));
        let at = b.frame.iter().position(|&f| f == 999).unwrap();
        assert_eq!(b.used[at], 1000 + 1);
        // Every kept node's parent is kept and comes before it.
        assert!(b.parent.iter().enumerate().all(|(i, &p)| (p as usize) <= i));
    }

    #[test]
    fn a_large_diff_keeps_the_widest_nodes_of_either_side_and_both_totals() {
        // The base's widest children are the new run's narrowest: a bound by one side alone
        // would drop what the other side spent.
        let base = wide(1000);
        let mut new = wide(1000);
        for v in [
            &mut new.used,
            &mut new.acquired,
            &mut new.peak,
            &mut new.time,
        ] {
            let n = v.len();
            for i in 0..500 {
                let (a, b) = (1 + 2 * i, n - 2 - 2 * i);
                v.swap(a, b);
            }
        }
        let d = DiffTree {
            parent: base.parent.clone(),
            frame: base.frame.clone(),
            base: base.clone(),
            new: new.clone(),
            folded: 0,
        };
        let (b, folded) = diff_tree(d, 101);
        assert_eq!((b.parent.len(), folded, b.folded), (101, 1900, 1900));
        for (side, t) in [(&b.base, &base), (&b.new, &new)] {
            assert_eq!(side.used.len(), 101);
            assert_eq!(total(&side.used), total(&t.used));
            assert_eq!(total(&side.time), total(&t.time));
        }
        // Frame 999 is the base's widest, frame 0 the new run's widest.
        let kept: Vec<u32> = b.frame[1..].to_vec();
        assert!(kept.contains(&999) && kept.contains(&0), "{kept:?}");
        assert!(!kept.contains(&500), "{kept:?}");
    }

    #[test]
    fn a_small_tree_is_left_as_it_is() {
        let t = wide(10);
        let (b, folded) = tree(t.clone(), MAX_TREE_NODES);
        assert_eq!((b.parent, folded), (t.parent, 0));
    }

    #[test]
    fn a_long_table_keeps_its_largest_rows_in_order() {
        let rows: Vec<serde_json::Value> = (0..50u64)
            .map(|i| serde_json::json!({"name": i.to_string(), "bytes": (i * 7) % 50}))
            .collect();
        let t = HtmlTable {
            id: "t",
            title: "t",
            note: "",
            columns: vec![
                HtmlColumn::new("name", "Name", Cell::Text),
                HtmlColumn::new("bytes", "Bytes", Cell::Bytes),
            ],
            rows,
        };
        let (b, left) = table(t, 10);
        assert_eq!((b.rows.len(), left), (10, 40));
        let bytes: Vec<u64> = b
            .rows
            .iter()
            .map(|r| r["bytes"].as_u64().unwrap())
            .collect();
        assert!(bytes.iter().all(|&v| v >= 40), "{bytes:?}");
        let names: Vec<u64> = b
            .rows
            .iter()
            .map(|r| r["name"].as_str().unwrap().parse().unwrap())
            .collect();
        assert!(names.windows(2).all(|w| w[0] < w[1]), "{names:?}");
    }
}
