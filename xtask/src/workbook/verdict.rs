//! xtask/src/workbook/verdict.rs: a chapter's test run, told to a learner:
//! which of the chapter's claims hold, what the first failure says, and what
//! to do next. Unit tests: xtask/tests/workbook.rs.

use super::Chapter;
use crate::libtest_json::{failure_excerpt, SuiteTally};

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

/// The verdict, as lines to print.
pub fn describe(chapter: &Chapter, tally: &SuiteTally) -> Vec<String> {
    let total = tally.passed + tally.failed;
    let mut lines = vec![format!(
        "chapter {} · {}: {} of {total} claims hold",
        chapter.number, chapter.title, tally.passed
    )];
    let mut passed = tally.passed_names.clone();
    passed.sort();
    lines.extend(passed.iter().map(|name| format!("  ✓ {}", claim(name))));
    let unwritten = unwritten_in(chapter, tally);
    for (index, (name, output)) in tally.failures.iter().enumerate() {
        lines.push(format!("  ✗ {}", claim(name)));
        // The first failure in full (its panic message, without the
        // backtrace); the others by name, to keep the screen readable.
        if index == 0 && unwritten.is_empty() {
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
