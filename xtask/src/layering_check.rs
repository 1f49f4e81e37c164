//! The `layering` check. The crate's parts
//! import each other one way only (docs/architecture.md, "The layers"):
//! the process groups know nothing of DDP, the DDP library and the training
//! run never use a chapter, the bottom layer (models, data, comparisons,
//! autograd) uses neither, and a chapter never uses another chapter; and
//! only the chapters and their tests use the workbook's seams
//! (`ddp::seams`: `seams_check.rs`). Run it: `cargo xtask test --only
//! layering`. Unit tests: xtask/tests/layering_check.rs.
//!
//! What a file "names" is every module of the crate that a path in it
//! reaches: `crate::ddp::..`, `ddp_workbook::ch06_overlap::..`, a group such
//! as `use crate::{dist, ddp::Bucket}`, `super::super::train` (resolved from
//! the file's own module), and a `#[path = "..."]` into a chapter's folder.
//! Doc comments count too (their examples are compiled); prose without such
//! a path does not.

use std::path::Path;

use crate::layout::{is_chapter, rust_files_under};

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
/// `path:line: ...`, saying what to do.
#[derive(Debug, Default)]
pub struct LayeringOutcome {
    pub files_scanned: usize,
    pub violations: Vec<String>,
}

/// Checks every `.rs` file under `root`'s `src/` and `examples/`, and
/// those of `tests/` for the seams only.
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
        }
    }
    outcome
}

/// The violations of the file at `relative` (from the repository root) whose text is `text`.
pub fn violations_in(relative: &str, text: &str) -> Vec<String> {
    let own = module_path(relative);
    let own_chapter = own.first().filter(|m| is_chapter(m)).cloned();
    let mut found = Vec::new();
    let in_library = relative.starts_with("src/");
    for (line, named) in named_modules(&own, in_library, text) {
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

/// The module path of a file of `src/` (`src/ddp/buckets.rs`: `[ddp,
/// buckets]`; `src/dist/local/mod.rs`: `[dist, local]`); empty elsewhere
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
/// for a file whose module path is `own` (see the top of this file). In a
/// file outside the library (`in_library` false: an example), `crate::` and
/// `super::` are that program's own modules; only `ddp_workbook::` counts.
pub fn named_modules(own: &[String], in_library: bool, text: &str) -> Vec<(usize, String)> {
    let mut named = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let code = match line.trim_start() {
            // Plain comments are prose; doc comments hold compiled examples.
            rest if rest.starts_with("//") && !rest.starts_with("///") && !rest.starts_with("//!") => {
                continue
            }
            rest => rest,
        };
        if code.starts_with("#[path") {
            if let Some(chapter) = code.split(['/', '"']).find(|part| is_chapter(part)) {
                named.push((index + 1, chapter.to_string()));
            }
        }
        for (at, root) in path_roots(code, in_library) {
            let rest = &code[at..];
            let modules = match root {
                PathRoot::Crate => first_segments(rest),
                PathRoot::Super(count) => {
                    // `super` from [ddp, buckets] is [ddp]: from a file at
                    // depth d, d supers reach the crate root.
                    if count < own.len() {
                        vec![] // still inside its own top-level module
                    } else {
                        first_segments(rest)
                    }
                }
            };
            named.extend(modules.into_iter().map(|module| (index + 1, module)));
        }
    }
    named
}

#[derive(Clone, Copy, Debug)]
enum PathRoot {
    /// `crate::` or `ddp_workbook::`: the next segment is a top-level module.
    Crate,
    /// `super::` this many times.
    Super(usize),
}

/// Where each path rooted at the library crate starts in `code` (just
/// after its root's `::`), and which root it has.
fn path_roots(code: &str, in_library: bool) -> Vec<(usize, PathRoot)> {
    let mut roots = Vec::new();
    let bytes = code.as_bytes();
    let starts_word =
        |at: usize| at == 0 || !(bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_');
    let prefixes: &[&str] =
        if in_library { &["crate::", "ddp_workbook::", "super::"] } else { &["ddp_workbook::"] };
    for &prefix in prefixes {
        for (at, _) in code.match_indices(prefix) {
            if !starts_word(at) || (prefix == "super::" && at >= 7 && &code[at - 7..at] == "super::") {
                continue; // a later `super::` of a chain, counted with its first
            }
            let mut end = at + prefix.len();
            let root = if prefix == "super::" {
                let mut count = 1;
                while code[end..].starts_with("super::") {
                    count += 1;
                    end += "super::".len();
                }
                PathRoot::Super(count)
            } else {
                PathRoot::Crate
            };
            roots.push((end, root));
        }
    }
    roots
}

/// The first segment of the path that starts `rest`, or of each item of a
/// group `{a, b::c}` (`tch`, `self` and upper-case names are not modules).
fn first_segments(rest: &str) -> Vec<String> {
    let items: Vec<&str> = match rest.strip_prefix('{') {
        Some(group) => {
            let (mut depth, mut end) = (0, group.len());
            for (at, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        end = at;
                        break;
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            top_level_items(&group[..end])
        }
        None => vec![rest],
    };
    items
        .into_iter()
        .map(|item| {
            item.trim_start().chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect()
        })
        .filter(|segment: &String| {
            !segment.is_empty()
                && segment != "self"
                && segment != "tch"
                && segment.starts_with(|c: char| c.is_ascii_lowercase())
        })
        .collect()
}

/// The comma-separated items of a group's inside, nested groups kept whole.
fn top_level_items(inside: &str) -> Vec<&str> {
    let (mut items, mut depth, mut start) = (Vec::new(), 0, 0);
    for (at, c) in inside.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&inside[start..at]);
                start = at + 1;
            }
            _ => {}
        }
    }
    items.push(&inside[start..]);
    items
}

/// The check as the suite runs it: every violation on its own line, then
/// one verdict.
pub fn layering(ctx: &crate::Context, report: &mut crate::report::Report) {
    use crate::report::Outcome;
    report.section(
        "layering: imports go one way (docs/architecture.md): no chapter in the library, no seam outside the chapters",
    );
    let outcome = check_layering(&ctx.root);
    outcome.violations.iter().for_each(|violation| println!("  {violation}"));
    if outcome.violations.is_empty() {
        let detail = format!("{} files of src/, examples/ and tests/ keep the layers", outcome.files_scanned);
        report.check("layering", Outcome::Ok, &detail);
    } else {
        let detail = format!("{} imports against the layers (above)", outcome.violations.len());
        report.check("layering", Outcome::Fail, &detail);
    }
}
