//! The broker crate's layering, checked against the layer table in ARCHITECTURE.md: every
//! reference a module of `src/` makes to another (`use crate::...`, `super::...` and paths
//! written inline, comments and `#[cfg(test)]` modules left out) points to a module of a lower
//! row of the table, and no files import each other, directly or around a loop. A new module
//! must take its row in the table; a new arrow upward fails here, naming the file.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The table's rows, bottom first: each row's module names.
fn layer_table() -> Vec<Vec<String>> {
    let doc = std::fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let section = doc.split("\n## Layers of the broker crate").nth(1).expect("a Layers section");
    let block = section.split("```").nth(1).expect("the layer table, fenced");
    block
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with(' '))
        .map(|l| {
            let names = l.split("  ").next().unwrap_or(l);
            names.split(',').map(|n| n.trim().to_owned()).filter(|n| !n.is_empty()).collect()
        })
        .collect()
}

/// The crate's modules, as lib.rs declares them.
fn top_modules() -> Vec<String> {
    let lib = std::fs::read_to_string(root().join("src/lib.rs")).expect("lib.rs");
    lib.lines().filter_map(|l| l.strip_prefix("pub mod ")).map(|l| l.trim_end_matches(';').to_owned()).collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("readable") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// A file's code: comments removed, string literals blanked, `#[cfg(test)]` items cut.
fn code_of(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let end = text[i + 2..].find("*/").map_or(b.len(), |e| i + 2 + e + 2);
            i = end;
        } else if b[i] == b'"' && !(i > 0 && (b[i - 1] == b'\'' || b[i - 1] == b'#')) {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else {
            let c = text[i..].chars().next().expect("a char");
            out.push(c);
            i += c.len_utf8();
        }
    }
    // Test modules (and their imports) are not the layering's concern.
    match out.find("#[cfg(test)]") {
        Some(at) => out[..at].to_owned(),
        None => out,
    }
}

/// The module path of a file: `src/shard/core.rs` is `[shard, core]`, `src/shard/mod.rs` is
/// `[shard]`.
fn module_path(file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(root().join("src")).expect("under src");
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let last = parts.pop().expect("a file name");
    if last != "mod.rs" && last != "lib.rs" {
        parts.push(last.trim_end_matches(".rs").to_owned());
    }
    parts
}

/// Every path the code names from inside the crate, resolved to an absolute module path
/// (`crate::a::{b::C, d}` gives `[a, b, C]` and `[a, d]`).
fn references(code: &str, me: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let b = code.as_bytes();
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut i = 0;
    while i < b.len() {
        let start = i;
        if (i == 0 || !(word(b[i - 1]) || b[i - 1] == b':'))
            && ["crate::", "super::", "self::"].iter().any(|k| code[i..].starts_with(k))
        {
            // Read the whole path, braces included.
            let mut depth = 0usize;
            while i < b.len() {
                match b[i] {
                    b'{' => depth += 1,
                    b'}' if depth > 0 => depth -= 1,
                    c if depth > 0 && (word(c) || matches!(c, b':' | b',' | b' ' | b'\n' | b'*')) => {}
                    c if depth == 0 && (word(c) || c == b':') => {}
                    _ => break,
                }
                i += 1;
                if depth == 0 && b[i - 1] == b'}' {
                    break;
                }
            }
            for path in expand(&code[start..i]) {
                if let Some(abs) = absolute(&path, me) {
                    out.push(abs);
                }
            }
        } else {
            i += 1;
        }
    }
    out
}

/// `a::{b::c, d}` as `[a::b::c, a::d]`.
fn expand(path: &str) -> Vec<String> {
    let path: String = path.split_whitespace().collect();
    let Some(open) = path.find('{') else { return vec![path.trim_end_matches("::").to_owned()] };
    let prefix = &path[..open];
    let inner = &path[open + 1..path.rfind('}').unwrap_or(path.len())];
    let mut parts = Vec::new();
    let (mut depth, mut from) = (0, 0);
    for (k, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[from..k]);
                from = k + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[from..]);
    parts.into_iter().filter(|p| !p.is_empty()).flat_map(|p| expand(&format!("{prefix}{p}"))).collect()
}

fn absolute(path: &str, me: &[String]) -> Option<Vec<String>> {
    let mut segs = path.split("::").filter(|s| !s.is_empty());
    let mut base: Vec<String> = match segs.next()? {
        "crate" => Vec::new(),
        "self" => me.to_vec(),
        "super" => {
            let mut b = me.to_vec();
            b.pop()?;
            b
        }
        _ => return None,
    };
    for s in segs {
        match s {
            "super" => {
                base.pop()?;
            }
            "self" | "*" => {}
            s => base.push(s.to_owned()),
        }
    }
    Some(base)
}

/// The file that defines the longest prefix of `path` that is a file.
fn file_of(path: &[String], files: &BTreeSet<Vec<String>>) -> Option<Vec<String>> {
    (1..=path.len()).rev().map(|n| path[..n].to_vec()).find(|p| files.contains(p))
}

