//! The `files` check. Every repository path that
//! the docs, scripts and code mention must exist, and nothing may point
//! outside the repository (it must stand alone: a fresh clone is all a
//! learner has). Run it: `cargo xtask test --only files`.
//! Unit tests: xtask/tests/files_check.rs.
//!
//! A "path" here is a word that starts with one of REPO_PREFIXES and ends in
//! a file extension (`src/lib.rs`) or a slash (`tests/dist/`). Placeholders
//! (`tests/chapter_NN.rs`, `src/ch*/`, `src/<chapter>/`, `src/ch{nn}_x/`,
//! `src/.../mod.rs`) are not paths; relative links (`../src/lib.rs`) are left
//! to the `includes` check.

use crate::report::{Outcome, Report};
use crate::Context;
use std::path::Path;
use std::process::Command;

/// Where a mention of a repository path starts.
pub const REPO_PREFIXES: &[&str] = &[
    "src/",
    "tests/",
    "scripts/",
    "examples/",
    "docs/",
    "chapters/",
    "notebooks/",
    "xtask/",
    ".ci/",
    ".cargo/",
];

/// The endings that make a word a file name rather than, say, a module path.
const FILE_EXTENSIONS: &[&str] =
    &["rs", "md", "sh", "py", "ipynb", "toml", "json", "txt", "lock", "css", "yml", "yaml", "cfg", "html"];

/// Folders that hold what the build and set-up write: never in a clone.
const GENERATED_FOLDERS: &[&str] = &["target", "book", ".venv"];

/// One mention of a path: its 1-based line and the path as written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mention {
    pub line: usize,
    pub path: String,
}

/// The words of `text` that look like paths starting with one of `prefixes`
/// (a parameter so that the unit tests can use prefixes of their own).
pub fn mentioned_paths(text: &str, prefixes: &[&str]) -> Vec<Mention> {
    let mut mentions = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let mut on_this_line: Vec<String> = Vec::new();
        for prefix in prefixes {
            for (at, _) in line.match_indices(prefix) {
                if let Some(path) = path_at(line, at) {
                    if !on_this_line.contains(&path) {
                        on_this_line.push(path);
                    }
                }
            }
        }
        mentions.extend(on_this_line.into_iter().map(|path| Mention { line: index + 1, path }));
    }
    mentions
}

fn is_path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/')
}

/// The path that starts at byte `at` of `line`, if the word there is one.
fn path_at(line: &str, at: usize) -> Option<String> {
    let before = &line[..at];
    // Only at the start of a word (or right after `./`): `xtask/src/...`
    // contains `src/` but is not a mention of it.
    let starts_word = |text: &str| !text.chars().next_back().is_some_and(is_path_char);
    if !starts_word(before) && !before.strip_suffix("./").is_some_and(starts_word) {
        return None;
    }
    let rest = &line[at..];
    let len = rest.find(|c: char| !is_path_char(c)).unwrap_or(rest.len());
    let (word, after) = rest.split_at(len);
    let mut after_chars = after.chars();
    let placeholder_follows = match after_chars.next() {
        Some('*' | '{') => true,
        Some('<') => after_chars.next() != Some('/'), // `src/<chapter>/`, but not `src/lib.rs</code>`
        _ => false,
    };
    if placeholder_follows || word.contains("NN") || word.contains("...") {
        return None;
    }
    let path = word.trim_end_matches('.'); // the full stop of a sentence
    let first_folder = path.split('/').next().unwrap_or("");
    if GENERATED_FOLDERS.contains(&first_folder) {
        return None;
    }
    let file_name = path.rsplit('/').next().unwrap_or("");
    let has_extension = file_name
        .rsplit_once('.')
        .is_some_and(|(stem, ext)| !stem.is_empty() && FILE_EXTENSIONS.contains(&ext));
    (path.ends_with('/') || has_extension).then(|| path.to_string())
}

