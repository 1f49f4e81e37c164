//! The part of the `layering` check that fences
//! the workbook's seams (`src/ddp/seams.rs`, docs/architecture.md). Only the
//! chapters and their own tests may use `ddp::seams`, by path or by one of
//! its doors (the functions that run a learner's function inside library
//! machinery, and `backward_local`, a backward that syncs nothing). The
//! library, the training run, the examples and the other tests never do:
//! a finished-library user who found `backward_local` would skip the sync
//! silently. Run it: `cargo xtask test --only layering`. Unit tests:
//! xtask/tests/layering_check.rs.

use proc_macro2::{Delimiter, Span, TokenTree};

use crate::rust_tokens::{self, levels};

/// The doors of `ddp::seams`: a call of one of these names a seam even
/// where the path `ddp::seams` is not written (an inherent method is
/// callable without importing the module that defines it).
/// `with_steps` is the door of chapters 6, 11 and 13 alike (`ReducerWithSteps`,
/// `ZeroWithSteps`, `GradOpWithSteps`); chapter 14's are the two
/// `FsdpWithSchedule` constructors.
pub const SEAM_DOORS: &[&str] = &[
    "with_replica_check",
    "backward_local",
    "no_sync_with",
    "plan_with",
    "sync_with",
    "with_steps",
    "gpt_with_schedule",
    "mlp_with_schedule",
];

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

/// Each (1-based line, what it names) where `text` uses the seams, in line
/// order: the path `seams` after `ddp::` (alone, or an item of a group
/// `ddp::{.., seams, ..}`, over several lines too) or after `super::`, or a
/// door called as a function or method. The code blocks of doc comments
/// count (a user copies them); comments, the prose of doc comments and
/// strings do not. An error says where `text` does not lex.
pub fn seam_uses(text: &str) -> Result<Vec<(usize, String)>, String> {
    let mut found = Vec::new();
    for code in rust_tokens::lex(text)? {
        for level in levels(&code.tokens) {
            for (at, tree) in level.iter().enumerate() {
                let TokenTree::Ident(ident) = tree else { continue };
                if let Some(seams) = names_seams(&level, at) {
                    found.push((code.line(seams), "ddp::seams".to_string()));
                }
                if let Some(door) = SEAM_DOORS.iter().find(|door| ident == *door) {
                    if is_called(&level, at + 1) {
                        found.push((code.line(ident.span()), format!("ddp::seams' `{door}`")));
                    }
                }
            }
        }
    }
    found.sort_by_key(|(line, _)| *line);
    Ok(found)
}

/// Where `seams` is if `level[at]` starts `ddp::seams`, `super::seams` or a
/// group `ddp::{..}` one of whose items starts with `seams`.
fn names_seams(level: &[TokenTree], at: usize) -> Option<Span> {
    let seams = |tree: &TokenTree| match tree {
        TokenTree::Ident(ident) if ident == "seams" => Some(ident.span()),
        _ => None,
    };
    let is_colon = |at: usize| matches!(level.get(at), Some(TokenTree::Punct(p)) if p.as_char() == ':');
    let TokenTree::Ident(root) = level.get(at)? else { return None };
    if !(root == "ddp" || root == "super") || !(is_colon(at + 1) && is_colon(at + 2)) {
        return None;
    }
    match level.get(at + 3)? {
        TokenTree::Group(group) if root == "ddp" && group.delimiter() == Delimiter::Brace => {
            let items: Vec<TokenTree> = group.stream().into_iter().collect();
            let starts_an_item =
                |at: usize| at == 0 || matches!(&items[at - 1], TokenTree::Punct(p) if p.as_char() == ',');
            items.iter().enumerate().filter(|(at, _)| starts_an_item(*at)).find_map(|(_, tree)| seams(tree))
        }
        next => seams(next),
    }
}

/// Whether what follows a name at `level[at]` calls it: `(..)` or `::<`.
fn is_called(level: &[TokenTree], at: usize) -> bool {
    let is_punct =
        |at: usize, c: char| matches!(level.get(at), Some(TokenTree::Punct(p)) if p.as_char() == c);
    matches!(level.get(at), Some(TokenTree::Group(g)) if g.delimiter() == Delimiter::Parenthesis)
        || (is_punct(at, ':') && is_punct(at + 1, ':') && is_punct(at + 2, '<'))
}

/// The violations of the file at `relative` whose text is `text`.
pub fn seam_violations(relative: &str, text: &str) -> Vec<String> {
    if may_use_seams(relative) {
        return vec![];
    }
    let uses = match seam_uses(text) {
        Ok(uses) => uses,
        Err(error) => {
            return vec![format!(
                "{relative}: cannot be read as Rust tokens ({error}): the layering check needs to read it"
            )]
        }
    };
    uses.into_iter()
        .map(|(line, named)| {
            format!(
                "{relative}:{line}: uses {named}, but the seams are the chapters' only (src/ddp/seams.rs, \
                 docs/architecture.md): the library, the training run, examples and other tests use the \
                 finished API (`backward` syncs; `new`, `plan`, `sync`, `no_sync` take no function)"
            )
        })
        .collect()
}
