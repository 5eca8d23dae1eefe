//! `lines`: CuPy's `LineProfileHook` tree.
//!
//! Every malloc request adds its `mem_size` to each frame of its calling context (open scopes,
//! then the call site), every device allocation try its size to the acquired column: running
//! sums, frees are never subtracted. As in cupy/cuda/memory_hooks/line_profile.py
//! (`malloc_preprocess`, `alloc_preprocess`), a request counts before it succeeds or fails, and
//! a 0-byte request is a node with `0.00B`. Children appear in the order they were first seen; frames that
//! print the same `file:line:function` under one parent are one node, as in CuPy, whose tree
//! is keyed by the stack frame.

use serde::Serialize;

use crate::csv::to_csv;
use crate::render::humanized;
use crate::replay::{CallTree, Profile};

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

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
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
    pub children: Vec<LineNode>,
}

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
            children: children(tree, &root.children, levels),
        },
    }
}

fn children(tree: &CallTree, ids: &[usize], levels: usize) -> Vec<LineNode> {
    if levels == 0 {
        return Vec::new();
    }
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
                o.used_bytes = o.used_bytes.saturating_add(n.total.used_bytes);
                o.acquired_bytes = o.acquired_bytes.saturating_add(n.total.acquired_bytes);
                o.failed_used_bytes = o
                    .failed_used_bytes
                    .saturating_add(n.total.failed_used_bytes);
                o.failed_acquired_bytes = o
                    .failed_acquired_bytes
                    .saturating_add(n.total.failed_acquired_bytes);
                grand.extend(&n.children);
            }
            None => out.push((
                LineNode {
                    file: f.file.to_string(),
                    line: f.line,
                    function: f.name.to_string(),
                    used_bytes: n.total.used_bytes,
                    acquired_bytes: n.total.acquired_bytes,
                    failed_used_bytes: n.total.failed_used_bytes,
                    failed_acquired_bytes: n.total.failed_acquired_bytes,
                    children: Vec::new(),
                },
                n.children.clone(),
            )),
        }
    }
    out.into_iter()
        .map(|(mut node, mut grand)| {
            // Merged siblings' children: keep first-seen order across them.
            grand.sort_by_key(|&g| (tree.nodes[g].total.first_mem, g));
            node.children = children(tree, &grand, levels - 1);
            node
        })
        .collect()
}

/// The tree as CuPy prints it.
pub fn render_table(l: &Lines) -> String {
    let mut out = format!(
        "_root ({}, {})\n",
        humanized(l.root.used_bytes),
        humanized(l.root.acquired_bytes)
    );
    for c in &l.root.children {
        render_node(c, 1, &mut out);
    }
    out
}

fn render_node(n: &LineNode, depth: usize, out: &mut String) {
    out.push_str(&format!(
        "{}{}:{}:{} ({}, {})\n",
        "  ".repeat(depth),
        n.file,
        n.line,
        n.function,
        humanized(n.used_bytes),
        humanized(n.acquired_bytes)
    ));
    for c in &n.children {
        render_node(c, depth + 1, out);
    }
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
    fn walk<'a>(n: &'a LineNode, depth: usize, prefix: &str, rows: &mut Vec<CsvRow<'a>>) {
        let path = format!("{prefix};{}:{}:{}", n.file, n.line, n.function);
        rows.push(CsvRow {
            depth,
            path: path.clone(),
            file: &n.file,
            line: Some(n.line),
            function: &n.function,
            used_bytes: n.used_bytes,
            acquired_bytes: n.acquired_bytes,
        });
        for c in &n.children {
            walk(c, depth + 1, &path, rows);
        }
    }
    let mut rows = vec![CsvRow {
        depth: 0,
        path: "_root".into(),
        file: "",
        line: None,
        function: "_root",
        used_bytes: l.root.used_bytes,
        acquired_bytes: l.root.acquired_bytes,
    }];
    for c in &l.root.children {
        walk(c, 1, "_root", &mut rows);
    }
    to_csv(&rows)
}
