//! A chapter's test run, told to a learner:
//! which of the chapter's claims hold, what the most telling failure says
//! (`ranking.rs` chooses it), and what to do next. Unit tests:
//! xtask/tests/workbook.rs.

use super::ranking::{rank_failures, Pointing, RankedFailure};
use super::Chapter;
use crate::libtest_json::{failure_excerpt, SuiteTally};
use crate::teeth_check::is_control;

/// A test's name as the claim it checks: `sampler::every_epoch_is_new`
/// becomes "every epoch is new (sampler)".
pub fn claim(test_name: &str) -> String {
    let (module, name) = match test_name.rsplit_once("::") {
        Some((module, name)) => (Some(module), name),
        None => (None, test_name),
    };
    let sentence = name.replace('_', " ");
    match module {
        Some(module) => format!("{sentence} ({})", module.replace("::", " / ")),
        None => sentence,
    }
}

/// The exercises of `chapter` that a failure's output says are not written.
pub fn unwritten_in(chapter: &Chapter, tally: &SuiteTally) -> Vec<String> {
    let marker = |f: &String| format!("exercise ch{}: {f} ", chapter.number);
    chapter.exercises.iter().filter(|f| tally.output_contains(&marker(f))).cloned().collect()
}

/// How many of the chapter's claims about the learner's code hold, of how
/// many: the controls (tests in a `mod controls`, which never run the
/// learner's code and pass even on the stubs) are not claims about it.
pub fn claims_holding(tally: &SuiteTally) -> (usize, usize) {
    let held = tally.passed_names.iter().filter(|name| !is_control(name)).count();
    let failed = tally.failures.iter().filter(|(name, _)| !is_control(name)).count();
    (held, held + failed)
}

/// Whether a chapter's tests say the learner is done: the run finished (no
/// crash cut it short), no test failed, and at least one claim about the
/// learner's code ran and held. Only then does `cargo workbook` offer the
/// reference solution.
pub fn chapter_passes(tally: &SuiteTally) -> bool {
    let (held, total) = claims_holding(tally);
    tally.finished && tally.failed == 0 && tally.running.is_empty() && total > 0 && held == total
}

/// What to do after a run, as lines to print: once the chapter passes,
/// compare with the reference solution (`solution_page`, the book's page of
/// it, and the chapter's `solution.rs`, both relative to the repository
/// root) and go on; before, the next hint, and never the solution.
pub fn next_step(chapter: &Chapter, tally: &SuiteTally, solution_page: Option<&str>) -> Vec<String> {
    let number = &chapter.number;
    if chapter_passes(tally) {
        let code = chapter.folder.join("solution.rs");
        let code = code.strip_prefix(crate::repo_root()).unwrap_or(&code).display().to_string();
        let mut lines =
            vec![format!("Every claim of chapter {number} holds. Compare with the reference solution:")];
        if let Some(page) = solution_page {
            lines.push(format!("the book's page after the chapter, {page}"));
        }
        lines.push(format!("(the code: {code}); then go on."));
        return lines;
    }
    let mut lines = Vec::new();
    if !tally.finished || !tally.running.is_empty() {
        let running: Vec<&str> = tally.running.iter().map(String::as_str).collect();
        lines.push(format!(
            "The run ended before every test finished (still running: {}): a crash or a kill, not a \
             verdict; the log above says what stopped it.",
            if running.is_empty() { "none named".to_string() } else { running.join(", ") }
        ));
    }
    lines.push(format!("Stuck? `cargo workbook hint {number}` shows the next hint."));
    lines
}

/// The verdict, as lines to print, with the `shown`-th most telling
/// failure (from 1; see `ranking.rs`) in full and the others by name.
pub fn describe(chapter: &Chapter, tally: &SuiteTally, shown: usize) -> Vec<String> {
    let (held, total) = claims_holding(tally);
    let mut lines =
        vec![format!("chapter {} · {}: {held} of {total} claims hold", chapter.number, chapter.title)];
    let mut passed: Vec<&String> = tally.passed_names.iter().filter(|name| !is_control(name)).collect();
    passed.sort();
    lines.extend(passed.iter().map(|name| format!("  ✓ {}", claim(name))));
    let controls = tally.passed_names.len() - passed.len();
    let they_pass = match controls {
        0 => None,
        1 => Some("1 control passes".to_string()),
        count => Some(format!("{count} controls pass")),
    };
    if let Some(they_pass) = they_pass {
        lines.push(format!("  ({they_pass} too: controls check the tests themselves, not your code)"));
    }
    let unwritten = unwritten_in(chapter, tally);
    let ranked = rank_failures(chapter, tally);
    for (place, failure) in ranked.iter().enumerate() {
        let (name, output) = &tally.failures[failure.index];
        lines.push(format!("  ✗ {}. {}", place + 1, claim(name)));
        // One failure in full (its panic message, without the backtrace);
        // the others by name, to keep the screen readable.
        if place + 1 == shown && unwritten.is_empty() {
            lines.extend(failure_excerpt(output, 12).lines().map(|l| format!("      {l}")));
        }
    }
    if !unwritten.is_empty() {
        lines.push(format!(
            "not written yet: {} in {} (each still holds its todo!)",
            unwritten.join(", "),
            chapter
                .exercise_file()
                .strip_prefix(crate::repo_root())
                .unwrap_or(&chapter.exercise_file())
                .display()
        ));
    } else if let Some(failure) = ranked.get(shown.saturating_sub(1)) {
        lines.push(which_failure_is_shown(chapter, failure, shown, ranked.len()));
    } else if !ranked.is_empty() {
        lines.push(format!("there are {} failures: ask for one of 1 to {}", ranked.len(), ranked.len()));
    }
    lines
}

/// Why failure `shown` of `count` is the one in full, and how to see the next.
fn which_failure_is_shown(chapter: &Chapter, failure: &RankedFailure, shown: usize, count: usize) -> String {
    let why = match (&failure.function, failure.pointing) {
        (Some(function), Pointing::SaysYour | Pointing::NamedAfter | Pointing::Mentions) if shown == 1 => {
            format!(", the one that points at your code most directly: start with `{function}`")
        }
        (None, Pointing::Symptom) if shown == 1 => {
            ": no failure names one of your functions, so start from this symptom".to_string()
        }
        _ => String::new(),
    };
    let next = if shown < count {
        format!("; `cargo workbook test {} {}` shows the next", chapter.number, shown + 1)
    } else {
        String::new()
    };
    format!("failure {shown} of {count} is shown in full{why}{next}")
}

/// The compiler's warnings about the chapter's own files (the learner's
/// code), from a build's rendered warnings.
pub fn warnings_in_chapter<'a>(chapter: &Chapter, warnings: &'a [String]) -> Vec<&'a str> {
    let folder = format!("src/ch{}_", chapter.number);
    warnings.iter().filter(|w| w.contains(&folder)).map(String::as_str).collect()
}
