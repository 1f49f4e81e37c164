//! The `layering` check. The crate's parts
//! import each other one way only (docs/architecture.md, "The layers"):
//! the process groups know nothing of DDP, the DDP library and the training
//! run never use a chapter, the bottom layer (models, data, comparisons,
//! autograd) uses neither, and a chapter never uses another chapter; and
//! only the chapters and their tests use the workbook's seams
//! (`ddp::seams`: `seams_check.rs`); and no two files of `src/`,
//! `examples/` or `xtask/src/` use each other (`circles.rs`). Run it:
//! `cargo xtask test --only layering`. Unit tests:
//! xtask/tests/layering_check.rs, xtask/tests/layering_circles.rs.
//!
//! What a file "names" is every module of the crate that a path in it
//! reaches: `crate::ddp::..`, `ddp_workbook::ch06_overlap::..`, a group such
//! as `use crate::{dist, ddp::Bucket}`, `super::super::train` (resolved from
//! the file's own module), and a `#[path = "..."]` into a chapter's folder.
//! The file is read as tokens (rust_tokens.rs), so a path wrapped over
//! several lines counts and one in a string or a comment does not; the
//! code blocks of doc comments count too (rustdoc compiles them), their
//! prose does not.

pub mod circles; // part 3: no two sibling files import each other

use std::path::Path;

use proc_macro2::{Delimiter, TokenTree};

use crate::layout::{is_chapter, rust_files_under};
use crate::rust_tokens::{self, levels};

/// A module a rule forbids: one by name, or every chapter.
#[derive(Clone, Copy, Debug)]
pub enum Forbidden {
    Module(&'static str),
    AnyChapter,
}

/// One rule: the files under `under` (a folder or a file, from the
/// repository root) must not name the `forbidden` modules, because `why`.
pub struct Rule {
    pub under: &'static [&'static str],
    pub forbidden: &'static [Forbidden],
    pub why: &'static str,
}

use Forbidden::{AnyChapter, Module};

/// The rules of docs/architecture.md, one per layer. (A chapter naming
/// another chapter is checked apart: its rule depends on the chapter.)
pub const RULES: &[Rule] = &[
    Rule {
        under: &["src/dist"],
        forbidden: &[Module("ddp"), Module("train"), Module("autograd"), Module("notebook"), AnyChapter],
        why: "src/dist/ knows nothing of DDP: it moves tensors between ranks",
    },
    Rule {
        under: &["src/ddp"],
        forbidden: &[Module("train"), Module("notebook"), AnyChapter],
        why: "src/ddp/ is the finished library: it never uses a chapter, the training run or the notebooks' helpers",
    },
    Rule {
        under: &["src/train", "examples"],
        forbidden: &[Module("notebook"), AnyChapter],
        why: "src/train/ and examples/ are what a user of the finished library writes: they never use a chapter",
    },
    Rule {
        under: &[
            "src/autograd",
            "src/models",
            "src/data.rs",
            "src/check.rs",
            "src/seed.rs",
            "src/fingerprint.rs",
            "src/error_text.rs",
        ],
        forbidden: &[Module("dist"), Module("ddp"), Module("train"), Module("notebook"), AnyChapter],
        why: "the bottom layer (models, data, comparisons, seeding, hashing, autograd, error text) uses no layer above it",
    },
];

/// A file allowed to name one chapter's module, and only through `path`.
pub struct Exception {
    pub file: &'static str,
    pub path: &'static str,
    pub why: &'static str,
}

/// The exceptions of docs/architecture.md ("The one exception"). Chapter 1's
/// ring figure runs the reference ring and watches its chunks: the ring's
/// schedule exists nowhere else, and the library does not need a ring.
/// Through `solution`, never `learner`: the figure must not change with the
/// learner's exercise, nor stop at its `todo!()`.
pub const EXCEPTIONS: &[Exception] = &[Exception {
    file: "examples/figures/ch01_ring.rs",
    path: "ch01_collectives::solution",
    why: "chapter 1's ring figure draws the reference ring's steps as they run",
}];

/// What the check found: how many files it read, and each violation as
/// `path:line: ...` (or a circle, `a <-> b: ...`), saying what to do.
#[derive(Debug, Default)]
pub struct LayeringOutcome {
    pub files_scanned: usize,
    pub violations: Vec<String>,
    /// The circle part's counts; its problems are among `violations`.
    pub circles: circles::CirclesOutcome,
}

