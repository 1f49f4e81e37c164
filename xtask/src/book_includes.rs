//! The `includes` check. Fails when a page of the
//! book includes code that is not there. Run it: `cargo xtask test --only includes`.
//! Unit tests: xtask/tests/book_includes.rs.
//!
//! Why: the book never pastes code, it includes it from the compiled files
//! with {{#include ../src/ch01_collectives/solution.rs:ring_all_reduce}}.
//! mdBook only logs a missing file and still exits 0, and a missing ANCHOR
//! gives an empty listing with no message at all, so a renamed anchor would
//! quietly empty a page. This resolves every include the way mdBook does and
//! reports each one that points at a missing file, a missing
//! `// ANCHOR: name`, an anchor without its `// ANCHOR_END: name`, or lines
//! that select nothing.

use std::fs;
use std::path::{Path, PathBuf};

/// The link kinds that name a file (mdBook's `links` preprocessor).
const FILE_KINDS: &[&str] = &["include", "rustdoc_include", "playground", "playpen"];

/// One `{{#kind target}}` link on a page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    pub kind: String,
    /// Everything after the kind: `../src/lib.rs:anchor editable`.
    pub target: String,
    /// 1-based line of the page where the link starts.
    pub line: usize,
    /// The link as written, for messages.
    pub text: String,
}

/// Every link on a page, as mdBook finds them. A link escaped with a
/// backslash (`\{{#include ...}}`) is not one.
pub fn find_links(page: &str) -> Vec<Link> {
    let bytes = page.as_bytes();
    let mut links = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        if page[at..].starts_with("\\{{#") {
            // An escaped link runs to the last `}}` on its line.
            let line_end = page[at..].find('\n').map_or(page.len(), |end| at + end);
            if let Some(close) = page[at..line_end].rfind("}}") {
                at += close + 2;
                continue;
            }
        }
        if let Some((link_len, kind, target)) = link_at(&page[at..]) {
            let line = page[..at].matches('\n').count() + 1;
            let text = page[at..at + link_len].to_string();
            links.push(Link { kind, target, line, text });
            at += link_len;
        } else {
            at += page[at..].chars().next().map_or(1, char::len_utf8);
        }
    }
    links
}

/// A link starting right at the beginning of `text`: `{{`, spaces, `#`, the
/// kind (letters, digits, `_`), at least one space, the target (no `}`), `}}`.
fn link_at(text: &str) -> Option<(usize, String, String)> {
    let rest = text.strip_prefix("{{")?;
    let rest = rest.trim_start().strip_prefix('#')?;
    let kind_len = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len());
    let (kind, rest) = rest.split_at(kind_len);
    if kind.is_empty() || !rest.starts_with(char::is_whitespace) {
        return None;
    }
    let close = rest.find('}')?;
    let (target, after) = rest.split_at(close);
    if target.trim().is_empty() || !after.starts_with("}}") {
        return None;
    }
    let len = text.len() - after.len() + 2;
    Some((len, kind.to_string(), target.trim_start().to_string()))
}

/// The name in `ANCHOR: name` (or `ANCHOR_END: name` with `marker`
/// "ANCHOR_END:"), if the line has one.
fn anchor_name<'a>(line: &'a str, marker: &str) -> Option<&'a str> {
    let rest = line[line.find(marker)? + marker.len()..].trim_start();
    let len = rest.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '-')).unwrap_or(rest.len());
    (len > 0).then(|| &rest[..len])
}

/// The lines between `ANCHOR: anchor` and its `ANCHOR_END: anchor`, without
/// the marker lines of other anchors inside; or which marker is missing.
pub fn anchored_lines<'a>(text: &'a str, anchor: &str) -> Result<Vec<&'a str>, String> {
    let lines: Vec<&str> = text.lines().collect();
    let is_start = |line: &&str| {
        anchor_name(line, "ANCHOR:") == Some(anchor) && anchor_name(line, "ANCHOR_END:").is_none()
    };
    let Some(start) = lines.iter().position(is_start) else {
        return Err(format!("no line `// ANCHOR: {anchor}` in the file"));
    };
    let is_end = |line: &&str| anchor_name(line, "ANCHOR_END:") == Some(anchor);
    let Some(end) = lines[start + 1..].iter().position(is_end).map(|offset| start + 1 + offset) else {
        return Err(format!("`// ANCHOR: {anchor}` has no `// ANCHOR_END: {anchor}` after it"));
    };
    let is_marker =
        |line: &&&str| anchor_name(line, "ANCHOR:").is_some() || anchor_name(line, "ANCHOR_END:").is_some();
    Ok(lines[start + 1..end].iter().filter(|line| !is_marker(line)).copied().collect())
}