/// Whether `path` (relative to the repository) is one of the text files
/// whose path mentions are checked.
pub fn is_scanned_for_paths(path: &str) -> bool {
    let direct_child = |folder: &str, extension: &str| {
        path.strip_prefix(folder).is_some_and(|rest| !rest.contains('/') && rest.ends_with(extension))
    };
    let under = |folder: &str, extension: &str| path.starts_with(folder) && path.ends_with(extension);
    path == "README.md"
        || path == ".ci/run"
        || direct_child("docs/", ".md")
        || direct_child("chapters/", ".md")
        || direct_child("notebooks/", ".ipynb")
        || direct_child("notebooks/", ".md")
        || direct_child("scripts/", "")
        || direct_child("examples/", ".rs")
        || under("src/", ".rs")
        || under("tests/", ".rs")
        || path.starts_with("xtask/")
}

/// Mentions of files that live outside this repository, which a clone does
/// not have. Spelled in parts, so that this file does not mention them.
pub fn outside_references() -> Vec<String> {
    vec![format!("{}.md", "DESIGN"), format!("{}.md", "SYLLABUS"), format!("../{}", "shared")]
}

/// The lines of `text` that mention one of `references`: (line, reference).
pub fn find_outside_references(text: &str, references: &[String]) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (index, line) in text.lines().enumerate() {
        found.extend(references.iter().filter(|r| line.contains(r.as_str())).map(|r| (index + 1, r.clone())));
    }
    found
}

/// The files a commit would hold: tracked ones and new ones git does not
/// ignore (so a file you have not committed yet is checked before CI sees it).
pub fn repository_files(root: &Path) -> Result<Vec<String>, String> {
    let output = Command::new("git")
        .args(["ls-files", "-z", "--cached", "--others", "--exclude-standard"])
        .current_dir(root)
        .output()
        .map_err(|error| format!("could not run git ls-files: {error}"))?;
    if !output.status.success() {
        return Err(format!("git ls-files failed: {}", String::from_utf8_lossy(&output.stderr).trim()));
    }
    let mut files: Vec<String> = output
        .stdout
        .split(|&b| b == 0)
        .filter(|name| !name.is_empty())
        .map(|name| String::from_utf8_lossy(name).into_owned())
        .collect();
    files.sort();
    files.dedup();
    Ok(files)
}

#[derive(Debug, Default)]
pub struct FilesOutcome {
    pub files_scanned: usize,
    pub paths_checked: usize,
    /// `missing  PATH  (FILE:LINE)`, one per mention.
    pub missing: Vec<String>,
    /// `FILE:LINE mentions NAME`, one per mention.
    pub outside: Vec<String>,
}

pub fn check_files(root: &Path) -> Result<FilesOutcome, String> {
    let references = outside_references();
    let mut outcome = FilesOutcome::default();
    for file in repository_files(root)? {
        let Ok(text) = std::fs::read_to_string(root.join(&file)) else { continue }; // deleted, or not text
        for (line, reference) in find_outside_references(&text, &references) {
            outcome.outside.push(format!("{file}:{line} mentions {reference}"));
        }
        if !is_scanned_for_paths(&file) {
            continue;
        }
        outcome.files_scanned += 1;
        for mention in mentioned_paths(&text, REPO_PREFIXES) {
            outcome.paths_checked += 1;
            if !root.join(&mention.path).exists() {
                outcome.missing.push(format!("missing  {}  ({file}:{})", mention.path, mention.line));
            }
        }
    }
    Ok(outcome)
}

/// The check as the suite runs it: each problem on its own line, then one verdict.
pub fn files(ctx: &Context, report: &mut Report) {
    report.section("files: every path the docs and code mention exists, and none points outside");
    let outcome = match check_files(&ctx.root) {
        Ok(outcome) => outcome,
        Err(problem) => return report.check("files", Outcome::Fail, &problem),
    };
    outcome.missing.iter().for_each(|line| println!("  {line}"));
    for mention in &outcome.outside {
        println!("  outside  {mention}: the repository must stand alone (say it here instead)");
    }
    if outcome.missing.is_empty() && outcome.outside.is_empty() {
        let detail = format!(
            "{} path mentions in {} files, all present",
            outcome.paths_checked, outcome.files_scanned
        );
        report.check("files", Outcome::Ok, &detail);
    } else {
        let detail = format!(
            "{} mentions of missing paths, {} mentions of files outside the repository",
            outcome.missing.len(),
            outcome.outside.len()
        );
        report.check("files", Outcome::Fail, &detail);
    }
}
