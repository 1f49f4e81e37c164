//! xtask/src/workbook/verdict.rs: a chapter's test run, told to a learner:
//! which of the chapter's claims hold, what the first failure says, and what
//! to do next. Unit tests: xtask/tests/workbook.rs.

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

/// The verdict, as lines to print.
pub fn describe(chapter: &Chapter, tally: &SuiteTally) -> Vec<String> {
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
    let detailed = most_telling_failure(tally);
    for (index, (name, output)) in tally.failures.iter().enumerate() {
        lines.push(format!("  ✗ {}", claim(name)));
        // One failure in full (its panic message, without the backtrace);
        // the others by name, to keep the screen readable.
        if Some(index) == detailed && unwritten.is_empty() {
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
    }
    lines
}

/// Which failure to show in full: the first that is not a negative control.
/// A control shows what breaks when a rule is broken; when it fails, the
/// test of the rule itself says better what is wrong.
pub fn most_telling_failure(tally: &SuiteTally) -> Option<usize> {
    let control = |name: &str| is_control(name) || name.contains("negative_control");
    tally.failures.iter().position(|(name, _)| !control(name)).or((!tally.failures.is_empty()).then_some(0))
}

/// The compiler's warnings about the chapter's own files (the learner's
/// code), from a build's rendered warnings.
pub fn warnings_in_chapter<'a>(chapter: &Chapter, warnings: &'a [String]) -> Vec<&'a str> {
    let folder = format!("src/ch{}_", chapter.number);
    warnings.iter().filter(|w| w.contains(&folder)).map(String::as_str).collect()
}
