//! The checks that run an outside tool and read its
//! exit status or closing line: fmt, book (mdBook), notebooks, clippy; and,
//! in `tool_checks/training.rs`, train and mpi (the training runs); in
//! `tool_checks/multinode.rs`, multinode (jobs on nodes made on this machine);
//! in `tool_checks/browser.rs`, browser (the book in headless Chromium).
//! Run one: `cargo xtask test --only clippy`.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::process::{self, describe_limit, run_logged, Captured};
use crate::report::{Outcome, Report};
use crate::test_checks::CHAPTER_LIMIT;
use crate::Context;

mod browser;
mod multinode;
mod training;
pub use browser::browser;
pub use multinode::multinode;
pub use training::{replicas_fingerprint, train, train_mpi};

/// In CI, the longest the notebooks may take, all of them together.
const NOTEBOOKS_LIMIT: Duration = Duration::from_secs(30 * 60);

/// Runs `command` into `log`; a command that cannot even start becomes a
/// failed check here, so each check only handles commands that ran.
fn run_or_fail(
    report: &mut Report,
    name: &str,
    command: Command,
    limit: Option<Duration>,
    log: PathBuf,
    echo: bool,
) -> Option<Captured> {
    let program = process::command_line(&command);
    match run_logged(command, limit, &log, echo) {
        Ok(captured) => Some(captured),
        Err(error) => {
            report.check(name, Outcome::Fail, &format!("could not run `{program}`: {error}"));
            None
        }
    }
}

pub fn fmt(ctx: &Context, report: &mut Report) {
    report.section("cargo fmt --check");
    let mut command = ctx.cargo();
    // --all: the runner's own crate too; -l: the files that differ, not pages of diff.
    command.args(["fmt", "--all", "--check", "--", "--color=never", "-l"]);
    let Some(captured) = run_or_fail(report, "fmt", command, None, ctx.log("fmt.log"), false) else { return };
    if captured.finished.success() {
        report.check("fmt", Outcome::Ok, "");
    } else {
        println!("not formatted:");
        captured.output.lines().take(40).for_each(|line| println!("{line}"));
        report.check("fmt", Outcome::Fail, "run cargo fmt --all (cargo fmt --all --check shows the diff)");
    }
}

/// The mdbook that scripts/setup.sh installed: on PATH, or in cargo's bin.
fn find_mdbook() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>());
    let cargo_bin = std::env::var_os("CARGO_INSTALL_ROOT")
        .or_else(|| std::env::var_os("CARGO_HOME"))
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cargo")))
        .map(|root| root.join("bin"));
    on_path.chain(cargo_bin).map(|dir| dir.join("mdbook")).find(|candidate| candidate.is_file())
}

pub fn book(ctx: &Context, report: &mut Report) {
    report.section("mdbook build");
    let Some(mdbook) = find_mdbook() else {
        return report.check("book", Outcome::Fail, "mdbook is not installed: run scripts/setup.sh");
    };
    if !ctx.root.join("book.toml").is_file() {
        return report.check("book", Outcome::Fail, "no book.toml at the repository root");
    }
    let mut command = Command::new(&mdbook);
    command.arg("build").current_dir(&ctx.root);
    let Some(captured) = run_or_fail(report, "book", command, None, ctx.log("mdbook.log"), false) else {
        return;
    };
    // mdBook logs a missing include file as ERROR and still exits 0, and
    // logs unbalanced HTML (a stray code fence that swallows a <details>)
    // as WARN, so either fails the check; a missing anchor it does not even
    // log, which is what the `includes` check is for.
    let logged = |level: &str| captured.output.lines().any(|line| line.contains(level));
    if !captured.finished.success() || logged("ERROR") || logged("WARN") {
        println!("{}", captured.output.trim_end());
        return report.check("book", Outcome::Fail, "mdbook build failed or logged an ERROR or WARN");
    }
    let version = Command::new(&mdbook).arg("--version").output();
    let version =
        version.map(|out| String::from_utf8_lossy(&out.stdout).trim().to_string()).unwrap_or_default();
    report.check("book", Outcome::Ok, &format!("{version}, output in book/"));
}

pub fn includes(ctx: &Context, report: &mut Report) {
    report.section("every {{#include}} of the book resolves");
    match crate::book_includes::check_book(&ctx.root) {
        Err(problem) => report.check("includes", Outcome::Fail, &problem),
        Ok(outcome) => {
            for problem in &outcome.broken {
                println!("  broken include: {problem}");
            }
            let counts = format!(
                "{} pages, {} includes, {} broken",
                outcome.pages,
                outcome.includes,
                outcome.broken.len()
            );
            if outcome.broken.is_empty() {
                report.check("includes", Outcome::Ok, &counts);
            } else {
                report.check(
                    "includes",
                    Outcome::Fail,
                    &format!("{counts}: a {{{{#include}}}} points at a missing file or anchor"),
                );
            }
        }
    }
}