struct Graph {
    /// file module path -> the file module paths it names.
    edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
}

fn graph() -> Graph {
    let mut paths = Vec::new();
    rust_files(&root().join("src"), &mut paths);
    let binary = |p: &Path| p.ends_with("src/main.rs") || p.starts_with(root().join("src/cli"));
    let test_file = |p: &Path| p.ends_with("tests.rs") || p.components().any(|c| c.as_os_str() == "tests");
    let paths: Vec<PathBuf> = paths.into_iter().filter(|p| !binary(p) && !test_file(p)).collect();
    let files: BTreeSet<Vec<String>> = paths.iter().map(|p| module_path(p)).collect();
    let mut edges = BTreeMap::new();
    for p in &paths {
        let me = module_path(p);
        let code = code_of(&std::fs::read_to_string(p).expect("readable"));
        let named: BTreeSet<Vec<String>> = references(&code, &me)
            .iter()
            .filter_map(|r| file_of(r, &files))
            .filter(|f| *f != me && !f.is_empty())
            .collect();
        edges.insert(me, named);
    }
    Graph { edges }
}

fn show(m: &[String]) -> String {
    format!("src/{}", m.join("/"))
}

#[test]
fn every_module_imports_only_from_rows_below_its_own() {
    let table = layer_table();
    let row_of: BTreeMap<&str, usize> =
        table.iter().enumerate().flat_map(|(i, row)| row.iter().map(move |m| (m.as_str(), i))).collect();
    for m in top_modules() {
        assert!(row_of.contains_key(m.as_str()), "module `{m}` has no row in ARCHITECTURE.md's layer table");
    }
    let g = graph();
    let mut wrong = Vec::new();
    for (from, tos) in &g.edges {
        let Some(f) = from.first() else { continue };
        for to in tos {
            let t = &to[0];
            if t == f {
                continue;
            }
            match (row_of.get(f.as_str()), row_of.get(t.as_str())) {
                (Some(a), Some(b)) if b < a => {}
                (a, b) => wrong.push(format!("{} -> {} (rows {a:?} -> {b:?})", show(from), show(to))),
            }
        }
    }
    assert!(wrong.is_empty(), "imports that do not run down ARCHITECTURE.md's layer table:\n{}", wrong.join("\n"));
}

#[test]
fn no_files_import_each_other_around_a_loop() {
    let g = graph();
    // Depth-first search for a back edge; the loop is the stack from its target.
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Open,
        Done,
    }
    let mut mark: BTreeMap<&Vec<String>, Mark> = g.edges.keys().map(|k| (k, Mark::New)).collect();
    let mut loops = Vec::new();
    fn visit<'a>(
        n: &'a Vec<String>,
        g: &'a Graph,
        mark: &mut BTreeMap<&'a Vec<String>, Mark>,
        stack: &mut Vec<&'a Vec<String>>,
        loops: &mut Vec<String>,
    ) {
        mark.insert(n, Mark::Open);
        stack.push(n);
        for m in g.edges.get(n).into_iter().flatten() {
            match mark.get(m).copied().unwrap_or(Mark::Done) {
                Mark::New => visit(m, g, mark, stack, loops),
                Mark::Open => {
                    let at = stack.iter().position(|s| *s == m).expect("on the stack");
                    let names: Vec<String> = stack[at..].iter().map(|s| show(s)).collect();
                    loops.push(format!("{} -> {}", names.join(" -> "), show(m)));
                }
                Mark::Done => {}
            }
        }
        stack.pop();
        mark.insert(n, Mark::Done);
    }
    let keys: Vec<&Vec<String>> = g.edges.keys().collect();
    for k in keys {
        if mark[k] == Mark::New {
            visit(k, &g, &mut mark, &mut Vec::new(), &mut loops);
        }
    }
    assert!(loops.is_empty(), "files that import each other:\n{}", loops.join("\n"));
}

/// The checker itself: it must see grouped, nested and relative paths, and nothing in comments,
/// strings or test modules.
#[test]
fn the_layer_check_sees_what_it_must_and_nothing_else() {
    let code = code_of(
        "use crate::a::{b::C, d::{e, f::G}};\n// crate::no\nlet s = \"crate::no\";\nsuper::h::x();\n\
         /* crate::no */ #[cfg(test)] mod tests { use crate::no; }",
    );
    let me = vec!["m".to_owned(), "n".to_owned()];
    let refs: Vec<String> = references(&code, &me).iter().map(|r| r.join("::")).collect();
    assert_eq!(refs, ["a::b::C", "a::d::e", "a::d::f::G", "m::h::x"]);
    let rows = layer_table();
    assert!(rows.len() > 5 && rows[0] == ["sys"], "the table's bottom row is sys's: {rows:?}");
    assert!(rows[1].contains(&"model".to_owned()), "model's row is next: {rows:?}");
}
