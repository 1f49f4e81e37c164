//! The `stubs` check. Every exercise stub must say
//! exactly what its reference solution does: for each `pub fn` in a chapter's
//! src/chNN_*/exercise.rs, the doc comment and the signature must equal those
//! of the same `pub fn` in that chapter's solution.rs (or, when solution.rs
//! only re-exports it, in the first file under src/ddp/ that defines it), and
//! the body must be nothing but the chapter's
//! `todo!("exercise chNN: NAME ...")` (comments aside), naming the function:
//! the message the teeth check and `cargo workbook` look for. And every
//! function of solution.rs (defined or re-exported) must have its stub.
//! Run it: `cargo xtask test --only stubs`. Unit tests: xtask/tests/stubs_check.rs.
//!
//! Why: a learner reads only the exercise file. A doc comment that drifted
//! from the solution describes a function the tests do not check; code left
//! beside the todo! can make a test pass on the "untouched" stubs; and a
//! solution function without a stub is an exercise the learner never sees.

use std::fs;
use std::path::{Path, PathBuf};

use crate::report::{Outcome, Report};
use crate::rust_source::{blank_comments_and_literals, canonical_signature, public_fns, public_uses, PubFn};
use crate::Context;

/// What the check found, over every chapter.
#[derive(Debug, Default)]
pub struct StubsOutcome {
    pub chapters: usize,
    pub functions: usize,
    /// One message per problem, several lines each.
    pub problems: Vec<String>,
}

/// A `pub fn` and the file it is in (a path relative to the repository).
struct Located {
    file: String,
    item: PubFn,
}

/// The chapter folders that have an exercise: (`01`, src/ch01_collectives).
pub fn chapter_dirs(root: &Path) -> Vec<(String, PathBuf)> {
    let Ok(entries) = fs::read_dir(root.join("src")) else { return Vec::new() };
    let mut chapters: Vec<(String, PathBuf)> = entries
        .filter_map(|entry| entry.ok())
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let nn = name.strip_prefix("ch")?.get(..2)?.to_string();
            let chapter_dir = nn.bytes().all(|b| b.is_ascii_digit()) && name[4..].starts_with('_');
            (chapter_dir && entry.path().join("exercise.rs").is_file()).then(|| (nn, entry.path()))
        })
        .collect();
    chapters.sort();
    chapters
}

pub fn check_stubs(root: &Path) -> StubsOutcome {
    let mut outcome = StubsOutcome::default();
    let shared_files = rust_files_under(&root.join("src/ddp"));
    for (nn, dir) in chapter_dirs(root) {
        outcome.chapters += 1;
        let relative = |path: &Path| path.strip_prefix(root).unwrap_or(path).display().to_string();
        let exercise_path = dir.join("exercise.rs");
        let solution_path = dir.join("solution.rs");
        let exercise = fs::read_to_string(&exercise_path).unwrap_or_default();
        let solution = fs::read_to_string(&solution_path).unwrap_or_default();
        let solution_fns = public_fns(&solution);
        let stubs = public_fns(&exercise);
        check_every_solution_fn_has_a_stub(
            &nn,
            &solution,
            &stubs,
            &relative(&solution_path),
            &relative(&exercise_path),
            &mut outcome.problems,
        );
        for stub in stubs {
            outcome.functions += 1;
            let stub = Located { file: relative(&exercise_path), item: stub };
            let label = format!("ch{nn} {}", stub.item.name);
            check_todo(&label, &nn, &stub, &mut outcome.problems);
            let reference = match solution_fns.iter().find(|item| item.name == stub.item.name) {
                Some(item) => Some(Located { file: relative(&solution_path), item: item.clone() }),
                None => find_in_files(&shared_files, &stub.item.name, root),
            };
            let Some(reference) = reference else {
                let where_else = if shared_files.is_empty() { "src/ddp/ (none there)" } else { "src/ddp/" };
                outcome.problems.push(format!(
                    "{label}: {}:{}: no `pub fn {}` in {} nor under {where_else}: not found",
                    stub.file,
                    stub.item.line,
                    stub.item.name,
                    relative(&solution_path)
                ));
                continue;
            };
            if let Some(problem) = compare_docs(&label, &stub, &reference) {
                outcome.problems.push(problem);
            }
            if canonical_signature(&stub.item.signature) != canonical_signature(&reference.item.signature) {
                outcome.problems.push(format!(
                    "{label}: the signatures differ\n      exercise  {}:{}  {}\n      solution  {}:{}  {}",
                    stub.file,
                    stub.item.line,
                    stub.item.signature,
                    reference.file,
                    reference.item.line,
                    reference.item.signature
                ));
            }
        }
    }
    outcome
}