/// Checks every `.rs` file under `root`'s `src/` and `examples/`, and
/// those of `tests/` for the seams only; then the crates of `src/`,
/// `examples/` and `xtask/src/` for import circles.
pub fn check_layering(root: &Path) -> LayeringOutcome {
    let mut outcome = LayeringOutcome::default();
    for top in ["src", "examples", "tests"] {
        for file in rust_files_under(&root.join(top)) {
            let Ok(text) = std::fs::read_to_string(&file) else { continue };
            let relative = file.strip_prefix(root).unwrap_or(&file).to_string_lossy().replace('\\', "/");
            outcome.files_scanned += 1;
            if top != "tests" {
                outcome.violations.extend(violations_in(&relative, &text));
            }
            outcome.violations.extend(crate::seams_check::seam_violations(&relative, &text));
            outcome.violations.dedup(); // a file that does not lex: said once, not by both parts
        }
    }
    outcome.circles = circles::import_circles(root);
    outcome.violations.extend(outcome.circles.problems.iter().cloned());
    outcome
}

/// The violations of the file at `relative` (from the repository root) whose text is `text`.
pub fn violations_in(relative: &str, text: &str) -> Vec<String> {
    let own = module_path(relative);
    let own_chapter = own.first().filter(|m| is_chapter(m)).cloned();
    let mut found = Vec::new();
    let in_library = relative.starts_with("src/");
    let named = match named_modules(&own, in_library, text) {
        Ok(named) => named,
        Err(error) => {
            return vec![format!(
                "{relative}: cannot be read as Rust tokens ({error}): the layering check needs to read it"
            )]
        }
    };
    for (line, named) in named {
        if own.first() == Some(&named) {
            continue; // a module may name itself
        }
        let excepted = EXCEPTIONS
            .iter()
            .find(|e| e.file == relative && e.path.split("::").next() == Some(named.as_str()));
        if let Some(exception) = excepted {
            let code = text.lines().nth(line - 1).unwrap_or_default();
            if code.matches(named.as_str()).count() != code.matches(exception.path).count() {
                found.push(format!(
                    "{relative}:{line}: names `{named}` other than as `{}`, the only way the exception of \
                     docs/architecture.md allows ({})",
                    exception.path, exception.why
                ));
            }
            continue;
        }
        for rule in RULES.iter().filter(|rule| rule.under.iter().any(|under| is_under(relative, under))) {
            let hit = rule.forbidden.iter().any(|forbidden| match forbidden {
                Module(module) => *module == named,
                AnyChapter => is_chapter(&named),
            });
            if hit {
                found.push(format!(
                    "{relative}:{line}: names `{named}`, but {} (docs/architecture.md)",
                    rule.why
                ));
            }
        }
        if own_chapter.is_some() && is_chapter(&named) {
            found.push(format!(
                "{relative}:{line}: names `{named}`, but a chapter uses the library for what it does not \
                 teach, never another chapter's files (docs/architecture.md): move what both need into \
                 src/ddp/ or src/dist/"
            ));
        }
    }
    found
}

fn is_under(relative: &str, under: &str) -> bool {
    relative == under || relative.strip_prefix(under).is_some_and(|rest| rest.starts_with('/'))
}

/// The module path of a file of `src/` (`src/ddp/reducer/buckets.rs`:
/// `[ddp, reducer, buckets]`; `src/dist/local/mod.rs`: `[dist, local]`); empty elsewhere
/// (examples, the crate root).
pub fn module_path(relative: &str) -> Vec<String> {
    let Some(inside) = relative.strip_prefix("src/") else { return vec![] };
    let mut parts: Vec<String> = inside.trim_end_matches(".rs").split('/').map(str::to_string).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        parts.pop();
    }
    parts
}

/// Each (1-based line, top-level module of the crate) that `text` names,
/// in line order, for a file whose module path is `own` (see the top of
/// this file). In a file outside the library (`in_library` false: an
/// example), `crate::` and `super::` are that program's own modules; only
/// `ddp_workbook::` counts. An error says where `text` does not lex.
pub fn named_modules(own: &[String], in_library: bool, text: &str) -> Result<Vec<(usize, String)>, String> {
    let mut named = Vec::new();
    for code in rust_tokens::lex(text)? {
        for level in levels(&code.tokens) {
            for at in 0..level.len() {
                if let Some(chapter) = path_attribute_chapter(&level, at) {
                    named.push((code.line(level[at].span()), chapter));
                }
                let Some((root, after)) = path_root(&level, at, in_library) else { continue };
                // `super` from [ddp, buckets] is [ddp]: from a file at depth
                // d, d supers reach the crate root; fewer stay inside its
                // own top-level module.
                if matches!(root, PathRoot::Super(count) if count < own.len()) {
                    continue;
                }
                let segments = first_segments(level.get(after));
                named.extend(segments.into_iter().map(|(span, module)| (code.line(span), module)));
            }
        }
    }
    named.sort_by_key(|(line, _)| *line);
    Ok(named)
}

