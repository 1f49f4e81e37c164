//! `cargo xtask`'s command line: which checks it
//! runs, that the ones it leaves out are still counted (as skipped) in the
//! summary CI reads, and that a bad one says what is wrong.
//! Run: cargo test -p xtask --test selection

use std::process::Command;

use clap::Parser;
use xtask::cli::{Cli, Command as Subcommand};
use xtask::selection::{select, Selection, CHECKS};

/// Runs the suite's runner itself (this package's `xtask` binary) with
/// `args`: its exit status, standard output and standard error.
fn runner(args: &[&str]) -> (Option<i32>, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(args)
        .env_remove("CI") // no time limits needed: the checks chosen take a second
        .output()
        .expect("the runner starts");
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    (output.status.code(), text(&output.stdout), text(&output.stderr))
}

#[test]
fn checks_left_out_with_only_or_skip_are_counted_as_skipped() {
    // `includes` reads the book's sources only: quick, and no libtorch needed.
    let (_, output, _) = runner(&["test", "--only", "includes,files", "--skip", "files"]);
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

/// What `cargo xtask WORDS` asks for, or clap's message.
fn parse(words: &str) -> Result<Option<Subcommand>, String> {
    let argv = std::iter::once("cargo xtask").chain(words.split_whitespace());
    Cli::try_parse_from(argv).map(|cli| cli.command).map_err(|error| error.to_string())
}

/// The checks `cargo xtask test ...` runs.
fn selection(words: &str) -> Selection {
    match parse(words) {
        Ok(Some(Subcommand::Test { only, skip })) => select(&only, &skip),
        other => panic!("`{words}` is a valid `test` command line: {other:?}"),
    }
}

#[test]
fn only_and_skip_choose_in_suite_order_and_name_the_rest() {
    let chosen = selection("test --skip=train --only mpi,fmt,train");
    assert_eq!(chosen.run, ["fmt", "mpi"], "suite order, not command-line order");
    assert_eq!(chosen.left_out.len(), CHECKS.len() - 2);
    assert!(chosen.left_out.contains(&("train", "left out with --skip")));
    assert!(chosen.left_out.contains(&("book", "not named by --only")));
    assert_eq!(selection("test --only fmt --only mpi").run, ["fmt", "mpi"], "repeated flags add up");
    let everything = selection("test");
    assert_eq!((everything.run.len(), everything.left_out.len()), (CHECKS.len(), 0));
}

#[test]
fn bad_command_lines_say_what_is_wrong() {
    let unknown = parse("test --only teeth,tooth").expect_err("no check is called tooth");
    assert!(unknown.contains("invalid value 'tooth'"), "{unknown}");
    assert!(CHECKS.iter().all(|check| unknown.contains(check.name)), "it lists the checks: {unknown}");
    assert!(parse("test --only").is_err_and(|e| e.contains("a value is required for '--only")));
    assert!(parse("check").is_err_and(|e| e.contains("unrecognized subcommand 'check'")));
    assert!(parse("waits --runs 0").is_err_and(|e| e.contains("'--runs <N>'")));
    assert!(matches!(parse(""), Ok(None)), "plain `cargo xtask` prints the help");
}

#[test]
fn the_runner_exits_2_on_a_bad_command_line_and_its_help_lists_every_check() {
    // `--only`, not `--skip`: were `tooth` ever accepted, this would run no check,
    // rather than every check (and this test again, through `runner`).
    let (status, _, stderr) = runner(&["test", "--only", "tooth"]);
    assert_eq!(status, Some(2), "{stderr}");
    assert!(stderr.contains("a similar value exists: 'teeth'"), "{stderr}");
    for args in [&["--help"][..], &["test", "--help"], &[]] {
        let (status, stdout, _) = runner(args);
        assert_eq!(status, Some(0), "{args:?}");
        for check in CHECKS {
            assert!(stdout.contains(&format!("  {:<10} {}", check.name, check.what)), "{args:?}: {stdout}");
        }
    }
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