pub fn notebooks(ctx: &Context, report: &mut Report) {
    report.section("notebooks: run every notebook in a fresh Rust kernel");
    if !ctx.root.join("scripts/run_notebooks.py").is_file() {
        let detail = "scripts/run_notebooks.py is missing: no notebook can run (restore it from git)";
        return report.check("notebooks", Outcome::Fail, detail);
    }
    let python = ctx.root.join(".venv/bin/python");
    let python_command = |args: &[&str]| {
        let mut command = Command::new(&python);
        command.args(args).current_dir(&ctx.root);
        command
    };

    // run_notebooks.py ends with its own "N passed, N failed" (one per
    // notebook); those count here too.
    let command = python_command(&["scripts/run_notebooks.py"]);
    let limit = ctx.limit(NOTEBOOKS_LIMIT);
    if let Some(captured) = run_or_fail(report, "notebooks", command, limit, ctx.log("notebooks.log"), true) {
        let summary = last_passed_failed_line(&captured.output);
        let (passed, failed) = summary.unwrap_or((0, 0));
        report.add_counts(passed, failed, 0, "notebooks");
        println!();
        if captured.finished.timed_out {
            let detail = format!("stopped after {}: a notebook hangs", describe_limit(NOTEBOOKS_LIMIT));
            report.check("notebooks", Outcome::Fail, &detail);
        } else if summary.is_none() {
            // Without its closing line nothing says that any notebook ran.
            let detail = "scripts/run_notebooks.py ended without its `N passed, N failed` line (see above)";
            report.check("notebooks", Outcome::Fail, detail);
        } else if passed + failed == 0 {
            report.check("notebooks", Outcome::Fail, "scripts/run_notebooks.py ran no notebook (see above)");
        } else if !captured.finished.success() && failed == 0 {
            report.check(
                "notebooks",
                Outcome::Fail,
                "scripts/run_notebooks.py failed outside any notebook (see above)",
            );
        } else {
            report
                .tally_line("notebooks", &format!("{passed} passed, {failed} failed (counted per notebook)"));
        }
    }

    // Committed notebooks carry no outputs (clean diffs); the runner's own
    // tests prove it catches a failing cell and a planted panic.
    let command = python_command(&["scripts/run_notebooks.py", "--check-clean"]);
    if let Some(captured) =
        run_or_fail(report, "notebooks-clean", command, None, ctx.log("notebooks-clean.log"), false)
    {
        if captured.finished.success() {
            report.check("notebooks-clean", Outcome::Ok, &process::last_lines(&captured.output, 1));
        } else {
            println!("{}", captured.output.trim_end());
            let detail = "a committed notebook has outputs or breaks a convention (.venv/bin/python scripts/run_notebooks.py --strip FILE)";
            report.check("notebooks-clean", Outcome::Fail, detail);
        }
    }
    let command = python_command(&["scripts/test_run_notebooks.py"]);
    let log = ctx.log("notebook-runner.log");
    if let Some(captured) =
        run_or_fail(report, "notebook-runner", command, ctx.limit(CHAPTER_LIMIT), log, false)
    {
        if captured.finished.success() {
            report.check("notebook-runner", Outcome::Ok, &process::last_lines(&captured.output, 1));
        } else {
            process::print_last_lines(&captured.output, 40);
            let detail = "scripts/test_run_notebooks.py failed (target/test-logs/notebook-runner.log)";
            report.check("notebook-runner", Outcome::Fail, detail);
        }
    }
}

/// The last `N passed, N failed...` line of a run's output.
pub fn last_passed_failed_line(output: &str) -> Option<(usize, usize)> {
    output.lines().rev().find_map(|line| {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            [passed, "passed,", failed, failed_word, ..] if failed_word.starts_with("failed") => {
                Some((passed.parse().ok()?, failed.parse().ok()?))
            }
            _ => None,
        }
    })
}

pub fn clippy(ctx: &Context, report: &mut Report) {
    report.section(
        "cargo clippy --all-targets --features solutions,mpi,nccl -- -D warnings (and the xtask crate)",
    );
    // The workspace's two members separately: the `solutions` feature exists
    // only in ddp-workbook, and the runner must stay lint-clean as well.
    let runs: [(&[&str], &str); 2] = [
        (
            &["clippy", "--all-targets", "--features", "solutions,mpi,nccl", "--", "-D", "warnings"],
            "clippy.log",
        ),
        (&["clippy", "--package", "xtask", "--all-targets", "--", "-D", "warnings"], "clippy-xtask.log"),
    ];
    for (args, log_name) in runs {
        let mut command = ctx.cargo();
        command.args(args);
        let Some(captured) = run_or_fail(report, "clippy", command, None, ctx.log(log_name), false) else {
            return;
        };
        if !captured.finished.success() {
            print_lints(&captured.output, 80);
            let detail = format!("fix the lints above (full log: target/test-logs/{log_name})");
            return report.check("clippy", Outcome::Fail, &detail);
        }
    }
    report.check("clippy", Outcome::Ok, "");
}

/// Prints each `warning`/`error` line with the 6 lines after it, at most
/// `max_lines` lines in all.
fn print_lints(output: &str, max_lines: usize) {
    let lines: Vec<&str> = output.lines().collect();
    let mut shown = Vec::new();
    let mut keep_until = 0;
    for (index, line) in lines.iter().enumerate() {
        if line.starts_with("warning") || line.starts_with("error") {
            keep_until = index + 7;
        }
        if index < keep_until {
            shown.push(*line);
        }
    }
    shown.iter().take(max_lines).for_each(|line| println!("{line}"));
}
