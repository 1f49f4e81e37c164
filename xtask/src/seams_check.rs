//! The part of the `layering` check that fences
//! the workbook's seams (`src/ddp/seams.rs`, docs/architecture.md). Only the
//! chapters and their own tests may use `ddp::seams`, by path or by one of
//! its doors (the functions that run a learner's function inside library
//! machinery, and `backward_local`, a backward that syncs nothing). The
//! library, the training run, the examples and the other tests never do:
//! a finished-library user who found `backward_local` would skip the sync
//! silently. Run it: `cargo xtask test --only layering`. Unit tests:
//! xtask/tests/layering_check.rs.

/// The doors of `ddp::seams`: a call of one of these names a seam even
/// where the path `ddp::seams` is not written (an inherent method is
/// callable without importing the module that defines it).
pub const SEAM_DOORS: &[&str] =
    &["with_replica_check", "backward_local", "no_sync_with", "plan_with", "sync_with", "with_steps"];

/// Files outside the chapters that may use the seams, and why.
pub const SEAM_EXCEPTIONS: &[(&str, &str)] = &[
    ("src/ddp/seams.rs", "the seams themselves"),
    ("tests/mpi/chapters.rs", "it runs the chapters' stages over MPI"),
    (
        "examples/bench_overlap.rs",
        "it times chapter 6's way (gradients copied into the buckets and back) against the library's",
    ),
    ("examples/support/copying_steps.rs", "chapter 6's copying steps, for bench_overlap.rs"),
];

/// Whether the file at `relative` (from the repository root) may use the
/// seams: a chapter's module (`src/chNN_*/`), a chapter's tests
/// (`tests/chapter_NN.rs`, `tests/chapter_NN/`), or an exception above.
pub fn may_use_seams(relative: &str) -> bool {
    let chapter_folder = |rest: &str| rest.split('/').next().is_some_and(crate::layout::is_chapter);
    let chapter_test = |rest: &str| {
        let first = rest.split('/').next().unwrap_or("").trim_end_matches(".rs");
        first.strip_prefix("chapter_").is_some_and(|n| n.len() == 2 && n.bytes().all(|b| b.is_ascii_digit()))
    };
    relative.strip_prefix("src/").is_some_and(chapter_folder)
        || relative.strip_prefix("tests/").is_some_and(chapter_test)
        || SEAM_EXCEPTIONS.iter().any(|(path, _)| *path == relative)
}

/// Each (1-based line, what it names) where `text` uses the seams: the path
/// `seams` after `ddp::` (alone, `ddp::{.., seams, ..}`, or `super::seams`
/// inside `src/ddp/`), or a door called as a function or method. Comments,
/// doc comments included, are prose here: the seams' own doc tests are the
/// only ones that use them.
pub fn seam_uses(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        if path_names_seams(code) {
            found.push((index + 1, "ddp::seams".to_string()));
        }
        for door in SEAM_DOORS {
            if calls(code, door) {
                found.push((index + 1, format!("ddp::seams' `{door}`")));
            }
        }
    }
    found
}

/// `seams` as a path segment: `ddp::seams`, `super::seams`, or an item of
/// a group opened by `ddp::{`.
fn path_names_seams(code: &str) -> bool {
    let words = whole_words(code, "seams");
    words.iter().any(|&at| {
        let before = code[..at].trim_end();
        before.ends_with("ddp::")
            || before.ends_with("super::")
            || (before.ends_with('{') || before.ends_with(',')) && code[..at].contains("ddp::{")
    })
}

/// Whether `code` calls `name`: the whole word, then `(` (a call) or `::<`.
fn calls(code: &str, name: &str) -> bool {
    whole_words(code, name).into_iter().any(|at| {
        let after = code[at + name.len()..].trim_start();
        after.starts_with('(') || after.starts_with("::<")
    })
}

/// Where `word` occurs in `code` as a whole identifier.
fn whole_words(code: &str, word: &str) -> Vec<usize> {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    code.match_indices(word)
        .filter(|(at, _)| {
            let before = code[..*at].chars().next_back();
            let after = code[at + word.len()..].chars().next();
            !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
        })
        .map(|(at, _)| at)
        .collect()
}

/// The violations of the file at `relative` whose text is `text`.
pub fn seam_violations(relative: &str, text: &str) -> Vec<String> {
    if may_use_seams(relative) {
        return vec![];
    }
    seam_uses(text)
        .into_iter()
        .map(|(line, named)| {
            format!(
                "{relative}:{line}: uses {named}, but the seams are the chapters' only (src/ddp/seams.rs, \
                 docs/architecture.md): the library, the training run, examples and other tests use the \
                 finished API (`backward` syncs; `new`, `plan`, `sync`, `no_sync` take no function)"
            )
        })
        .collect()
}
