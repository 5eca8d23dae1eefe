//! `lines`: CuPy's `LineProfileHook` tree.
//!
//! Every malloc request adds its `mem_size` to each frame of its calling context (open scopes,
//! then the call site), every device allocation try its size to the acquired column: running
//! sums, frees are never subtracted. As in cupy/cuda/memory_hooks/line_profile.py
//! (`malloc_preprocess`, `alloc_preprocess`), a request counts before it succeeds or fails, and
//! a 0-byte request is a node with `0.00B`. Children appear in the order they were first seen; frames that
//! print the same `file:line:function` under one parent are one node, as in CuPy, whose tree
//! is keyed by the stack frame.
//!
//! The tree nests at most [`MAX_NESTING`] levels; frames below that are folded into one node
//! (a recursion thousands of calls deep stays readable, and every parser takes the JSON).

use serde::Serialize;

use super::columns::html_rows;
use super::{
    Cell, Columns, DiffKey, Figures, HtmlColumn, HtmlTable, Quantity, ReportOptions, Table,
};
use crate::replay::{signed, Agg, CallTree, Profile};
use crate::tables::csv::to_csv;
use crate::tables::render::humanized;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Lines {
    pub root: LineRoot,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LineRoot {
    pub name: String,
    pub used_bytes: u64,
    pub acquired_bytes: u64,
    /// Of `used_bytes`: requests that failed (CuPy counts them in `malloc_preprocess`).
    pub failed_used_bytes: u64,
    /// Of `acquired_bytes`: device tries that failed (`alloc_preprocess`).
    pub failed_acquired_bytes: u64,
    pub children: Vec<LineNode>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LineNode {
    pub file: String,
    pub line: u32,
    pub function: String,
    pub used_bytes: u64,
    pub acquired_bytes: u64,
    /// Of `used_bytes`: requests that failed (CuPy counts them in `malloc_preprocess`).
    pub failed_used_bytes: u64,
    /// Of `acquired_bytes`: device tries that failed (`alloc_preprocess`).
    pub failed_acquired_bytes: u64,
    /// Bytes allocated here still live at the pool's peak, when the replay computed them
    /// (`diff` does, to say which stacks a peak's growth came from); absent when 0.
    #[serde(skip_serializing_if = "is_zero")]
    pub live_at_peak_bytes: u64,
    pub children: Vec<LineNode>,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// Levels of nesting the tree keeps under `_root`: frames deeper than this (a runaway
/// recursion) are folded into one node per cut, [`FOLDED`], holding their bytes. Nested JSON
/// deeper than this (two levels per frame) is more than common parsers take (Python's `json`
/// stops near 1,000), and the indented table would grow with the square of the depth.
pub const MAX_NESTING: usize = 256;

/// The name of the node that holds the frames deeper than [`MAX_NESTING`].
pub const FOLDED: &str = "[deeper frames folded into this line]";

/// `max_depth` as CuPy's: 0 = no limit, N keeps the outermost N-1 levels under `_root`.
pub fn lines(p: &Profile, max_depth: usize) -> Lines {
    let tree = &p.tree;
    let root = tree.root();
    let levels = if max_depth == 0 {
        usize::MAX
    } else {
        max_depth - 1
    };
    Lines {
        root: LineRoot {
            name: "_root".into(),
            used_bytes: root.total.used_bytes,
            acquired_bytes: root.total.acquired_bytes,
            failed_used_bytes: root.total.failed_used_bytes,
            failed_acquired_bytes: root.total.failed_acquired_bytes,
            children: nest(tree, levels),
        },
    }
}

/// A line node waiting for its children, in a flat list: the tree is built without recursion,
/// however deep the calling contexts go.
struct Pending {
    node: LineNode,
    /// Index of the parent in the list; `None` under `_root`.
    parent: Option<usize>,
}

/// The children of `_root`, `levels` deep at most (and [`MAX_NESTING`]).
fn nest(tree: &CallTree, levels: usize) -> Vec<LineNode> {
    let mut list: Vec<Pending> = Vec::new();
    // (parent in `list`, call-tree nodes whose frames become its children, their depth)
    let mut todo: Vec<(Option<usize>, Vec<usize>, usize)> =
        vec![(None, tree.root().children.clone(), 1)];
    while let Some((parent, ids, depth)) = todo.pop() {
        if depth > levels {
            continue;
        }
        if depth > MAX_NESTING {
            if let Some(folded) = folded(tree, &ids) {
                list.push(Pending {
                    node: folded,
                    parent,
                });
            }
            continue;
        }
        for (node, mut grand) in siblings(tree, &ids) {
            list.push(Pending { node, parent });
            // Merged siblings' children: keep first-seen order across them.
            grand.sort_by_key(|&g| (tree.nodes[g].total.first_mem, g));
            todo.push((Some(list.len() - 1), grand, depth + 1));
        }
    }
    // A node's children come after it in the list, in order: moving nodes into their parents
    // from the end completes each node before it moves.
    let mut top = Vec::new();
    while let Some(Pending { mut node, parent }) = list.pop() {
        node.children.reverse();
        match parent {
            Some(p) => list[p].node.children.push(node),
            None => top.push(node),
        }
    }
    top.reverse();
    top
}

/// The line nodes of the call-tree nodes `ids` (one parent's children): frames that print
/// alike are one node, as in CuPy; each with the call-tree nodes under it.
fn siblings(tree: &CallTree, ids: &[usize]) -> Vec<(LineNode, Vec<usize>)> {
    let mut out: Vec<(LineNode, Vec<usize>)> = Vec::new();
    for &c in ids {
        let n = &tree.nodes[c];
        // CuPy only creates a node for a frame some allocation went through.
        if n.total.mallocs == 0 && n.total.allocs == 0 {
            continue;
        }
        let f = &n.frame;
        let same = out
            .iter_mut()
            .find(|(o, _)| o.line == f.line && *o.file == *f.file && *o.function == *f.name);
        match same {
            Some((o, grand)) => {
                add(o, &n.total);
                grand.extend(&n.children);
            }
            None => {
                let mut node = LineNode {
                    file: f.file.to_string(),
                    line: f.line,
                    function: f.name.to_string(),
                    ..LineNode::default()
                };
                add(&mut node, &n.total);
                out.push((node, n.children.clone()));
            }
        }
    }
    out
}

/// One node for the frames `ids` and everything under them, cut at [`MAX_NESTING`]; `None` when
/// no allocation went through them.
fn folded(tree: &CallTree, ids: &[usize]) -> Option<LineNode> {
    let mut node = LineNode {
        file: String::new(),
        line: 0,
        function: FOLDED.to_string(),
        ..LineNode::default()
    };
    let mut seen = false;
    for &c in ids {
        let total = &tree.nodes[c].total;
        seen |= total.mallocs > 0 || total.allocs > 0;
        add(&mut node, total);
    }
    seen.then_some(node)
}

fn add(o: &mut LineNode, a: &Agg) {
    o.live_at_peak_bytes = o.live_at_peak_bytes.saturating_add(a.live_at_peak_bytes);
    o.used_bytes = o.used_bytes.saturating_add(a.used_bytes);
    o.acquired_bytes = o.acquired_bytes.saturating_add(a.acquired_bytes);
    o.failed_used_bytes = o.failed_used_bytes.saturating_add(a.failed_used_bytes);
    o.failed_acquired_bytes = o
        .failed_acquired_bytes
        .saturating_add(a.failed_acquired_bytes);
}

/// A node of the tree, with where it prints: what every flat form of the tree is made from.
pub struct Flat<'a> {
    /// 1 for `_root`'s children.
    pub depth: usize,
    /// The parent's place: 0 for `_root`, k for the k-th node of the list (from 1).
    pub parent: usize,
    pub node: &'a LineNode,
}

impl Lines {
    /// Every node under `_root` in printed order (depth first, children in order), walked
    /// without recursion.
    pub fn flat(&self) -> Vec<Flat<'_>> {
        let mut out = Vec::new();
        let mut todo: Vec<(usize, usize, &LineNode)> =
            self.root.children.iter().rev().map(|c| (1, 0, c)).collect();
        while let Some((depth, parent, node)) = todo.pop() {
            out.push(Flat {
                depth,
                parent,
                node,
            });
            let me = out.len();
            todo.extend(node.children.iter().rev().map(|c| (depth + 1, me, c)));
        }
        out
    }

    /// Each flat node's path of frames from `_root` (exclusive), joined by `;`: what `diff`
    /// keys a node by and the CSV prints (after `_root;`).
    fn paths(flat: &[Flat<'_>]) -> Vec<String> {
        let mut paths: Vec<String> = Vec::with_capacity(flat.len());
        for f in flat {
            let frame = f.node.frame();
            let path = match f.parent {
                0 => frame,
                p => format!("{};{frame}", paths[p - 1]),
            };
            paths.push(path);
        }
        paths
    }
}

impl LineNode {
    /// `file:line:function`.
    pub fn frame(&self) -> String {
        format!("{}:{}:{}", self.file, self.line, self.function)
    }
}

/// The tree as CuPy prints it.
pub fn render_table(l: &Lines) -> String {
    let mut out = format!(
        "_root ({}, {})\n",
        humanized(l.root.used_bytes),
        humanized(l.root.acquired_bytes)
    );
    for f in l.flat() {
        let n = f.node;
        out.push_str(&format!(
            "{}{}:{}:{} ({}, {})\n",
            "  ".repeat(f.depth),
            n.file,
            n.line,
            n.function,
            humanized(n.used_bytes),
            humanized(n.acquired_bytes)
        ));
    }
    out
}

/// A CSV row: one node, with its depth and the `;`-joined path of frames from `_root`.
#[derive(Default, Serialize)]
struct CsvRow<'a> {
    depth: usize,
    path: String,
    file: &'a str,
    /// Empty for `_root`.
    line: Option<u32>,
    function: &'a str,
    used_bytes: u64,
    acquired_bytes: u64,
}

/// One row per node, in the order the tree prints.
pub fn render_csv(l: &Lines) -> String {
    let flat = l.flat();
    let paths = Lines::paths(&flat);
    let mut rows = vec![CsvRow {
        depth: 0,
        path: "_root".into(),
        file: "",
        line: None,
        function: "_root",
        used_bytes: l.root.used_bytes,
        acquired_bytes: l.root.acquired_bytes,
    }];
    for (f, path) in flat.iter().zip(paths) {
        rows.push(CsvRow {
            depth: f.depth,
            path: format!("_root;{path}"),
            file: &f.node.file,
            line: Some(f.node.line),
            function: &f.node.function,
            used_bytes: f.node.used_bytes,
            acquired_bytes: f.node.acquired_bytes,
        });
    }
    to_csv(&rows)
}

impl Table for Lines {
    const NAME: &'static str = "lines";
    const FIGURES: &'static [DiffKey] = &[
        DiffKey::scoped("line", "used", Quantity::Bytes),
        DiffKey::scoped("line", "acquired", Quantity::Bytes),
        DiffKey::scoped("line", "live_at_peak", Quantity::Bytes),
    ];

    fn compute(p: &Profile, opts: &ReportOptions) -> Lines {
        lines(p, opts.max_depth)
    }

    fn render_table(&self, _: &ReportOptions) -> String {
        render_table(self)
    }

    fn render_csv(&self) -> String {
        render_csv(self)
    }

    /// A node's key is its whole path from `_root`: the same frame under two callers is two
    /// rows, as in the tree the `lines` report prints.
    fn figures(&self, out: &mut Figures) {
        let flat = self.flat();
        out.by_key.reserve(3 * flat.len());
        for (f, path) in flat.iter().zip(Lines::paths(&flat)) {
            out.scoped::<Self>("line", &path, "used", signed(f.node.used_bytes));
            out.scoped::<Self>("line", &path, "acquired", signed(f.node.acquired_bytes));
            out.scoped::<Self>(
                "line",
                &path,
                "live_at_peak",
                signed(f.node.live_at_peak_bytes),
            );
        }
    }

    /// CuPy's tree, one row per node in printed order: `node` is its place in that order
    /// (`_root` is node 0), `parent` its parent's (`_root`'s is -1).
    fn columns(&self) -> Option<Columns> {
        let r = &self.root;
        let root = LineNode {
            file: String::new(),
            line: 0,
            function: r.name.clone(),
            used_bytes: r.used_bytes,
            acquired_bytes: r.acquired_bytes,
            failed_used_bytes: r.failed_used_bytes,
            failed_acquired_bytes: r.failed_acquired_bytes,
            live_at_peak_bytes: 0,
            children: Vec::new(),
        };
        let mut rows = vec![(-1i64, 0usize, &root)];
        rows.extend(
            self.flat()
                .into_iter()
                .map(|f| (f.parent as i64, f.depth, f.node)),
        );
        Columns::default()
            .numbered("node", rows.len())
            .ints("parent", &rows, |r| r.0)
            .ints("depth", &rows, |r| r.1 as i64)
            .strs("file", &rows, |r| &r.2.file)
            .ints("line", &rows, |r| i64::from(r.2.line))
            .strs("function", &rows, |r| &r.2.function)
            .counts("used_bytes", &rows, |r| r.2.used_bytes)
            .counts("acquired_bytes", &rows, |r| r.2.acquired_bytes)
            .counts("failed_used_bytes", &rows, |r| r.2.failed_used_bytes)
            .counts("failed_acquired_bytes", &rows, |r| {
                r.2.failed_acquired_bytes
            })
            .into()
    }

    /// The tree as rows, indented, in printed order (`tree order` sorts them back).
    fn html(&self) -> Vec<HtmlTable> {
        #[derive(Serialize)]
        struct Row {
            order: usize,
            stack: String,
            used_bytes: u64,
            acquired_bytes: u64,
        }
        let mut rows = vec![Row {
            order: 0,
            stack: self.root.name.clone(),
            used_bytes: self.root.used_bytes,
            acquired_bytes: self.root.acquired_bytes,
        }];
        for f in self.flat() {
            rows.push(Row {
                order: rows.len(),
                stack: format!("{}{}", "\u{a0}\u{a0}".repeat(f.depth), f.node.frame()),
                used_bytes: f.node.used_bytes,
                acquired_bytes: f.node.acquired_bytes,
            });
        }
        vec![HtmlTable {
            id: "lines-table",
            title: "lines",
            note: "CuPy LineProfileHook",
            columns: vec![
                HtmlColumn::new("stack", "file:line:function", Cell::Stack),
                HtmlColumn::new("used_bytes", "used", Cell::Bytes),
                HtmlColumn::new("acquired_bytes", "acquired", Cell::Bytes),
                HtmlColumn::new("order", "tree order", Cell::Plain),
            ],
            rows: html_rows(&rows),
        }]
    }
}
