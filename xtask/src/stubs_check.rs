//! The `stubs` check. Every exercise stub must say
//! exactly what its reference solution does: for each `pub fn` in a chapter's
//! src/chNN_*/exercise.rs, the doc comment and the signature must equal those
//! of the same `pub fn` in that chapter's solution.rs (or, when solution.rs
//! only re-exports it, in the first file under src/ddp/ that defines it), and
//! the body must be nothing but the chapter's
//! `todo!("exercise chNN: NAME ...")` (comments aside), naming the function:
//! the message the teeth check and `cargo workbook` look for. And every
//! function of solution.rs (defined or re-exported) must have its stub.
//! The files are read with syn (pub_fns.rs). Run it: `cargo xtask test --only stubs`. Unit tests: xtask/tests/stubs_check.rs.
//!
//! Why: a learner reads only the exercise file. A doc comment that drifted
//! from the solution describes a function the tests do not check; code left
//! beside the todo! can make a test pass on the "untouched" stubs; and a
//! solution function without a stub is an exercise the learner never sees.

use std::fs;
use std::path::Path;

use crate::layout::{chapter_dirs, rust_files_under};
use crate::pub_fns::{self, PubFn, RustFile};
use crate::report::{Outcome, Report};
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
struct Located<'a> {
    file: &'a str,
    item: &'a PubFn,
}

/// A file read with syn, named by its path relative to the repository.
struct Read {
    file: String,
    found: RustFile,
}

/// `path` read with syn; a file that cannot be read is a problem, and counts as empty.
fn read(root: &Path, path: &Path, problems: &mut Vec<String>) -> Read {
    let file = path.strip_prefix(root).unwrap_or(path).display().to_string();
    let found =
        match fs::read_to_string(path).map_err(|e| e.to_string()).and_then(|text| pub_fns::read(&text)) {
            Ok(found) => found,
            Err(error) => {
                problems.push(format!(
                    "{file}: cannot be read as Rust ({error}): the stubs check needs it to parse"
                ));
                RustFile::default()
            }
        };
    Read { file, found }
}

pub fn check_stubs(root: &Path) -> StubsOutcome {
    let mut outcome = StubsOutcome::default();
    let problems = &mut outcome.problems;
    let shared: Vec<Read> =
        rust_files_under(&root.join("src/ddp")).iter().map(|path| read(root, path, problems)).collect();
    for (nn, dir) in chapter_dirs(root) {
        outcome.chapters += 1;
        let exercise = read(root, &dir.join("exercise.rs"), problems);
        let solution = read(root, &dir.join("solution.rs"), problems);
        check_every_solution_fn_has_a_stub(&nn, &solution, &exercise, problems);
        for stub in &exercise.found.fns {
            outcome.functions += 1;
            let stub = Located { file: &exercise.file, item: stub };
            let label = format!("ch{nn} {}", stub.item.name);
            check_todo(&label, &nn, &stub, problems);
            let reference =
                std::iter::once(&solution).chain(&shared).find_map(|read| defining(read, &stub.item.name));
            let Some(reference) = reference else {
                let where_else = if shared.is_empty() { "src/ddp/ (none there)" } else { "src/ddp/" };
                problems.push(format!(
                    "{label}: {}:{}: no `pub fn {}` in {} nor under {where_else}: not found",
                    stub.file, stub.item.line, stub.item.name, solution.file
                ));
                continue;
            };
            if let Some(problem) = compare_docs(&label, &stub, &reference) {
                problems.push(problem);
            }
            if stub.item.canonical != reference.item.canonical {
                problems.push(format!(
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

/// The `pub fn name` of `read`, if it defines one.
fn defining<'a>(read: &'a Read, name: &str) -> Option<Located<'a>> {
    let item = read.found.fns.iter().find(|item| item.name == name)?;
    Some(Located { file: &read.file, item })
}

/// The stub's body must be the chapter's todo!, naming the function, and
/// nothing else but comments.
fn check_todo(label: &str, nn: &str, stub: &Located, problems: &mut Vec<String>) {
    let expected = format!("todo!(\"exercise ch{nn}: {} ...\")", stub.item.name);
    let where_ = format!("{}:{}", stub.file, stub.item.line);
    if !stub.item.body_is_one_todo() {
        return problems.push(format!(
            "{label}: {where_}: the body must be only {expected} (comments may stay): \
             code beside it could pass a test on the untouched stubs"
        ));
    }
    let prefix = format!("exercise ch{nn}: {}", stub.item.name);
    let names_itself = stub.item.todo_messages().iter().any(|message| {
        message.strip_prefix(&prefix).is_some_and(|rest| rest.is_empty() || rest.starts_with(' '))
    });
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
    solution: &Read,
    exercise: &Read,
    problems: &mut Vec<String>,
) {
    let defined = solution.found.fns.iter().map(|item| (item.line, &item.name));
    let reexported = solution
        .found
        .uses
        .iter()
        .filter(|(_, name)| !name.starts_with(char::is_uppercase))
        .map(|(l, n)| (*l, n));
    for (line, name) in defined.chain(reexported) {
        if !exercise.found.fns.iter().any(|stub| &stub.name == name) {
            problems.push(format!(
                "ch{nn} {name}: {}:{line}: `{name}` has no stub in {}: \
                 give it one, with the solution's doc comment and signature and a todo!",
                solution.file, exercise.file
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
