//! The import rules of docs/architecture.md ("Layers"), checked over src/: no import
//! circle among the files, and no arrow from a lower layer to a higher one.
//!
//! Reads `use crate::`/`use super::`/`use self::` statements (groups and globs included)
//! and inline `crate::`/`super::` paths, resolves each to the file of the module it
//! names (the longest prefix that is a file), and checks the graph. A module's use of its
//! own children is its structure, not an arrow (a child's use of its parent is one).
//! Test-only code (files named `tests.rs`/`*_tests.rs`, and everything after a
//! `#[cfg(test)]` module) is left out.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The layers, highest first; a file may import only from its own layer or below.
/// Each entry: a module path prefix (`releaser`, `serve`), longest match wins.
const LAYERS: &[(&str, &[&str])] = &[
    ("entry", &["main", "cli", "demo", "ctl"]),
    ("wiring", &["serve"]),
    (
        "shells",
        &[
            "server",
            "releaser",
            "budget::lease",
            "election",
            "overrides_watch",
            "simulate",
        ],
    ),
    ("handles", &["shared"]),
    (
        "pure cores",
        &[
            "pacing",
            "objects",
            "admission",
            "queue",
            "limiter",
            "budget",
        ],
    ),
    ("policy", &["policy", "sample"]),
    ("base", &["names", "metrics"]),
];

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Module path of a source file: src/a/b.rs and src/a/b/mod.rs are `a::b`; lib.rs and
/// main.rs are the roots (`main` for the binary, so its layer can be named).
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).expect("under src");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().expect("a file name");
    match last.as_str() {
        "mod.rs" | "lib.rs" => {}
        other => parts.push(other.trim_end_matches(".rs").to_string()),
    }
    parts
}

