//! The `solutions` check (every test and doc test
//! passes against the reference solutions; the GPU tests run where a GPU is,
//! and are reported skipped with their reason elsewhere) and the `runner`
//! check (the xtask crate's own tests). Run one of them:
//! `cargo xtask test --only solutions`, `cargo xtask test --only runner`.
//! The `teeth` check is in teeth_check.rs.

use std::fs::File;
use std::io::Write;
use std::time::{Duration, Instant};

use crate::libtest_json::sum_test_result_lines;
use crate::process::{self, describe_limit};
use crate::report::{Outcome, Report};
use crate::test_executables::{
    self as executables, describe_end, print_errors, print_failures, print_ignored,
};
use crate::{gpu, Context};

/// In CI, the longest the whole solutions run may take (build, every test
/// executable, doc tests) before it counts as hung: it takes a few minutes.
const SOLUTIONS_LIMIT: Duration = Duration::from_secs(30 * 60);
/// In CI, the longest one chapter's tests may take on the stubs.
pub const CHAPTER_LIMIT: Duration = Duration::from_secs(10 * 60);

pub fn solutions(ctx: &Context, report: &mut Report) {
    report.section("cargo test --features solutions,mpi,nccl (all tests and doc tests, reference solutions)");
    let log_path = ctx.log("solutions.log");
    let mut log = match File::create(&log_path) {
        Ok(file) => file,
        Err(error) => {
            return report.check("solutions", Outcome::Fail, &format!("{}: {error}", log_path.display()))
        }
    };
    let deadline = ctx.ci.then(|| Instant::now() + SOLUTIONS_LIMIT);
    let time_left = || deadline.map(|at| at.saturating_duration_since(Instant::now()));
    let hung = format!("stopped after {}: it hangs", describe_limit(SOLUTIONS_LIMIT));

    let (build, outcome) =
        match executables::build(ctx, &["--features", "solutions,mpi,nccl"], time_left(), &mut log, true) {
            Ok(built) => built,
            Err(error) => {
                return report.check("solutions", Outcome::Fail, &format!("could not start cargo: {error}"))
            }
        };
    if build.timed_out {
        return report.check("solutions", Outcome::Fail, &format!("the build {hung}"));
    }
    if !build.success() || outcome.success != Some(true) {
        println!();
        print_errors(&outcome, 60);
        let detail =
            "cargo test --no-run --features solutions,mpi,nccl failed: a build error (see above), no test ran";
        return report.check("solutions", Outcome::Fail, detail);
    }

    let gpu = gpu::find_gpu();
    match &gpu {
        Some(found) => {
            let files: Vec<String> = gpu::GPU_TEST_TARGETS.iter().map(|t| format!("tests/{t}.rs")).collect();
            println!("GPU: {found}: the GPU tests ({}) run too, with --include-ignored", files.join(", "))
        }
        None => println!("GPU: none (no /dev/nvidia0, no GPU from nvidia-smi -L): the GPU tests are skipped, each with its reason"),
    }
    let (mut passed, mut failed, mut ignored) = (0, 0, 0);
    for executable in outcome.executables_in_run_order() {
        println!("     Running {} ({})", executable.cargo_selector(), ctx.display(&executable.path));
        let harness_args = gpu::harness_args(&executable.target_name, gpu.is_some());
        let (finished, tally) = match executables::run(ctx, &executable, &harness_args, time_left(), &mut log)
        {
            Ok(ran) => ran,
            Err(error) => {
                report.check(
                    "solutions",
                    Outcome::Fail,
                    &format!("could not start {}: {error}", executable.target_name),
                );
                continue;
            }
        };
        println!("        {} passed, {} failed, {} ignored", tally.passed, tally.failed, tally.ignored);
        print_ignored(&executable, &tally);
        for (name, reason) in &tally.ignored_tests {
            report.name_skipped_test(&executable.target_name, name, reason);
        }
        print_failures(&executable, &tally, 20, " --features solutions,mpi,nccl");
        (passed, failed, ignored) = (passed + tally.passed, failed + tally.failed, ignored + tally.ignored);
        if finished.timed_out {
            let detail =
                format!("{hung} ({}; the executables after it did not run)", describe_end(&finished, &tally));
            report.check("solutions", Outcome::Fail, &detail);
            break;
        }
        if !finished.success() && (tally.failed == 0 || !tally.finished) {
            // No failed test explains the exit status: the harness crashed.
            process::print_last_lines(&tally.other_lines.join("\n"), 20);
            let detail = format!("{} crashed: {}", executable.target_name, describe_end(&finished, &tally));
            report.check("solutions", Outcome::Fail, &detail);
        }
    }

    if time_left() != Some(Duration::ZERO) {
        let (doc_passed, doc_failed, doc_ignored) = doc_tests(ctx, report, time_left(), &mut log);
        (passed, failed, ignored) = (passed + doc_passed, failed + doc_failed, ignored + doc_ignored);
    }
    report.add_counts(passed, failed, ignored, "solutions");
    println!();
    let detail = format!("{passed} passed, {failed} failed, {ignored} skipped (ignored, each with its reason above; counted per test)");
    report.tally_line("solutions", &detail);
}

