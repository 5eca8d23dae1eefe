//! `docs/architecture.md` names files and folders; each must exist, so that the map a newcomer
//! reads is the code's. A path with a `/` exists from the repository's root or as the end of
//! a path in it (the folder table names files under the folder of their row); a bare file name
//! is some file's name.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every file and folder of the repository, relative to its root, with `/` between parts
/// (build outputs, environments and version control left out).
fn tree() -> Vec<String> {
    let skip = [
        "target",
        ".git",
        ".venv",
        ".venv-chainer",
        "node_modules",
        ".cache",
    ];
    let mut out = Vec::new();
    let mut todo = vec![PathBuf::new()];
    while let Some(rel) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(root().join(&rel)) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if skip.contains(&name.as_str()) || name.starts_with("target-") {
                continue;
            }
            let path = rel.join(&name);
            let shown = path.to_string_lossy().replace('\\', "/");
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                out.push(format!("{shown}/"));
                todo.push(path);
            } else {
                out.push(shown);
            }
        }
    }
    out
}

/// The code spans of `text` that name a file or a folder: a file name with an extension of
/// the repository's sources, or a folder (ending in `/`), placeholders (`<name>`) left out.
fn named_paths(text: &str) -> Vec<String> {
    const EXTS: [&str; 12] = [
        ".rs", ".py", ".md", ".sh", ".js", ".css", ".cpp", ".fbs", ".toml", ".h", ".c", ".txt",
    ];
    let mut out = Vec::new();
    for (i, span) in text.split('`').enumerate() {
        if i % 2 == 0 || span.contains(['<', '*', ' ', ':']) || span.is_empty() {
            continue;
        }
        let file = EXTS.iter().any(|e| span.ends_with(e));
        let folder = span.ends_with('/') && span.len() > 1;
        if (file || folder)
            && span
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_./-".contains(c))
        {
            out.push(span.to_owned());
        }
    }
    out
}

/// The paths of `named` that `tree` (as [`tree`] lists it) does not hold.
fn missing(named: &[String], tree: &[String]) -> Vec<String> {
    let names: HashSet<&str> = tree
        .iter()
        .map(|p| p.trim_end_matches('/').rsplit('/').next().unwrap_or(p))
        .collect();
    named
        .iter()
        .filter(|n| {
            let bare = n.trim_end_matches('/');
            if !bare.contains('/') {
                return !names.contains(bare);
            }
            let n = n.trim_start_matches("./");
            !tree
                .iter()
                .any(|p| p == n || p.ends_with(&format!("/{n}")) || p == &format!("{n}/"))
        })
        .cloned()
        .collect()
}

#[test]
fn every_path_the_architecture_page_names_exists() {
    let text = std::fs::read_to_string(root().join("docs/architecture.md")).expect("the page");
    let named = named_paths(&text);
    assert!(named.len() > 100, "the page names {} paths", named.len());
    let missing = missing(&named, &tree());
    assert!(
        missing.is_empty(),
        "docs/architecture.md names paths that do not exist: {missing:?}"
    );
}

#[test]
fn a_path_that_is_gone_is_caught() {
    let tree: Vec<String> = [
        "analyzer/",
        "analyzer/src/",
        "analyzer/src/load/",
        "analyzer/src/load/job.rs",
    ]
    .map(String::from)
    .to_vec();
    let named = named_paths(
        "`analyzer/src/load/` `load/job.rs` `job.rs` `read/load.rs` `scope.rs` `Trace::open` `<name>.rs`",
    );
    assert_eq!(named.len(), 5, "{named:?}");
    assert_eq!(missing(&named, &tree), ["read/load.rs", "scope.rs"]);
}