fn is_test_file(file: &Path) -> bool {
    let name = file.file_name().map(|n| n.to_string_lossy().into_owned());
    matches!(name.as_deref(), Some(n) if n == "tests.rs" || n.ends_with("_tests.rs"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .expect("read src")
        .map(|e| e.expect("entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") && !is_test_file(&path) {
            out.push(path);
        }
    }
}

/// The code without comments, string literals and test modules.
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod ") {
        Some(at) => &text[..at],
        None => text,
    };
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        let rest = &text[i..];
        if rest.starts_with("//") {
            i += rest.find('\n').unwrap_or(rest.len());
        } else if rest.starts_with("/*") {
            i += rest.find("*/").map_or(rest.len(), |e| e + 2);
        } else if rest.starts_with("r#\"") || rest.starts_with("r\"") {
            let close = if rest.starts_with("r#") { "\"#" } else { "\"" };
            let open = if rest.starts_with("r#") { 3 } else { 2 };
            i += open
                + rest[open..]
                    .find(close)
                    .map_or(rest.len(), |e| e + close.len());
            out.push_str("\"\"");
        } else if bytes[i] == b'"' {
            let mut j = i + 1;
            while j < bytes.len() && bytes[j] != b'"' {
                j += if bytes[j] == b'\\' { 2 } else { 1 };
            }
            i = j + 1;
            out.push_str("\"\"");
        } else if rest.starts_with("'\"'") {
            i += 3;
        } else {
            let c = rest.chars().next().expect("a char");
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// Expands a use tree (`a::{b, c::{d, *}}`) into its paths.
fn expand_use(tree: &str) -> Vec<String> {
    // `x as y` names x; the alias is kept apart by '@' before the spaces go.
    let tree = tree.split_whitespace().collect::<Vec<_>>().join(" ");
    let tree: String = tree.replace(" as ", "@").replace(' ', "");
    let Some(open) = tree.find('{') else {
        return vec![tree.split('@').next().unwrap_or(&tree).to_string()];
    };
    let prefix = &tree[..open];
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .filter(|p| !p.is_empty())
        .flat_map(|p| {
            let p = if p == "self" { "" } else { p };
            expand_use(p)
                .into_iter()
                .map(|s| format!("{prefix}{s}"))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Every module path the code refers to.
fn referenced_paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    // the code outside use statements, for the inline paths
    let mut outside = String::with_capacity(code.len());
    // use statements
    while let Some(at) = find_word(rest, "use") {
        outside.push_str(&rest[..at]);
        let stmt_start = at + 3;
        let end = rest[stmt_start..]
            .find(';')
            .map_or(rest.len(), |e| stmt_start + e);
        for path in expand_use(rest[stmt_start..end].trim()) {
            out.push(path);
        }
        rest = &rest[end..];
    }
    outside.push_str(rest);
    let code = outside.as_str();
    // inline paths
    for root in ["crate::", "super::", "churn_throttler::"] {
        let mut from = 0;
        while let Some(at) = code[from..].find(root) {
            let start = from + at;
            let prev = code[..start].chars().next_back();
            from = start + root.len();
            if prev.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let end = code[start..]
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .map_or(code.len(), |e| start + e);
            out.push(code[start..end].trim_end_matches(':').to_string());
        }
    }
    out
}

fn find_word(haystack: &str, word: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(at) = haystack[from..].find(word) {
        let start = from + at;
        let before = haystack[..start].chars().next_back();
        let after = haystack[start + word.len()..].chars().next();
        let ident = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
        if !ident(before) && after.is_some_and(char::is_whitespace) {
            return Some(start);
        }
        from = start + word.len();
    }
    None
}

struct Tree {
    /// module path -> file
    files: BTreeMap<Vec<String>, PathBuf>,
}

impl Tree {
    /// The file of the longest prefix of `path` that is a module with a file.
    fn resolve(&self, path: &[String]) -> Option<&PathBuf> {
        (1..=path.len())
            .rev()
            .find_map(|n| self.files.get(&path[..n]))
    }
}

/// Resolves a referenced path from the module `here` to a module path from the root.
fn absolute(here: &[String], path: &str, tree: &Tree) -> Option<Vec<String>> {
    let segs: Vec<String> = path
        .split("::")
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    let (first, rest) = segs.split_first()?;
    let mut base: Vec<String> = match first.as_str() {
        "crate" | "churn_throttler" => Vec::new(),
        "self" => here.to_vec(),
        "super" => {
            let mut b = here.to_vec();
            b.pop();
            let mut rest = rest;
            while rest.first().is_some_and(|s| s == "super") {
                b.pop();
                rest = &rest[1..];
            }
            b.extend(rest.iter().cloned());
            return Some(b);
        }
        // A child module named bare (`use plan::order` beside `mod plan;`).
        name => {
            let mut child = here.to_vec();
            child.push(name.to_string());
            if tree.files.contains_key(&child) {
                child.extend(rest.iter().cloned());
                return Some(child);
            }
            return None;
        }
    };
    base.extend(rest.iter().cloned());
    Some(base)
}

fn layer_of(module: &[String]) -> usize {
    let name = module.join("::");
    let mut best: Option<(usize, usize)> = None;
    for (rank, (_, prefixes)) in LAYERS.iter().enumerate() {
        for prefix in *prefixes {
            let matches = name == *prefix || name.starts_with(&format!("{prefix}::"));
            if matches && best.is_none_or(|(len, _)| prefix.len() > len) {
                best = Some((prefix.len(), rank));
            }
        }
    }
    best.map(|(_, rank)| rank)
        .unwrap_or_else(|| panic!("module {name} is in no layer of tests/layers.rs"))
}

/// file -> files it imports (never itself).
fn graph() -> (BTreeMap<PathBuf, BTreeSet<PathBuf>>, Tree) {
    let src = src_dir();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let tree = Tree {
        files: files
            .iter()
            .map(|f| (module_of(&src, f), f.clone()))
            .collect(),
    };
    let mut edges = BTreeMap::new();
    for file in &files {
        let here = module_of(&src, file);
        let code = code_of(&fs::read_to_string(file).expect("read"));
        let mut to = BTreeSet::new();
        for path in referenced_paths(&code) {
            let Some(abs) = absolute(&here, &path, &tree) else {
                continue;
            };
            // A module file that declares children and uses them (or re-exports them) is
            // the module's structure, not an arrow: only a child's use of its parent counts.
            if abs.starts_with(&here) && abs.len() > here.len() {
                continue;
            }
            if let Some(target) = tree.resolve(&abs) {
                if target != file && !abs.is_empty() {
                    to.insert(target.clone());
                }
            }
        }
        edges.insert(file.clone(), to);
    }
    (edges, tree)
}

/// Strongly connected components of more than one file (Tarjan).
fn circles(edges: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<Vec<PathBuf>> {
    struct State<'a> {
        edges: &'a BTreeMap<PathBuf, BTreeSet<PathBuf>>,
        index: BTreeMap<&'a PathBuf, usize>,
        low: BTreeMap<&'a PathBuf, usize>,
        stack: Vec<&'a PathBuf>,
        on_stack: BTreeSet<&'a PathBuf>,
        next: usize,
        out: Vec<Vec<PathBuf>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a PathBuf) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on_stack.insert(v);
        let edges = s.edges;
        for w in edges.get(v).into_iter().flatten() {
            if !s.index.contains_key(w) {
                visit(s, w);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.clone());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.out.push(component);
            }
        }
    }
    let mut s = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out
}

fn short(file: &Path) -> String {
    file.strip_prefix(src_dir())
        .unwrap_or(file)
        .display()
        .to_string()
}

#[test]
fn no_import_circle_among_the_files_of_src() {
    let (edges, _) = graph();
    let found: Vec<String> = circles(&edges)
        .iter()
        .map(|c| c.iter().map(|f| short(f)).collect::<Vec<_>>().join(" <-> "))
        .collect();
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
}

#[test]
fn no_arrow_from_a_lower_layer_to_a_higher_one() {
    let (edges, _) = graph();
    let src = src_dir();
    let mut upward = Vec::new();
    for (from, tos) in edges.iter().filter(|(f, _)| !f.ends_with("lib.rs")) {
        let from_layer = layer_of(&module_of(&src, from));
        for to in tos {
            let to_layer = layer_of(&module_of(&src, to));
            if to_layer < from_layer {
                upward.push(format!(
                    "{} ({}) -> {} ({})",
                    short(from),
                    LAYERS[from_layer].0,
                    short(to),
                    LAYERS[to_layer].0
                ));
            }
        }
    }
    assert!(upward.is_empty(), "upward imports:\n{}", upward.join("\n"));
}

#[test]
fn only_the_entry_points_know_the_command_line() {
    let src = src_dir();
    let (edges, _) = graph();
    let cli = src.join("cli.rs");
    let readers: Vec<String> = edges
        .iter()
        .filter(|(_, tos)| tos.contains(&cli))
        .map(|(from, _)| short(from))
        .filter(|f| f != "main.rs")
        .collect();
    assert!(
        readers.is_empty(),
        "modules importing crate::cli: {readers:?}"
    );
}

/// The checker itself, on a small tree of strings: a circle and a re-export are told apart.
#[test]
fn the_parser_reads_groups_globs_and_inline_paths() {
    let code = code_of(
        "use crate::a::{b, c::{d, *}};\n// use crate::x;\npub use self::e as f;\nfn g() { crate::h::i(); let s = \"crate::j\"; }\n#[cfg(test)]\nmod tests { use crate::k; }\n",
    );
    let mut paths = referenced_paths(&code);
    paths.sort();
    assert_eq!(
        paths,
        [
            "crate::a::b",
            "crate::a::c::*",
            "crate::a::c::d",
            "crate::h::i",
            "self::e"
        ]
    );
}