/// Applies an include's selector (after the first `:`) as mdBook does:
/// nothing (the whole file), an anchor name, `N` (line N), `N:M` (lines N to
/// M), `N:` (line N to the end), `:M` (up to line M). Lines count from 1.
pub fn selected_lines<'a>(text: &'a str, selector: &str) -> Result<Vec<&'a str>, String> {
    let lines: Vec<&str> = text.lines().collect();
    if selector.is_empty() {
        return Ok(lines);
    }
    let mut parts = selector.splitn(3, ':');
    let first = parts.next().unwrap_or("");
    let is_number = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !first.is_empty() && !is_number(first) {
        return anchored_lines(text, first);
    }
    let start = first.parse::<usize>().map_or(0, |n| n.saturating_sub(1));
    let end = match parts.next() {
        None => start + 1, // `file:N`: the single line N
        Some(last) if is_number(last) => last.parse().unwrap_or(usize::MAX), // `file:N:M`
        Some(_) => lines.len(), // `file:N:`: line N to the end
    };
    let end = end.min(lines.len());
    Ok(if start < end { lines[start..end].to_vec() } else { Vec::new() })
}

/// The problem with one include, if it has one.
pub fn check_link(link: &Link, page_dir: &Path) -> Option<String> {
    let first_word = link.target.split_whitespace().next().unwrap_or("");
    let (path_part, mut selector) = first_word.split_once(':').unwrap_or((first_word, ""));
    if link.kind == "playground" || link.kind == "playpen" {
        selector = ""; // these take options, never a selector
    }
    let included = page_dir.join(path_part);
    let Ok(text) = fs::read_to_string(&included) else {
        return Some(format!("file not found: {}", normalise(&included).display()));
    };
    match selected_lines(&text, selector) {
        Err(problem) => Some(format!("{problem} ({})", normalise(&included).display())),
        Ok(body) if body.iter().all(|line| line.trim().is_empty()) => Some(format!(
            "selects no code (empty anchor or line range) in {}",
            normalise(&included).display()
        )),
        Ok(_) => None,
    }
}

/// A path with its `..` folded into the folder before it (`a/../b` is `b`),
/// without touching the file system.
fn normalise(path: &Path) -> PathBuf {
    let mut parts: Vec<std::path::Component> = Vec::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir
                if matches!(parts.last(), Some(std::path::Component::Normal(_))) =>
            {
                parts.pop();
            }
            std::path::Component::CurDir => {}
            other => parts.push(other),
        }
    }
    parts.iter().collect()
}

/// The `src` of book.toml's `[book]` table (mdBook's default: `src`). A
/// plain reading of `src = "..."` in that table: enough for this book.toml.
pub fn book_source_dir(book_toml: &str) -> String {
    let mut in_book_table = false;
    for line in book_toml.lines().map(str::trim) {
        if line.starts_with('[') {
            in_book_table = line == "[book]";
        } else if let Some(value) = line.strip_prefix("src").map(str::trim_start) {
            if let (true, Some(value)) = (in_book_table, value.strip_prefix('=')) {
                return value.split('#').next().unwrap_or("").trim().trim_matches('"').to_string();
            }
        }
    }
    "src".to_string()
}

/// What the `includes` check found in the whole book.
#[derive(Debug, Default)]
pub struct IncludesOutcome {
    pub pages: usize,
    pub includes: usize,
    /// One message per broken include: `page:line: link` and the problem.
    pub broken: Vec<String>,
}

/// Checks every include on every page of the book whose book.toml is at
/// `root`; `Err` when there is no book at all.
pub fn check_book(root: &Path) -> Result<IncludesOutcome, String> {
    let book_toml = fs::read_to_string(root.join("book.toml"))
        .map_err(|_| format!("no book.toml in {}", root.display()))?;
    let source_dir = root.join(book_source_dir(&book_toml));
    let mut pages = Vec::new();
    collect_markdown(&source_dir, &mut pages);
    pages.sort();
    let mut outcome = IncludesOutcome { pages: pages.len(), ..Default::default() };
    for page in &pages {
        let Ok(text) = fs::read_to_string(page) else { continue };
        let page_name = page.strip_prefix(root).unwrap_or(page).display().to_string();
        for link in find_links(&text).iter().filter(|link| FILE_KINDS.contains(&link.kind.as_str())) {
            outcome.includes += 1;
            if let Some(problem) = check_link(link, page.parent().unwrap_or(root)) {
                outcome.broken.push(format!("{page_name}:{}: {}\n      {problem}", link.line, link.text));
            }
        }
    }
    Ok(outcome)
}

fn collect_markdown(dir: &Path, pages: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for path in entries.filter_map(|entry| Some(entry.ok()?.path())) {
        if path.is_dir() {
            collect_markdown(&path, pages);
        } else if path.extension().is_some_and(|ext| ext == "md") {
            pages.push(path);
        }
    }
}