/// The comment text of a Rust source: every line that is a `//` comment (`//!` and `///`
/// included; a comment after code on its line is not read, nor are strings).
fn comments(source: &str) -> String {
    (source.lines())
        .filter_map(|l| l.trim_start().strip_prefix("//"))
        .map(|c| c.trim_start_matches(['/', '!']))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn no_comment_names_a_rust_file_that_is_gone() {
    // Rust files only, and only the Rust files they name: comments also name PyTorch's sources
    // (`CUDACachingAllocator.cpp`, `torch/optim/optimizer.py`). Python files are not read.
    let tree = tree();
    let mut gone = Vec::new();
    let mut named_any = 0;
    for file in tree.iter().filter(|p| p.ends_with(".rs")) {
        let text = std::fs::read_to_string(root().join(file)).expect("a source");
        let named: Vec<String> = (named_paths(&comments(&text)).into_iter())
            .filter(|n| n.ends_with(".rs"))
            .collect();
        named_any += named.len();
        gone.extend(
            missing(&named, &tree)
                .into_iter()
                .map(|n| format!("{file}: {n}")),
        );
    }
    assert!(named_any > 20, "comments name {named_any} Rust files");
    assert!(
        gone.is_empty(),
        "comments name Rust files that do not exist: {gone:?}"
    );
    assert_eq!(
        comments("// see `gone.rs`\n//! `here.rs`\nlet s = \"`x.rs`\"; // `after.rs`"),
        " see `gone.rs`\n `here.rs`"
    );
}

#[test]
fn the_readme_is_a_front_page() {
    // The front page: what poolsight does and the first command of each use, 250 lines at
    // most; benchmark tables and long recipes live in docs/.
    let text = std::fs::read_to_string(root().join("README.md")).expect("the README");
    let lines = text.lines().count();
    assert!(
        lines <= 250,
        "README.md is {lines} lines: move the detail to docs/"
    );
}

/// The analyzer's modules, bottom layer first; a module may use its own layer's and those
/// below (docs/architecture.md says the same, in this order). `read` is the reader's crate.
const LAYERS: [&[&str]; 6] = [
    &["units", "read"],
    &["replay"],
    &["load"],
    &["whatif"],
    &["tables"],
    &["diff", "predict"],
];

/// (module, the modules it names by `crate::` paths outside comments), for each file of the
/// analyzer's sources.
fn analyzer_uses() -> Vec<(String, String, String)> {
    let src = root().join("analyzer/src");
    let mut out = Vec::new();
    for file in tree()
        .iter()
        .filter(|p| p.starts_with("analyzer/src/") && p.ends_with(".rs"))
    {
        let rel = &file["analyzer/src/".len()..];
        let own = rel.split('/').next().unwrap().trim_end_matches(".rs");
        let text = std::fs::read_to_string(src.join(rel)).expect("a source");
        for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
            assert!(
                !line.contains("crate::{"),
                "{file}: name each module by its own path"
            );
            for used in line.split("crate::").skip(1) {
                let m: String = used
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                if !m.is_empty() && m != own {
                    out.push((file.clone(), own.to_string(), m));
                }
            }
        }
    }
    out
}

#[test]
fn no_analyzer_module_uses_one_above_it() {
    let rank = |m: &str| LAYERS.iter().position(|l| l.contains(&m));
    let uses = analyzer_uses();
    assert!(uses.len() > 50, "{} uses", uses.len());
    let against: Vec<String> = uses
        .iter()
        .filter(|(_, own, used)| match (rank(own), rank(used)) {
            (Some(a), Some(b)) => b > a,
            _ => true,
        })
        .map(|(file, _, used)| format!("{file} uses crate::{used}"))
        .collect();
    assert!(against.is_empty(), "against the layering: {against:?}");
    let page = std::fs::read_to_string(root().join("docs/architecture.md")).expect("the page");
    let said = "`units` and `read` (the reader crate), then `replay`,\n`load`, `whatif`, `tables`, and on top `diff` and `predict`";
    assert!(
        page.contains(said),
        "docs/architecture.md states the layers in LAYERS' order"
    );
}

