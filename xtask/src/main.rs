//! xtask/src/main.rs: `cargo xtask test`, the ddp-workbook test suite, the one
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
//! checks and the command line are in selection.rs.

use std::process::ExitCode;
use std::time::Instant;

use xtask::report::{Outcome, Report};
use xtask::selection::{help, parse_args, Request, NEED_LIBTORCH};
use xtask::{
    files_check, layering_check, stubs_check, teeth_check, test_checks, tool_checks, workbook, Context,
};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let selection = match parse_args(&args) {
        Ok(Request::Run(selection)) => selection,
        Ok(Request::Help) => {
            print!("{}", help());
            return ExitCode::SUCCESS;
        }
        Err(problem) => {
            eprintln!("cargo xtask: {problem}\n\n{}", help());
            return ExitCode::from(2);
        }
    };
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
    if !libtorch_ready && selection.run.iter().any(|name| NEED_LIBTORCH.contains(name)) {
        println!("cargo xtask: libtorch is not set up in this checkout (.cargo/libtorch.toml is missing).");
        println!("    -> run scripts/setup.sh first; the checks that need it are not run");
        report.check("setup", Outcome::Fail, "run scripts/setup.sh");
    }
    for name in selection.run {
        if NEED_LIBTORCH.contains(&name) && !libtorch_ready {
            report.check(name, Outcome::Skip, "needs libtorch: run scripts/setup.sh");
            continue;
        }
        match name {
            "fmt" => tool_checks::fmt(&ctx, &mut report),
            "book" => tool_checks::book(&ctx, &mut report),
            "includes" => tool_checks::includes(&ctx, &mut report),
            "files" => files(&ctx, &mut report),
            "layering" => layering_check::layering(&ctx, &mut report),
            "stubs" => stubs(&ctx, &mut report),
            "hints" => hints(&ctx, &mut report),
            "runner" => test_checks::runner(&ctx, &mut report),
            "solutions" => test_checks::solutions(&ctx, &mut report),
            "teeth" => teeth_check::teeth(&ctx, &mut report),
            "notebooks" => tool_checks::notebooks(&ctx, &mut report),
            "clippy" => tool_checks::clippy(&ctx, &mut report),
            "train" => tool_checks::train(&ctx, &mut report),
            "mpi" => tool_checks::train_mpi(&ctx, &mut report),
            other => unreachable!("check `{other}` is in CHECKS but has no code"),
        }
    }
    println!("\ncargo xtask test took {}s", started.elapsed().as_secs());
    report.print_summary();
    if report.failed() == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn files(ctx: &Context, report: &mut Report) {
    report.section("files: every path the docs and code mention exists, and none points outside");
    let outcome = match files_check::check_files(&ctx.root) {
        Ok(outcome) => outcome,
        Err(problem) => return report.check("files", Outcome::Fail, &problem),
    };
    outcome.missing.iter().for_each(|line| println!("  {line}"));
    for mention in &outcome.outside {
        println!("  outside  {mention}: the repository must stand alone (say it here instead)");
    }
    if outcome.missing.is_empty() && outcome.outside.is_empty() {
        let detail = format!(
            "{} path mentions in {} files, all present",
            outcome.paths_checked, outcome.files_scanned
        );
        report.check("files", Outcome::Ok, &detail);
    } else {
        let detail = format!(
            "{} mentions of missing paths, {} mentions of files outside the repository",
            outcome.missing.len(),
            outcome.outside.len()
        );
        report.check("files", Outcome::Fail, &detail);
    }
}

fn stubs(ctx: &Context, report: &mut Report) {
    report.section(
        "stubs: each solution function has its stub: same doc comment and signature, only its todo!",
    );
    let outcome = stubs_check::check_stubs(&ctx.root);
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

fn hints(ctx: &Context, report: &mut Report) {
    report.section("hints: every exercise has exactly three graded hints, and the book shows them");
    match workbook::hints::check_all(&ctx.root) {
        Ok((count, problems)) if problems.is_empty() => {
            report.check("hints", Outcome::Ok, &format!("{count} hints, each in its chapter's page"))
        }
        Ok((_, problems)) => {
            problems.iter().for_each(|problem| println!("  {problem}"));
            report.check("hints", Outcome::Fail, &format!("{} problems (above)", problems.len()));
        }
        Err(error) => report.check("hints", Outcome::Fail, &error),
    }
}
