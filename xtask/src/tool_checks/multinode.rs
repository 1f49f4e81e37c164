//! The `multinode` check. It runs
//! `tests/multinode.rs` (jobs on 2 nodes x 2 ranks that scripts/nodes.sh
//! makes on this machine: training, a killed remote rank, a downed link,
//! resume from rank 0's disk, --max-restarts), counted per test, one test
//! at a time. Where `scripts/nodes.sh check` says nodes cannot be made (not
//! root, no `ip`, a container without network namespaces), every test of
//! the file counts as skipped, each printed with that reason.
//! Run it: `cargo xtask test --only multinode`.

use std::fs::File;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::process::{self, describe_limit};
use crate::report::{Outcome, Report};
use crate::test_executables::{self as executables, describe_end, print_failures};
use crate::Context;

/// In CI, the longest the check may take, build included (it takes a few minutes).
const MULTINODE_LIMIT: Duration = Duration::from_secs(20 * 60);
const FEATURES: &[&str] = &["--features", "solutions,mpi,nccl", "--test", "multinode"];

pub fn multinode(ctx: &Context, report: &mut Report) {
    report.section(
        "cargo test --features solutions,mpi,nccl --test multinode (nodes made by scripts/nodes.sh)",
    );
    let log_path = ctx.log("multinode.log");
    let mut log = match File::create(&log_path) {
        Ok(file) => file,
        Err(error) => {
            return report.check("multinode", Outcome::Fail, &format!("{}: {error}", log_path.display()))
        }
    };
    let started = Instant::now();
    let time_left = || ctx.limit(MULTINODE_LIMIT).map(|limit| limit.saturating_sub(started.elapsed()));
    let built = executables::build(ctx, FEATURES, time_left(), &mut log, false);
    let Ok((build, outcome)) = built else {
        return report.check("multinode", Outcome::Fail, "could not start cargo");
    };
    let executable = outcome.executables_in_run_order().into_iter().find(|e| e.target_name == "multinode");
    let Some(executable) = executable.filter(|_| build.success() && outcome.success == Some(true)) else {
        executables::print_errors(&outcome, 40);
        let detail = "cargo test --no-run --features solutions,mpi,nccl --test multinode failed (see above)";
        return report.check("multinode", Outcome::Fail, detail);
    };

    if let Some(reason) = why_no_nodes(ctx) {
        let tests = list_tests(&executable.path);
        for name in &tests {
            println!("    skipped multinode  {name}: {reason}");
            report.name_skipped_test("multinode", name, &reason);
        }
        report.add_counts(0, 0, tests.len(), "multinode");
        let detail = format!("{} skipped (counted per test): {reason}", tests.len());
        return report.tally_line("multinode", &detail);
    }
    // One test at a time: the tests share the cluster and this machine's cores.
    let ran = executables::run(ctx, &executable, &["--test-threads=1"], time_left(), &mut log);
    let (finished, tally) = match ran {
        Ok(ran) => ran,
        Err(error) => {
            return report.check("multinode", Outcome::Fail, &format!("could not start it: {error}"))
        }
    };
    print_failures(&executable, &tally, 10, " --features solutions,mpi,nccl");
    for (name, reason) in &tally.ignored_tests {
        report.name_skipped_test("multinode", name, reason);
    }
    report.add_counts(tally.passed, tally.failed, tally.ignored, "multinode");
    if finished.timed_out {
        let detail =
            format!("stopped after {}: {}", describe_limit(MULTINODE_LIMIT), describe_end(&finished, &tally));
        return report.check("multinode", Outcome::Fail, &detail);
    }
    if !finished.success() && (tally.failed == 0 || !tally.finished) {
        process::print_last_lines(&tally.other_lines.join("\n"), 20);
        let detail = format!("the test executable crashed: {}", describe_end(&finished, &tally));
        return report.check("multinode", Outcome::Fail, &detail);
    }
    let detail = format!(
        "{} passed, {} failed (counted per test; {}s with the build, log: target/test-logs/multinode.log)",
        tally.passed,
        tally.failed,
        started.elapsed().as_secs()
    );
    report.tally_line("multinode", &detail);
}

/// Why nodes cannot be made here, in scripts/nodes.sh's words; `None` when they can.
fn why_no_nodes(ctx: &Context) -> Option<String> {
    let script = ctx.root.join("scripts/nodes.sh");
    match Command::new("bash").arg(&script).arg("check").output() {
        Ok(output) if output.status.success() => None,
        Ok(output) => {
            let said = String::from_utf8_lossy(&output.stdout).trim().to_string();
            Some(if said.is_empty() {
                String::from_utf8_lossy(&output.stderr).trim().to_string()
            } else {
                said
            })
        }
        Err(error) => Some(format!("cannot run {}: {error}", script.display())),
    }
}

/// The names of the tests in `executable` (libtest's `--list`).
fn list_tests(executable: &std::path::Path) -> Vec<String> {
    let listed = Command::new(executable).args(["--list", "--format", "terse"]).output();
    let listed =
        listed.map(|output| String::from_utf8_lossy(&output.stdout).into_owned()).unwrap_or_default();
    listed.lines().filter_map(|line| line.strip_suffix(": test")).map(str::to_string).collect()
}
