//! The graded hints of a chapter, read from
//! `src/chNN_*/hints.md`, where each hint sits between
//! `<!-- ANCHOR: <function>-<n> -->` and `<!-- ANCHOR_END: <function>-<n> -->`
//! (the book includes the same blocks, collapsed), and which of them the
//! learner has already seen. Unit tests: xtask/tests/workbook.rs.

use crate::book_includes::find_links;
use crate::report::{Outcome, Report};
use crate::Context;
use std::path::{Path, PathBuf};

/// One hint: for which exercise, which step (1 = the idea, then the API,
/// then near-code), and its Markdown text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hint {
    pub function: String,
    pub step: usize,
    pub text: String,
}

/// Every hint of a hints file's text, in file order.
pub fn parse(text: &str) -> Vec<Hint> {
    let mut hints = Vec::new();
    let mut open: Option<(String, usize, Vec<&str>)> = None;
    for line in text.lines() {
        let marker = line.trim().strip_prefix("<!--").and_then(|l| l.strip_suffix("-->")).map(str::trim);
        match marker {
            Some(m) if m.starts_with("ANCHOR:") => {
                let name = m["ANCHOR:".len()..].trim();
                if let Some((function, step)) = name.rsplit_once('-') {
                    if let Ok(step) = step.parse() {
                        open = Some((function.to_string(), step, Vec::new()));
                    }
                }
            }
            Some(m) if m.starts_with("ANCHOR_END:") => {
                if let Some((function, step, lines)) = open.take() {
                    hints.push(Hint { function, step, text: lines.join("\n").trim().to_string() });
                }
            }
            _ => {
                if let Some((_, _, lines)) = open.as_mut() {
                    lines.push(line);
                }
            }
        }
    }
    hints
}

/// How many hints of each exercise the learner has seen, kept in
/// `target/workbook/hints-seen.txt` as lines `NN function count`.
pub struct Seen {
    file: PathBuf,
    entries: Vec<(String, String, usize)>,
}

impl Seen {
    pub fn load(root: &Path) -> Seen {
        let file = root.join("target").join("workbook").join("hints-seen.txt");
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let entries = text
            .lines()
            .filter_map(|line| {
                let mut parts = line.split_whitespace();
                Some((parts.next()?.to_string(), parts.next()?.to_string(), parts.next()?.parse().ok()?))
            })
            .collect();
        Seen { file, entries }
    }

    pub fn count(&self, chapter: &str, function: &str) -> usize {
        self.entries.iter().find(|(c, f, _)| c == chapter && f == function).map_or(0, |e| e.2)
    }

    /// Records that hint `step` of `function` has been shown.
    pub fn saw(&mut self, chapter: &str, function: &str, step: usize) -> std::io::Result<()> {
        match self.entries.iter_mut().find(|(c, f, _)| c == chapter && f == function) {
            Some(entry) => entry.2 = entry.2.max(step),
            None => self.entries.push((chapter.to_string(), function.to_string(), step)),
        }
        if let Some(folder) = self.file.parent() {
            std::fs::create_dir_all(folder)?;
        }
        let text: String = self.entries.iter().map(|(c, f, n)| format!("{c} {f} {n}\n")).collect();
        std::fs::write(&self.file, text)
    }
}

/// The hint to show next: for the first exercise in `order` whose hints are
/// not all seen, the one after the last seen; `None` when all were shown.
pub fn next<'a>(hints: &'a [Hint], order: &[String], seen: impl Fn(&str) -> usize) -> Option<&'a Hint> {
    order.iter().find_map(|function| {
        let shown = seen(function);
        hints.iter().find(|h| &h.function == function && h.step == shown + 1)
    })
}

