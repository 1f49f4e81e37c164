//! The `stubs` check on small made-up chapters:
//! a stub's body is its chapter's todo! and nothing else, it names its own
//! function, and every function of the solution has its stub.
//! Run: cargo test -p xtask --test stubs_check

use std::path::PathBuf;

use xtask::stubs_check::check_stubs;

/// A repository with one chapter, ch01, whose files hold the given text.
fn repo(name: &str, exercise: &str, solution: &str, library: &str) -> PathBuf {
    let root = std::env::temp_dir().join(format!("xtask-stubs-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    // Joined a folder at a time: the `files` check reads whole paths in
    // this file as mentions of the repository's own files.
    let (chapter, library_folder) = (root.join("src").join("ch01_ring"), root.join("src").join("ddp"));
    std::fs::create_dir_all(&chapter).expect("a temporary folder");
    std::fs::create_dir_all(&library_folder).expect("a temporary folder");
    std::fs::write(chapter.join("exercise.rs"), exercise).expect("written");
    std::fs::write(chapter.join("solution.rs"), solution).expect("written");
    std::fs::write(library_folder.join("mod.rs"), library).expect("written");
    root
}

const SOLUTION: &str = "/// Sums.\npub fn ring(x: i64) -> i64 {\n    x + 1\n}\n";

fn problems(name: &str, exercise: &str, solution: &str, library: &str) -> Vec<String> {
    let root = repo(name, exercise, solution, library);
    let outcome = check_stubs(&root);
    let _ = std::fs::remove_dir_all(root);
    outcome.problems
}

#[test]
fn a_stub_whose_body_is_only_its_todo_passes() {
    let exercise = "/// Sums.\npub fn ring(x: i64) -> i64 {\n    // TODO: add one.\n    todo!(\"exercise ch01: ring in here\")\n}\n";
    assert_eq!(problems("good", exercise, SOLUTION, ""), Vec::<String>::new());
}

#[test]
fn code_beside_the_todo_is_a_problem() {
    // Half a solution left in the stub: a learner would start from it, and
    // a test could pass on the "untouched" stub.
    let exercise =
        "/// Sums.\npub fn ring(x: i64) -> i64 {\n    let _y = x + 1;\n    todo!(\"exercise ch01: ring in here\")\n}\n";
    let found = problems("extra-code", exercise, SOLUTION, "");
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(found[0].contains("the body must be only"), "{found:#?}");
    // Code in the todo!'s format arguments runs too.
    let exercise =
        "/// Sums.\npub fn ring(x: i64) -> i64 {\n    todo!(\"exercise ch01: ring in here {}\", x + 1)\n}\n";
    let found = problems("format-arguments", exercise, SOLUTION, "");
    assert!(found.len() == 1 && found[0].contains("the body must be only"), "{found:#?}");
}

#[test]
fn a_todo_that_names_another_function_is_a_problem() {
    // `cargo workbook` reads the name after `exercise ch01:` to say which
    // exercise is not written yet.
    let exercise =
        "/// Sums.\npub fn ring(x: i64) -> i64 {\n    todo!(\"exercise ch01: gather in here\")\n}\n";
    let found = problems("wrong-name", exercise, SOLUTION, "");
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(found[0].contains("todo!(\"exercise ch01: ring "), "{found:#?}");
}

#[test]
fn a_solution_function_without_its_stub_is_a_problem() {
    let exercise = "/// Sums.\npub fn ring(x: i64) -> i64 {\n    todo!(\"exercise ch01: ring in here\")\n}\n";
    let solution = format!("{SOLUTION}\npub use crate::ddp::{{gather, scatter as split}};\n/// Halves.\npub fn half(x: i64) -> i64 {{\n    x / 2\n}}\n");
    let library = "pub fn gather() {}\npub fn scatter() {}\n";
    let found = problems("missing-stub", exercise, &solution, library);
    let missing: Vec<&str> =
        found.iter().filter_map(|p| p.split('`').nth(1)).filter(|name| !name.is_empty()).collect();
    assert_eq!(missing, ["half", "gather", "split"], "{found:#?}");
    assert!(found.iter().all(|p| p.contains("has no stub in ") && p.ends_with("and a todo!")), "{found:#?}");
}

#[test]
fn a_signature_that_differs_from_the_solutions_is_a_problem_and_layout_is_not() {
    let wrapped =
        "/// Sums.\npub fn ring(\n    x: i64,\n) -> i64 {\n    todo!(\"exercise ch01: ring in here\")\n}\n";
    assert_eq!(problems("wrapped", wrapped, SOLUTION, ""), Vec::<String>::new());
    let exercise = "/// Sums.\npub fn ring(x: i32) -> i64 {\n    todo!(\"exercise ch01: ring in here\")\n}\n";
    let found = problems("signature", exercise, SOLUTION, "");
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(found[0].starts_with("ch01 ring: the signatures differ"), "{found:#?}");
    assert!(found[0].contains("exercise.rs:2  pub fn ring(x: i32) -> i64"), "{found:#?}");
    assert!(found[0].contains("solution.rs:2  pub fn ring(x: i64) -> i64"), "{found:#?}");
}

#[test]
fn a_doc_comment_that_differs_from_the_solutions_is_a_problem() {
    let exercise = "/// Adds.\npub fn ring(x: i64) -> i64 {\n    todo!(\"exercise ch01: ring in here\")\n}\n";
    let found = problems("doc", exercise, SOLUTION, "");
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(found[0].starts_with("ch01 ring: the doc comments differ (first at their line 1)"), "{found:#?}");
    assert!(found[0].contains("exercise.rs:1  /// Adds."), "{found:#?}");
    // A doc comment that stops short names where it ended.
    let exercise = "pub fn ring(x: i64) -> i64 {\n    todo!(\"exercise ch01: ring in here\")\n}\n";
    let found = problems("no-doc", exercise, SOLUTION, "");
    assert!(
        found.len() == 1 && found[0].contains("exercise.rs:1  (the doc comment has ended)"),
        "{found:#?}"
    );
}

#[test]
fn a_stub_is_compared_with_the_library_function_its_solution_re_exports() {
    let exercise = "/// Sums.\npub fn ring(x: i64) -> i64 {\n    todo!(\"exercise ch01: ring in here\")\n}\n";
    let solution = "pub use crate::ddp::ring;\n";
    let library = "/// Sums.\npub fn ring(x: i64) -> u64 {\n    x as u64\n}\n";
    let found = problems("re-exported", exercise, solution, library);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(found[0].contains("the signatures differ") && found[0].contains("mod.rs:2"), "{found:#?}");
    let found = problems("nowhere", exercise, "", "");
    assert!(found.len() == 1 && found[0].contains("no `pub fn ring`"), "{found:#?}");
}

#[test]
fn a_file_that_does_not_parse_is_a_problem_naming_it() {
    let exercise = "/// Sums.\npub fn ring(x: i64 -> i64 {\n    todo!(\"exercise ch01: ring in here\")\n}\n";
    let found = problems("syntax", exercise, SOLUTION, "");
    assert!(found[0].contains("exercise.rs: cannot be read as Rust (line 2, column"), "{found:#?}");
}

#[test]
fn this_repositorys_stubs_match_their_solutions() {
    let outcome = check_stubs(&xtask::repo_root());
    assert!(outcome.chapters >= 9 && outcome.functions >= 15, "{outcome:?}");
    assert_eq!(outcome.problems, Vec::<String>::new());
}
