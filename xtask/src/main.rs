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
//! `N passed, N failed[, N skipped]`; the exit status is 1 when anything
//! failed, 2 for a bad command line.

use std::process::ExitCode;
use std::time::Instant;

use xtask::report::{Outcome, Report};
use xtask::{files_check, stubs_check, test_checks, tool_checks, workbook, Context};

/// Every check, in the order the suite runs them, with what each one does.
const CHECKS: &[(&str, &str)] = &[
    ("fmt", "cargo fmt --all --check"),
    ("book", "mdbook build exits 0 and logs no ERROR"),
    ("includes", "every {{#include}} of the book names an existing file, anchor and lines"),
    ("files", "every repository path the docs and code mention exists; nothing points outside the repository"),
    ("stubs", "each exercise pub fn has its solution's doc comment and signature, and a todo!(\"exercise chNN: ...\")"),
    ("hints", "each exercise has graded hints 1, 2, 3 in its hints.md, and its chapter page shows every one"),
    ("runner", "cargo test -p xtask: the runner's and the workbook command's own tests (counted per test)"),
    ("solutions", "cargo test --features solutions,mpi,nccl: every test and doc test passes (counted per test)"),
    ("teeth", "each tests/chapter_NN.rs fails on the untouched stubs, saying `exercise chNN:` (one per chapter)"),
    ("notebooks", "every notebook runs in the Rust kernel (counted per notebook), is committed clean, and the runner's own tests pass"),
    ("clippy", "cargo clippy --all-targets --features solutions,mpi,nccl -- -D warnings, and the same for xtask"),
    ("train", "cargo run --release --features mpi,nccl --example train reaches its accuracy target"),
    ("mpi", "the same run as 2 processes: scripts/launch.sh -np 2 target/release/examples/train --backend mpi"),
];

/// The checks that build or run the crate, and so need libtorch.
const NEED_LIBTORCH: &[&str] = &["solutions", "teeth", "notebooks", "clippy", "train", "mpi"];

fn help() -> String {
    let mut text = String::from(
        "cargo xtask test: the ddp-workbook test suite (what scripts/test.sh and CI run)\n\n\
         Usage: cargo xtask test [--only CHECK[,CHECK...]] [--skip CHECK[,CHECK...]]\n\n\
         Checks, in the order they run (each runs even when an earlier one failed):\n",
    );
    for (name, what) in CHECKS {
        text.push_str(&format!("  {name:<10} {what}\n"));
    }
    text.push_str(
        "\nThe last line is the summary CI reads: N passed, N failed[, N skipped].\n\
         With CI set, hung steps are stopped (30 min for solutions and notebooks, 10 min\n\
         per chapter and for train); without it, a chapter whose exercise.rs you have\n\
         edited is skipped by teeth. Full logs: target/test-logs/.\n",
    );
    text
}

/// Which checks to run, from `test [--only A,B] [--skip C]`.
fn parse_args(args: &[String]) -> Result<Option<Vec<&'static str>>, String> {
    let mut args = args.iter();
    match args.next().map(String::as_str) {
        Some("test") => {}
        Some("-h" | "--help" | "help") | None => return Ok(None),
        Some(other) => return Err(format!("unknown command `{other}` (the only one is `test`)")),
    }
    let (mut only, mut skip) = (Vec::new(), Vec::new());
    while let Some(arg) = args.next() {
        let (flag, inline_value) = match arg.split_once('=') {
            Some((flag, value)) => (flag, Some(value.to_string())),
            None => (arg.as_str(), None),
        };
        let list = match flag {
            "-h" | "--help" => return Ok(None),
            "--only" => &mut only,
            "--skip" => &mut skip,
            _ => return Err(format!("unknown argument `{arg}`")),
        };
        let value =
            inline_value.or_else(|| args.next().cloned()).ok_or(format!("{flag} needs a list of checks"))?;
        for name in value.split(',').map(str::trim).filter(|name| !name.is_empty()) {
            let known = CHECKS.iter().find(|(check, _)| *check == name);
            let (check, _) =
                known.ok_or(format!("unknown check `{name}` (cargo xtask --help lists them)"))?;
            list.push(*check);
        }
    }
    let selected = CHECKS
        .iter()
        .map(|(name, _)| *name)
        .filter(|name| only.is_empty() || only.contains(name))
        .filter(|name| !skip.contains(name))
        .collect();
    Ok(Some(selected))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let selected = match parse_args(&args) {
        Ok(Some(selected)) => selected,
        Ok(None) => {
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
    let libtorch_ready = ctx.root.join(".cargo/libtorch.toml").is_file();
    if !libtorch_ready && selected.iter().any(|name| NEED_LIBTORCH.contains(name)) {
        println!("cargo xtask: libtorch is not set up in this checkout (.cargo/libtorch.toml is missing).");
        println!("    -> run scripts/setup.sh first; the checks that need it are not run");
        report.check("setup", Outcome::Fail, "run scripts/setup.sh");
    }
    for name in selected {
        if NEED_LIBTORCH.contains(&name) && !libtorch_ready {
            continue;
        }
        match name {
            "fmt" => tool_checks::fmt(&ctx, &mut report),
            "book" => tool_checks::book(&ctx, &mut report),
            "includes" => tool_checks::includes(&ctx, &mut report),
            "files" => files(&ctx, &mut report),
            "stubs" => stubs(&ctx, &mut report),
            "hints" => hints(&ctx, &mut report),
            "runner" => test_checks::runner(&ctx, &mut report),
            "solutions" => test_checks::solutions(&ctx, &mut report),
            "teeth" => test_checks::teeth(&ctx, &mut report),
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
    report.section("stubs: each exercise has its solution's doc comments and signatures");
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
    report.section("hints: every exercise has its graded hints, and the book shows them");
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