#[test]
fn every_key_diff_compares_is_in_the_rules_table() {
    // docs/ci.md's table of METRICs: every key a rule can name, as `diff` makes them.
    let page = std::fs::read_to_string(root().join("docs/ci.md")).expect("the page");
    let start = page.find("| METRIC | what |").expect("the rules table");
    let table: String = (page[start..].lines())
        .take_while(|l| l.starts_with('|'))
        .collect::<Vec<_>>()
        .join("\n");
    let keys = poolsight::analyzer::tables::diff_keys();
    assert!(keys.len() > 25, "{} keys", keys.len());
    let mut undocumented = Vec::new();
    for (_, k) in &keys {
        let said = if k.is_named() {
            table.contains(&format!("`{}.", k.scope))
        } else if k.scope.is_empty() {
            table.contains(&format!("`{}`", k.figure))
        } else {
            table.contains(&format!("`{}:", k.scope)) && table.contains(&format!(".{}`", k.figure))
        };
        if !said {
            undocumented.push(format!("{}:{}", k.scope, k.figure));
        }
    }
    assert!(
        undocumented.is_empty(),
        "docs/ci.md's rules table lacks {undocumented:?}"
    );
}

/// The crates a Cargo.toml's `[dependencies]` names, in order.
fn dependencies(manifest: &str) -> Vec<String> {
    let mut inside = false;
    let mut out = Vec::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            inside = line == "[dependencies]";
            continue;
        }
        let name = line.split(['=', '.', ' ']).next().unwrap_or("");
        if inside && !name.is_empty() && !name.starts_with('#') {
            out.push(name.to_string());
        }
    }
    out
}

/// The `poolsight*` crates a Cargo.toml's `[dependencies]` names, sorted.
fn poolsight_dependencies(manifest: &str) -> Vec<String> {
    let mut out: Vec<String> = (dependencies(manifest).into_iter())
        .filter(|d| d.starts_with("poolsight"))
        .collect();
    out.sort();
    out
}

/// Each crate's manifest by crate name.
fn manifests() -> std::collections::BTreeMap<String, String> {
    let mut out = std::collections::BTreeMap::new();
    for manifest in tree().iter().filter(|p| p.ends_with("Cargo.toml")) {
        let text = std::fs::read_to_string(root().join(manifest)).expect("a manifest");
        let Some(name) = (text.lines())
            .skip_while(|l| l.trim() != "[package]")
            .find_map(|l| l.trim().strip_prefix("name = "))
        else {
            continue; // a manifest of a workspace alone names no crate
        };
        out.insert(name.trim_matches('"').to_string(), text);
    }
    out
}

#[test]
fn only_views_and_export_link_inferno_arrow_or_parquet() {
    // What only wants a trace read, or its figures, compiles none of them: the analyzer and
    // every project crate it depends on, followed through their manifests.
    let manifests = manifests();
    let heavy = |d: &str| d == "inferno" || d == "parquet" || d.starts_with("arrow");
    let mut seen = std::collections::BTreeSet::new();
    let mut todo = vec!["poolsight-analyzer".to_string()];
    while let Some(name) = todo.pop() {
        if !seen.insert(name.clone()) {
            continue;
        }
        let text = &manifests[&name];
        let linked: Vec<String> = (dependencies(text).into_iter())
            .filter(|d| heavy(d))
            .collect();
        assert!(linked.is_empty(), "{name} depends on {linked:?}");
        todo.extend(poolsight_dependencies(text));
    }
    assert!(seen.contains("poolsight-reader"), "{seen:?}");
    // And the crates that draw and export do link them: the test would catch a rename.
    assert!(dependencies(&manifests["poolsight-views"]).contains(&"inferno".into()));
    assert!(dependencies(&manifests["poolsight-export"]).contains(&"parquet".into()));
}

#[test]
fn the_crate_table_is_each_cargo_toml() {
    let page = std::fs::read_to_string(root().join("docs/architecture.md")).expect("the page");
    let start = page
        .find("| crate | depends on |")
        .expect("the crate table");
    let mut said = std::collections::BTreeMap::new();
    for row in page[start..]
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'))
    {
        let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
        let mut deps: Vec<String> = (cells[1].split(", "))
            .filter(|d| *d != "—")
            .map(String::from)
            .collect();
        deps.sort();
        said.insert(cells[0].to_string(), deps);
    }
    let found: std::collections::BTreeMap<String, Vec<String>> = (manifests().into_iter())
        .map(|(name, text)| (name, poolsight_dependencies(&text)))
        .collect();
    assert_eq!(
        said, found,
        "docs/architecture.md's crate table against the Cargo.toml files"
    );
}