/// The stub's body must be the chapter's todo!, naming the function, and
/// nothing else but comments.
fn check_todo(label: &str, nn: &str, stub: &Located, problems: &mut Vec<String>) {
    let expected = format!("todo!(\"exercise ch{nn}: {} ...\")", stub.item.name);
    let where_ = format!("{}:{}", stub.file, stub.item.line);
    let Some(body) = stub.item.body.as_deref() else {
        return problems.push(format!("{label}: {where_}: has no body: give it {expected}"));
    };
    // Comments and the literal's text blanked: only the code is left.
    let code = blank_comments_and_literals(body);
    let compact: String = code.chars().filter(|c| !c.is_whitespace()).collect();
    if compact != "todo!(\"\")" && compact != "todo!(\"\");" {
        return problems.push(format!(
            "{label}: {where_}: the body must be only {expected} (comments may stay): \
             code beside it could pass a test on the untouched stubs"
        ));
    }
    // Positions are kept by the blanking: the literal's text is at the quote.
    let quote = code.find('"').map_or(body.len(), |at| at + 1);
    let message = &body[quote..];
    let prefix = format!("exercise ch{nn}: {}", stub.item.name);
    let names_itself = message.strip_prefix(&prefix).is_some_and(|rest| rest.starts_with([' ', '"']));
    if !names_itself {
        problems.push(format!(
            "{label}: {where_}: the todo! must say {expected}: the teeth check and `cargo workbook` read that message"
        ));
    }
}

/// Every `pub fn` of the solution, and every function it re-exports with
/// `pub use` (types, named in CamelCase, aside), must have a stub.
fn check_every_solution_fn_has_a_stub(
    nn: &str,
    solution: &str,
    stubs: &[PubFn],
    solution_file: &str,
    exercise_file: &str,
    problems: &mut Vec<String>,
) {
    let defined = public_fns(solution).into_iter().map(|item| (item.line, item.name));
    let reexported =
        public_uses(solution).into_iter().filter(|(_, name)| !name.starts_with(char::is_uppercase));
    for (line, name) in defined.chain(reexported) {
        if !stubs.iter().any(|stub| stub.name == name) {
            problems.push(format!(
                "ch{nn} {name}: {solution_file}:{line}: `{name}` has no stub in {exercise_file}: \
                 give it one, with the solution's doc comment and signature and a todo!"
            ));
        }
    }
}

/// The first difference between the two doc comments, if any.
fn compare_docs(label: &str, stub: &Located, reference: &Located) -> Option<String> {
    let (ours, theirs) = (&stub.item.doc, &reference.item.doc);
    let first_difference = (0..ours.len().max(theirs.len()))
        .find(|&i| ours.get(i).map(|d| &d.1) != theirs.get(i).map(|d| &d.1))?;
    // Each side's line: its differing doc line, or the `pub fn` line where its comment has already ended.
    let side = |located: &Located, doc: &[(usize, String)]| match doc.get(first_difference) {
        Some((line, text)) => format!("{}:{line}  ///{text}", located.file),
        None => format!("{}:{}  (the doc comment has ended)", located.file, located.item.line),
    };
    Some(format!(
        "{label}: the doc comments differ (first at their line {})\n      exercise  {}\n      solution  {}",
        first_difference + 1,
        side(stub, ours),
        side(reference, theirs)
    ))
}

/// The first of `files` (in order) that defines `pub fn name`.
fn find_in_files(files: &[PathBuf], name: &str, root: &Path) -> Option<Located> {
    files.iter().find_map(|path| {
        let item = public_fns(&fs::read_to_string(path).ok()?).into_iter().find(|item| item.name == name)?;
        let file = path.strip_prefix(root).unwrap_or(path).display().to_string();
        Some(Located { file, item })
    })
}

/// Every .rs file under `dir`, recursively, sorted; none if it is missing.
pub fn rust_files_under(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(folder) = pending.pop() {
        let Ok(entries) = fs::read_dir(&folder) else { continue };
        for path in entries.filter_map(|entry| Some(entry.ok()?.path())) {
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// The check as the suite runs it: each problem on its own line, then one verdict.
pub fn stubs(ctx: &Context, report: &mut Report) {
    report.section(
        "stubs: each solution function has its stub: same doc comment and signature, only its todo!",
    );
    let outcome = check_stubs(&ctx.root);
    outcome.problems.iter().for_each(|problem| println!("  {problem}"));
    let counts = format!("{} stubs in {} chapters", outcome.functions, outcome.chapters);
    if outcome.problems.is_empty() {
        report.check("stubs", Outcome::Ok, &format!("{counts} match their solutions"));
    } else {
        report.check(
            "stubs",
            Outcome::Fail,
            &format!("{counts}: {} problems (above)", outcome.problems.len()),
        );
    }
}