#[derive(Clone, Copy, Debug)]
enum PathRoot {
    /// `crate::` or `ddp_workbook::`: the next segment is a top-level module.
    Crate,
    /// `super::` this many times.
    Super(usize),
}

fn is_ident(tree: Option<&TokenTree>, word: &str) -> bool {
    matches!(tree, Some(TokenTree::Ident(ident)) if ident == word)
}

/// Whether `level[at..]` starts with `::`.
fn is_path_separator(level: &[TokenTree], at: usize) -> bool {
    let colon = |at: usize| matches!(level.get(at), Some(TokenTree::Punct(p)) if p.as_char() == ':');
    colon(at) && colon(at + 1)
}

/// If a path rooted at the library crate starts at `level[at]`: its root,
/// and where the segment after the root's `::` is. A `super::` after
/// another is counted with the first.
fn path_root(level: &[TokenTree], at: usize, in_library: bool) -> Option<(PathRoot, usize)> {
    let roots: &[&str] = if in_library { &["crate", "ddp_workbook", "super"] } else { &["ddp_workbook"] };
    let root = roots.iter().find(|root| is_ident(level.get(at), root))?;
    if !is_path_separator(level, at + 1) {
        return None;
    }
    if *root != "super" {
        return Some((PathRoot::Crate, at + 3));
    }
    if at >= 3 && is_ident(level.get(at - 3), "super") && is_path_separator(level, at - 2) {
        return None;
    }
    let mut count = 1;
    while is_ident(level.get(at + 3 * count), "super") && is_path_separator(level, at + 3 * count + 1) {
        count += 1;
    }
    Some((PathRoot::Super(count), at + 3 * count))
}

/// The module a path's segment is, or those of each item of a group
/// `{a, b::c}`, with where each is (`tch`, `self` and upper-case names are
/// not modules).
fn first_segments(segment: Option<&TokenTree>) -> Vec<(proc_macro2::Span, String)> {
    let module = |tree: &TokenTree| match tree {
        TokenTree::Ident(ident) => {
            let name = ident.to_string();
            let is_module =
                name != "self" && name != "tch" && name.starts_with(|c: char| c.is_ascii_lowercase());
            is_module.then(|| (ident.span(), name))
        }
        _ => None,
    };
    match segment {
        Some(TokenTree::Group(group)) if group.delimiter() == Delimiter::Brace => {
            let items: Vec<TokenTree> = group.stream().into_iter().collect();
            // Each item's first token: the group's first, and each after a comma.
            let starts_an_item =
                |at: usize| at == 0 || matches!(&items[at - 1], TokenTree::Punct(p) if p.as_char() == ',');
            items
                .iter()
                .enumerate()
                .filter(|(at, _)| starts_an_item(*at))
                .filter_map(|(_, tree)| module(tree))
                .collect()
        }
        Some(tree) => module(tree).into_iter().collect(),
        None => vec![],
    }
}

/// The chapter a `#[path = ".."]` at `level[at]` reaches into, if any.
fn path_attribute_chapter(level: &[TokenTree], at: usize) -> Option<String> {
    let is_hash = matches!(level.get(at), Some(TokenTree::Punct(p)) if p.as_char() == '#');
    let Some(TokenTree::Group(brackets)) = level.get(at + 1).filter(|_| is_hash) else { return None };
    let inside: Vec<TokenTree> = brackets.stream().into_iter().collect();
    let [TokenTree::Ident(path), TokenTree::Punct(_), TokenTree::Literal(file)] = inside.as_slice() else {
        return None;
    };
    let syn::Lit::Str(file) = syn::Lit::new(file.clone()) else { return None };
    (path == "path").then(|| file.value().split('/').find(|part| is_chapter(part)).map(str::to_string))?
}

/// The check as the suite runs it: every violation on its own line, then
/// one verdict.
pub fn layering(ctx: &crate::Context, report: &mut crate::report::Report) {
    use crate::report::Outcome;
    report.section(
        "layering: imports go one way (docs/architecture.md): no chapter in the library, no seam outside the \
         chapters, no two files using each other",
    );
    let outcome = check_layering(&ctx.root);
    outcome.violations.iter().for_each(|violation| println!("  {violation}"));
    if outcome.violations.is_empty() {
        let detail = format!(
            "{} files of src/, examples/ and tests/ keep the layers; {} crates ({} files) have no new import \
             circle ({} known, listed in xtask/src/layering_check/circles.rs)",
            outcome.files_scanned,
            outcome.circles.crates,
            outcome.circles.files,
            outcome.circles.known.len()
        );
        report.check("layering", Outcome::Ok, &detail);
    } else {
        let detail =
            format!("{} imports against the layers or in a circle (above)", outcome.violations.len());
        report.check("layering", Outcome::Fail, &detail);
    }
}