/// The `hints` check: every exercise of every chapter has exactly the hints
/// 1, 2, 3, none of them empty, and the chapter's book page includes each
/// one; the page shows no answer (`spoilers`). Returns the number of hints
/// and the problems found.
pub fn check_all(root: &Path) -> Result<(usize, Vec<String>), String> {
    let chapters = super::chapters(root).map_err(|e| format!("cannot read the chapters: {e}"))?;
    let mut problems = Vec::new();
    let mut count = 0;
    for chapter in &chapters {
        let file = chapter.hints_file();
        let Ok(text) = std::fs::read_to_string(&file) else {
            problems.push(format!("chapter {}: no {}", chapter.number, file.display()));
            continue;
        };
        let hints = parse(&text);
        let page = page_text(root, &chapter.number);
        for function in &chapter.exercises {
            let own: Vec<&Hint> = hints.iter().filter(|h| &h.function == function).collect();
            let steps: Vec<usize> = own.iter().map(|h| h.step).collect();
            let empty: Vec<usize> = own.iter().filter(|h| h.text.is_empty()).map(|h| h.step).collect();
            if steps != [1, 2, 3] {
                problems.push(format!(
                    "chapter {}: `{function}` has hints {steps:?}; give it exactly 1, 2, 3 \
                     (the idea, the API, near-code)",
                    chapter.number
                ));
            } else if !empty.is_empty() {
                problems.push(format!(
                    "chapter {}: `{function}`'s hints {empty:?} are empty: write them",
                    chapter.number
                ));
            }
            for step in steps {
                count += 1;
                let anchor = format!("hints.md:{function}-{step}}}}}");
                if !page.contains(&anchor) {
                    problems.push(format!(
                        "chapter {}: its page does not show hint {step} of `{function}`",
                        chapter.number
                    ));
                }
            }
        }
        problems.extend(spoilers(root, chapter, &page));
    }
    Ok((count, problems))
}

/// Where chapter `chapter`'s page (`page`, its text) shows the answer to its
/// own exercise: an include of the chapter's `solution.rs`, or of an anchor
/// named after one of its exercises from any file but `exercise.rs` (the
/// library's answers carry their function's name). The reference belongs on
/// the chapter's `-solution.md` page, which must exist: a learner reads the
/// chapter on the way to the exercise, and the solution page once it passes.
pub fn spoilers(root: &Path, chapter: &super::Chapter, page: &str) -> Vec<String> {
    let number = &chapter.number;
    let folder = chapter.folder.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let mut problems = Vec::new();
    for link in find_links(page).iter().filter(|link| link.kind == "include") {
        let target = link.target.split_whitespace().next().unwrap_or_default();
        let (path, anchor) = target.split_once(':').unwrap_or((target, ""));
        let own_solution = path.ends_with(&format!("{folder}/solution.rs"));
        let an_answer = chapter.exercises.iter().any(|f| f == anchor) && !path.ends_with("/exercise.rs");
        if own_solution || an_answer {
            problems.push(format!(
                "chapter {number}: its page shows the answer at its line {} ({}): move it to the \
                 chapter's reference solution page, chapters/{number}-*-solution.md",
                link.line, link.text
            ));
        }
    }
    if super::solution_page(root, number).is_none() {
        problems.push(format!(
            "chapter {number}: no reference solution page: write chapters/{number}-*-solution.md, \
             and list it under the chapter in chapters/SUMMARY.md"
        ));
    }
    problems
}

/// The text of the book page `chapters/NN-*.md`, not its solution page
/// (empty if there is none).
fn page_text(root: &Path, number: &str) -> String {
    super::chapter_page(root, number).and_then(|p| std::fs::read_to_string(p).ok()).unwrap_or_default()
}

/// The `hints` check as the suite runs it: each problem on its own line,
/// then one verdict.
pub fn suite_check(ctx: &Context, report: &mut Report) {
    report.section(
        "hints: every exercise has exactly three graded hints, and the book shows them, not the answer",
    );
    match check_all(&ctx.root) {
        Ok((count, problems)) if problems.is_empty() => {
            report.check("hints", Outcome::Ok, &format!("{count} hints, each in its chapter's page"))
        }
        Ok((_, problems)) => {
            problems.iter().for_each(|problem| println!("  {problem}"));
            report.check("hints", Outcome::Fail, &format!("{} problems (above)", problems.len()));
        }
        Err(error) => report.check("hints", Outcome::Fail, &error),
    }
}