/// `cargo test --doc --features solutions,mpi,nccl`, counted from its `test result:`
/// lines (doc tests run inside rustdoc's own harness, with no JSON output).
fn doc_tests(
    ctx: &Context,
    report: &mut Report,
    limit: Option<Duration>,
    log: &mut File,
) -> (usize, usize, usize) {
    println!("   Doc-tests (cargo test --doc --features solutions,mpi,nccl)");
    let mut command = ctx.cargo();
    command.args(["test", "--doc", "--features", "solutions,mpi,nccl"]);
    let doc_log = ctx.log("solutions-doc.log");
    let _ = writeln!(log, "\n(doc tests: see {})", ctx.display(&doc_log));
    let captured = match process::run_logged(command, limit, &doc_log, true) {
        Ok(captured) => captured,
        Err(error) => {
            report.check("solutions", Outcome::Fail, &format!("could not start cargo test --doc: {error}"));
            return (0, 0, 0);
        }
    };
    let totals = sum_test_result_lines(&captured.output);
    if captured.finished.timed_out {
        let detail = format!("the doc tests stopped after {}: one hangs", describe_limit(SOLUTIONS_LIMIT));
        report.check("solutions", Outcome::Fail, &detail);
    } else if !captured.finished.success() && totals.1 == 0 {
        let detail =
            "cargo test --doc --features solutions,mpi,nccl failed outside any test (build error or crash, see above)";
        report.check("solutions", Outcome::Fail, detail);
    }
    totals
}

/// `runner`: the xtask crate's own tests (the parsers of this runner and of
/// `cargo workbook`), counted per test like the solutions.
pub fn runner(ctx: &Context, report: &mut Report) {
    report.section("cargo test -p xtask (the runner's and the workbook command's own tests)");
    let mut command = ctx.cargo();
    command.args(["test", "-p", "xtask"]);
    let captured = match process::run_logged(
        command,
        ctx.limit(Duration::from_secs(600)),
        &ctx.log("runner.log"),
        false,
    ) {
        Ok(captured) => captured,
        Err(error) => {
            return report.check("runner", Outcome::Fail, &format!("could not start cargo: {error}"))
        }
    };
    let (passed, failed, ignored) = crate::libtest_json::sum_test_result_lines(&captured.output);
    report.add_counts(passed, failed, ignored, "runner");
    if !captured.finished.success() && failed == 0 {
        process::print_last_lines(&captured.output, 30);
        return report.check(
            "runner",
            Outcome::Fail,
            "cargo test -p xtask failed outside any test (see above)",
        );
    }
    if failed > 0 {
        process::print_last_lines(&captured.output, 40);
    }
    report.tally_line(
        "runner",
        &format!("{passed} passed, {failed} failed, {ignored} ignored (counted per test)"),
    );
}
