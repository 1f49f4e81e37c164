//! `cargo xtask test`, the ddp-workbook test suite, the one
//! scripts/test.sh runs (and CI, through .ci/run). Run it from anywhere in
//! the repository:
//!
//!     cargo xtask test                      # everything, as CI runs it
//!     cargo xtask test --only teeth         # one part
//!     cargo xtask test --skip train,notebooks
//!     cargo xtask --help
//!
//! The last line printed is the summary CI reads, alone on its line:
//! `N passed, N failed[, N skipped]` (a check left out counts as skipped);
//! the exit status is 1 when anything failed, 2 for a bad command line. The
//! command line is in cli.rs, the checks in selection.rs.

use std::process::ExitCode;
use std::time::Instant;

use clap::{CommandFactory, Parser};
use xtask::cli::{Cli, Command};
use xtask::report::{Outcome, Report};
use xtask::selection::{check_named, select};
use xtask::{expected_skips, gpu, Context};

fn main() -> ExitCode {
    // A bad command line: clap says what is wrong (an unknown check: which
    // ones there are) and exits with status 2.
    let (only, skip) = match Cli::parse().command {
        Some(Command::Test { only, skip }) => (only, skip),
        Some(Command::Waits(options)) => return xtask::waits::main(&options),
        None => {
            print!("{}", Cli::command().render_help());
            return ExitCode::SUCCESS;
        }
    };
    let selection = select(&only, &skip);
    let ctx = match Context::new() {
        Ok(ctx) => ctx,
        Err(error) => {
            eprintln!("cargo xtask: cannot create target/test-logs/: {error}");
            println!("0 passed, 1 failed");
            return ExitCode::FAILURE;
        }
    };
    let started = Instant::now();
    let mut report = Report::new();
    // Left out on purpose: counted as skipped, so that the summary of a
    // partial run never reads like the summary of a whole one.
    if !selection.left_out.is_empty() {
        report.section("left out of this run (each counts as skipped)");
        for (name, reason) in &selection.left_out {
            report.check(name, Outcome::Skip, reason);
        }
    }
    let libtorch_ready = ctx.root.join(".cargo/libtorch.toml").is_file();
    if !libtorch_ready && selection.run.iter().any(|name| check_named(name).is_some_and(|c| c.needs_libtorch))
    {
        println!("cargo xtask: libtorch is not set up in this checkout (.cargo/libtorch.toml is missing).");
        println!("    -> run scripts/setup.sh first; the checks that need it are not run");
        report.check("setup", Outcome::Fail, "run scripts/setup.sh");
    }
    for name in selection.run {
        let check = check_named(name).expect("the selection is made of CHECKS' names");
        if check.needs_libtorch && !libtorch_ready {
            report.check(name, Outcome::Skip, "needs libtorch: run scripts/setup.sh");
            continue;
        }
        (check.run)(&ctx, &mut report);
    }
    if selection.left_out.is_empty() {
        judge_skips(&ctx, &mut report);
    }
    println!("\ncargo xtask test took {}s", started.elapsed().as_secs());
    report.print_summary();
    if report.failed() == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// After a whole run: every skip must be one tests/expected_skips.toml
/// allows on this machine, and the run must count at least its `tests`.
fn judge_skips(ctx: &Context, report: &mut Report) {
    report.section("skips and the test count against tests/expected_skips.toml");
    let expected = match expected_skips::load(&ctx.root) {
        Ok(expected) => expected,
        Err(error) => return report.check("skips", Outcome::Fail, &error),
    };
    let machine = expected_skips::Machine { gpu: gpu::find_gpu().is_some(), ci: ctx.ci };
    let counted = report.counted();
    let problems = expected_skips::judge(&expected, counted, report.skipped(), report.skips(), machine);
    for problem in &problems {
        println!("    {problem}");
    }
    if problems.is_empty() {
        let detail = format!(
            "{} skips, each allowed; {counted} tests and checks counted (at least {})",
            report.skipped(),
            expected.tests
        );
        report.check("skips", Outcome::Ok, &detail);
    } else {
        report.check("skips", Outcome::Fail, &format!("{} problems (above)", problems.len()));
    }
}
