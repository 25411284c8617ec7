//! The README, ARCHITECTURE.md and the guide (`docs/`, an mdBook) link into each other and into
//! the repository. Every relative link must lead to a file or directory that exists, and every
//! `#anchor` into a Markdown file to one of its headings (by the slug GitHub and mdBook both
//! make), so a chapter or heading renamed without its links fails here, not in a reader's
//! browser: `mdbook build` (scripts/test.sh) checks neither. Plain Rust, no mdBook needed.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The README, ARCHITECTURE.md and every page of the guide.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut docs = vec![root.join("README.md"), root.join("ARCHITECTURE.md")];
    let mut dirs = vec![root.join("docs/src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                docs.push(path);
            }
        }
    }
    docs.sort();
    docs
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The text outside fenced code blocks, with inline code spans (a run of backticks to the next
/// run of as many, across lines too) taken out: what may hold links and headings.
fn prose(text: &str) -> String {
    let mut outside = String::new();
    let mut fenced = false;
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            fenced = !fenced;
        } else if !fenced {
            outside.push_str(line);
        }
        // Every line stays (empty inside code), so line structure does.
        outside.push('\n');
    }
    let (bytes, mut out, mut i) = (outside.as_bytes(), String::new(), 0);
    while i < bytes.len() {
        if bytes[i] != b'`' {
            let next = outside[i..].find('`').map_or(bytes.len(), |n| i + n);
            out.push_str(&outside[i..next]);
            i = next;
            continue;
        }
        let run = bytes[i..].iter().take_while(|&&b| b == b'`').count();
        let ticks = "`".repeat(run);
        // The closing run: exactly as many backticks, not part of a longer run.
        let mut from = i + run;
        let close = loop {
            match outside[from..].find(&ticks) {
                None => break None,
                Some(n) => {
                    let at = from + n;
                    let end = at + run;
                    if bytes.get(end) == Some(&b'`') {
                        from = end + bytes[end..].iter().take_while(|&&b| b == b'`').count();
                    } else {
                        break Some(end);
                    }
                }
            }
        };
        match close {
            Some(end) => {
                out.extend(outside[i..end].chars().filter(|&c| c == '\n'));
                i = end;
            }
            None => {
                out.push_str(&ticks);
                i += run;
            }
        }
    }
    out
}

/// The link targets of a Markdown text: inline links and images `[text](target "title")` and
/// reference definitions `[name]: target`.
fn links(text: &str) -> Vec<String> {
    let outside = prose(text);
    let mut found = Vec::new();
    let mut rest = outside.as_str();
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let target: String = rest.chars().take_while(|&c| c != ')' && !c.is_whitespace()).collect();
        found.push(target.trim_start_matches('<').trim_end_matches('>').to_owned());
    }
    for line in outside.lines() {
        let line = line.trim_start();
        if let Some(def) = line.strip_prefix('[').and_then(|l| l.split_once("]:")).map(|(_, t)| t.trim()) {
            if let Some(target) = def.split_whitespace().next() {
                found.push(target.to_owned());
            }
        }
    }
    found
}

/// The anchor GitHub and mdBook give a heading: its text without link syntax, lowercased,
/// spaces as `-`, and every character but letters, digits, `-` and `_` dropped.
fn slug(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading;
    // [text](url) -> text
    while let Some(open) = rest.find('[') {
        let Some(mid) = rest[open..].find("](").map(|m| open + m) else { break };
        let Some(close) = rest[mid..].find(')').map(|c| mid + c) else { break };
        text.push_str(&rest[..open]);
        text.push_str(&rest[open + 1..mid]);
        rest = &rest[close + 1..];
    }
    text.push_str(rest);
    text.trim()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c.to_lowercase().next().unwrap_or(c)),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown text's ATX headings (outside code), a repeated one numbered on
/// (`-1`, `-2`) as GitHub does.
fn anchors(text: &str) -> HashSet<String> {
    let mut seen = HashSet::new();
    let mut fenced = false;
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            fenced = !fenced;
            continue;
        }
        let level = line.bytes().take_while(|&b| b == b'#').count();
        if fenced || !(1..=6).contains(&level) || !line[level..].starts_with(' ') {
            continue;
        }
        let base = slug(line[level..].trim().trim_end_matches('#'));
        let mut anchor = base.clone();
        let mut n = 0;
        while !seen.insert(anchor.clone()) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
    }
    seen
}

/// What is wrong with the links of `text`, the content of the file at `file`.
fn broken_links(file: &Path, text: &str) -> Vec<String> {
    let mut broken = Vec::new();
    for target in links(text) {
        if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
        let resolved = if path.is_empty() { file.to_path_buf() } else { file.parent().unwrap().join(path) };
        if !resolved.exists() {
            broken.push(format!("{}: {target}: no such file", file.display()));
            continue;
        }
        if anchor.is_empty() || resolved.extension().is_none_or(|e| e != "md") {
            continue;
        }
        let content = if path.is_empty() { text.to_owned() } else { read(&resolved) };
        if !anchors(&content).contains(anchor) {
            broken.push(format!("{}: {target}: no heading #{anchor} in {}", file.display(), resolved.display()));
        }
    }
    broken
}

#[test]
fn every_relative_link_and_anchor_in_the_docs_resolves() {
    let docs = documents(&root());
    assert!(docs.len() > 3, "the guide's pages: {docs:?}");
    let broken: Vec<String> = docs.iter().flat_map(|d| broken_links(d, &read(d))).collect();
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_page_of_the_guide_is_in_its_summary() {
    let src = root().join("docs/src");
    let summary = read(&src.join("SUMMARY.md"));
    let listed: HashSet<PathBuf> = links(&summary).iter().map(|l| src.join(l)).collect();
    let missing: Vec<PathBuf> = documents(&root())
        .into_iter()
        .filter(|d| d.starts_with(&src) && !d.ends_with("SUMMARY.md") && !listed.contains(d))
        .collect();
    assert!(missing.is_empty(), "pages mdBook would not build (not in docs/src/SUMMARY.md): {missing:?}");
}

/// The checker itself: it finds a missing file and a missing heading, and leaves code alone.
#[test]
fn the_link_check_finds_what_is_broken() {
    assert_eq!(slug("The Kafka backend (`src/storage/kafka.rs`, `x_y`)"), "the-kafka-backend-srcstoragekafkars-x_y");
    assert_eq!(slug("A [linked](x.md) 60-second tour!"), "a-linked-60-second-tour");
    let text = "# Top\n\n## Top\n\nSee [a](#top-1), [b](#nowhere), [c](no-such-file.md) and \
                [d](README.md#the-two-commands).\n\n`[e](in-code.md)` and ``[f](`also-code.md`)``\n\
                ```\n[g](fenced.md)\n```\n[h]: missing.md\n";
    let broken = broken_links(&root().join("README.md"), text);
    let broken = broken.join("\n");
    assert!(
        broken.contains("#nowhere") && broken.contains("no-such-file.md") && broken.contains("missing.md"),
        "{broken}"
    );
    for fine in ["#top-1", "the-two-commands", "in-code", "also-code", "fenced"] {
        assert!(!broken.contains(fine), "{fine} reported:\n{broken}");
    }
}
