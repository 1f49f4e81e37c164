//! Which of a chapter's failures `cargo
//! workbook test` shows first. A wrong function makes several tests fail,
//! and the one that failed first is often a test of another function that
//! calls it (a wrong `open_no_sync` breaks `accumulate_and_step`'s test
//! too). So failures are ranked by how directly they point at the learner's
//! code, and among equals by the exercise's order, which goes from the
//! function the others build on to the ones that use it.
//! Unit tests: xtask/tests/workbook_ranking.rs (`cargo test -p xtask`).

use super::Chapter;
use crate::libtest_json::SuiteTally;
use crate::teeth_check::is_control;

/// How directly a failure points at the learner's code, the most direct
/// first (the order of the variants is the order of the ranking).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Pointing {
    /// Its message says "your <function>": a test's diagnosis of that function.
    SaysYour,
    /// The test is named after a function: it tries that function alone.
    NamedAfter,
    /// Its message mentions a function by name.
    Mentions,
    /// It names none of them: a symptom (replicas apart, a step off).
    Symptom,
    /// A control, or a negative control: it shows what a broken rule does,
    /// and the rule's own test says better what is wrong.
    Control,
}

/// One failure of the run, ranked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankedFailure {
    /// Its position in `SuiteTally::failures`.
    pub index: usize,
    pub pointing: Pointing,
    /// The exercise function it points at (the first in exercise order).
    pub function: Option<String>,
}

/// Whether `text` holds `word` with no identifier character right after it
/// (nor right before it, when `whole` is set).
fn holds_word(text: &str, word: &str, whole: bool) -> bool {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    text.match_indices(word).any(|(at, _)| {
        let after = text[at + word.len()..].chars().next().is_none_or(|c| !ident(c));
        let before = !whole || text[..at].chars().next_back().is_none_or(|c| !ident(c));
        after && before
    })
}

/// Whether a failure names an exercise function, one way.
type NamesFunction<'a> = dyn Fn(&str) -> bool + 'a;

/// How the failure of test `name`, whose output is `output`, points at one
/// of `exercises` (in exercise order).
pub fn pointing(exercises: &[String], name: &str, output: &str) -> (Pointing, Option<String>) {
    if is_control(name) || name.contains("negative_control") {
        return (Pointing::Control, None);
    }
    let test_function = name.rsplit("::").next().unwrap_or(name);
    let checks: [(Pointing, &NamesFunction); 3] = [
        (Pointing::SaysYour, &|f| holds_word(output, &format!("your {f}"), false)),
        (Pointing::NamedAfter, &|f| {
            test_function.starts_with(f) || test_function.contains(&format!("_{f}_"))
        }),
        (Pointing::Mentions, &|f| holds_word(output, f, true)),
    ];
    for (level, names) in checks {
        if let Some(function) = exercises.iter().find(|f| names(f)) {
            return (level, Some(function.clone()));
        }
    }
    (Pointing::Symptom, None)
}

/// The chapter's failures, the most telling first: by how directly they
/// point, then by the exercise order of the function they point at, then
/// in the order they failed.
pub fn rank_failures(chapter: &Chapter, tally: &SuiteTally) -> Vec<RankedFailure> {
    let mut ranked: Vec<RankedFailure> = tally
        .failures
        .iter()
        .enumerate()
        .map(|(index, (name, output))| {
            let (pointing, function) = pointing(&chapter.exercises, name, output);
            RankedFailure { index, pointing, function }
        })
        .collect();
    let order = |f: &Option<String>| {
        f.as_ref().and_then(|f| chapter.exercises.iter().position(|e| e == f)).unwrap_or(usize::MAX)
    };
    ranked.sort_by_key(|r| (r.pointing, order(&r.function), r.index));
    ranked
}
