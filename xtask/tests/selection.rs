//! Which checks a command line runs, and that the
//! ones it leaves out are still counted (as skipped) in the summary CI reads.
//! Run: cargo test -p xtask --test selection

use std::process::Command;

use xtask::selection::{parse_args, Request, CHECKS};

/// Runs the suite's runner itself (this package's `xtask` binary) with `args`.
fn runner(args: &[&str]) -> (bool, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(args)
        .env_remove("CI") // no time limits needed: the checks chosen take a second
        .output()
        .expect("the runner starts");
    (output.status.success(), String::from_utf8_lossy(&output.stdout).into_owned())
}

#[test]
fn checks_left_out_with_only_or_skip_are_counted_as_skipped() {
    // `includes` reads the book's sources only: quick, and no libtorch needed.
    let (_, output) = runner(&["test", "--only", "includes,files", "--skip", "files"]);
    let summary = output.lines().last().unwrap_or("");
    let skipped = format!(", {} skipped", CHECKS.len() - 1);
    assert!(
        summary.ends_with(&skipped),
        "{} checks, 1 run: the summary says {summary:?}\n{output}",
        CHECKS.len()
    );
    for (check, reason) in [("fmt", "not named by --only"), ("files", "left out with --skip")] {
        let line =
            output.lines().find(|line| line.starts_with("SKIP") && line.contains(&format!(" {check} ")));
        assert!(
            line.is_some_and(|line| line.contains(reason)),
            "no SKIP line for {check} saying {reason:?}:\n{output}"
        );
    }
}

fn words(line: &str) -> Vec<String> {
    line.split_whitespace().map(str::to_string).collect()
}

#[test]
fn only_and_skip_choose_in_suite_order_and_name_the_rest() {
    let Ok(Request::Run(selection)) = parse_args(&words("test --skip=train --only mpi,fmt,train")) else {
        panic!("a valid command line")
    };
    assert_eq!(selection.run, ["fmt", "mpi"], "suite order, not command-line order");
    assert_eq!(selection.left_out.len(), CHECKS.len() - 2);
    assert!(selection.left_out.contains(&("train", "left out with --skip")));
    assert!(selection.left_out.contains(&("book", "not named by --only")));
    let Ok(Request::Run(everything)) = parse_args(&words("test")) else { panic!("plain `test`") };
    assert_eq!((everything.run.len(), everything.left_out.len()), (CHECKS.len(), 0));
}

#[test]
fn bad_command_lines_say_what_is_wrong() {
    assert_eq!(parse_args(&words("--help")), Ok(Request::Help));
    assert!(parse_args(&words("test --only tooth")).is_err_and(|e| e.contains("unknown check `tooth`")));
    assert!(parse_args(&words("test --only")).is_err_and(|e| e.contains("--only needs a list")));
    assert!(parse_args(&words("check")).is_err_and(|e| e.contains("unknown command `check`")));
}

#[test]
fn every_check_is_named_once_in_the_one_table_that_also_runs_it() {
    use xtask::selection::check_named;
    for check in CHECKS {
        let same_name = CHECKS.iter().filter(|other| other.name == check.name).count();
        assert_eq!(same_name, 1, "`{}` is named {same_name} times", check.name);
        let found = check_named(check.name).expect("found by its name");
        assert!(std::ptr::eq(found, check), "`{}` finds its own entry", check.name);
    }
    assert!(check_named("tooth").is_none());
}
