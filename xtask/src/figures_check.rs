//! The `figures` check. Runs
//! `cargo run --example figures -- --check` (examples/figures.rs), which draws
//! every figure of the book in memory from the code it shows and compares it
//! with the committed file under chapters/figures/; the check fails naming
//! each figure that differs, is missing, or is drawn by nothing.
//! Run it: `cargo xtask test --only figures`. Tests: xtask/tests/figures_check.rs.

use std::time::Duration;

use crate::process::{self, run_logged};
use crate::report::{Outcome, Report};
use crate::Context;

/// In CI, the longest the check may take: linking the example, if the
/// `solutions` check has not already built it, and drawing (a second).
const FIGURES_LIMIT: Duration = Duration::from_secs(10 * 60);

/// The command that rewrites the figures, for the failure message.
pub const REWRITE: &str = "cargo run --example figures";

/// The prefixes of the lines `--check` prints, one per figure that fails.
const PROBLEMS: [&str; 3] = ["differs: ", "missing: ", "not drawn by any figure: "];

pub fn figures(ctx: &Context, report: &mut Report) {
    report.section("the book's figures are what their code draws (cargo run --example figures -- --check)");
    let mut command = ctx.cargo();
    // The suite's feature set, so that the example links against the library
    // the `solutions` check built; the figures do not depend on the features.
    command.args([
        "run",
        "--quiet",
        "--features",
        "solutions,mpi,nccl",
        "--example",
        "figures",
        "--",
        "--check",
    ]);
    let program = process::command_line(&command);
    match run_logged(command, ctx.limit(FIGURES_LIMIT), &ctx.log("figures.log"), false) {
        Err(error) => report.check("figures", Outcome::Fail, &format!("could not run `{program}`: {error}")),
        Ok(captured) => {
            let (outcome, detail) = verdict(captured.finished.success(), &captured.output);
            if outcome == Outcome::Fail {
                process::print_last_lines(&captured.output, 30);
            }
            report.check("figures", outcome, &detail);
        }
    }
}

/// The check's outcome from the example's exit status and output: passed
/// only when it exited 0 and said how many figures match; otherwise a
/// failure naming every figure it listed, or, when it listed none (it did
/// not build, a figure failed to draw), pointing at the log.
pub fn verdict(success: bool, output: &str) -> (Outcome, String) {
    let named: Vec<&str> = output
        .lines()
        .filter_map(|line| PROBLEMS.iter().any(|prefix| line.starts_with(prefix)).then_some(line.trim()))
        .collect();
    let matched = output.lines().find(|line| line.contains(" figures match "));
    match (success, matched) {
        (true, Some(line)) if named.is_empty() => (Outcome::Ok, line.trim().to_string()),
        _ if !named.is_empty() => (
            Outcome::Fail,
            format!("{}; run `{REWRITE}` to rewrite them, look at them, and commit them", named.join("; ")),
        ),
        _ => (
            Outcome::Fail,
            "the figures example did not run to its end: see target/test-logs/figures.log".to_string(),
        ),
    }
}
