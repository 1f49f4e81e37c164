//! The `train` and `mpi` checks. Each
//! runs the real training run (in-process ranks, then 2 MPI processes) and
//! passes only when it reaches its accuracy target and its report says that
//! the replicas ended bitwise equal; `mpi` also compares its final state's
//! fingerprint with the in-process run's, when `train` ran before it.
//! Run them: `cargo xtask test --only train,mpi`.

use std::process::Command;
use std::sync::OnceLock;

use super::run_or_fail;
use crate::process::{self, describe_limit};
use crate::report::{Outcome, Report};
use crate::test_checks::CHAPTER_LIMIT;
use crate::Context;

/// The fingerprint of the in-process run's final state, for `mpi` to compare.
static IN_PROCESS_FINGERPRINT: OnceLock<String> = OnceLock::new();

/// The fingerprint in the run's `replicas: bitwise equal ... fingerprint 0x...`
/// line: the run prints it only after every rank's final state matched.
pub fn replicas_fingerprint(output: &str) -> Option<&str> {
    let line = output.lines().rev().find(|line| line.starts_with("replicas: bitwise equal"))?;
    let after = line.split("fingerprint ").nth(1)?;
    after.split([' ', ',']).next().filter(|word| word.starts_with("0x"))
}

pub fn train(ctx: &Context, report: &mut Report) {
    report
        .section("cargo run --release --features mpi,nccl --example train: the real run reaches its target");
    // The default run trains the tiny GPT on 2 ranks and exits 0 only when
    // its held-out accuracy reaches the stated target (its last line says
    // PASS). Its numbers are the same on every run; only the wall time varies.
    // With the `mpi` feature, so that the `mpi` check reuses this build.
    let mut command = ctx.cargo();
    command.args(["run", "--release", "--features", "mpi,nccl", "--example", "train"]);
    if let Some((verdict, fingerprint)) =
        training_run(ctx, report, "train", command, "the default training run")
    {
        report.check("train", Outcome::Ok, &format!("{verdict}; replicas equal, fingerprint {fingerprint}"));
        _ = IN_PROCESS_FINGERPRINT.set(fingerprint);
    }
}

pub fn train_mpi(ctx: &Context, report: &mut Report) {
    report.section(
        "scripts/launch.sh -np 2 target/release/examples/train --backend mpi: 2 processes reach the target",
    );
    // The README's launch command: the same run as `train`, as two
    // processes that mpirun starts and the MPI backend connects.
    let mut build = ctx.cargo();
    build.args(["build", "--release", "--features", "mpi,nccl", "--example", "train"]);
    let limit = ctx.limit(CHAPTER_LIMIT);
    let Some(built) = run_or_fail(report, "mpi", build, limit, ctx.log("mpi-build.log"), false) else {
        return;
    };
    if !built.finished.success() {
        process::print_last_lines(&built.output, 20);
        return report.check("mpi", Outcome::Fail, "the build failed (target/test-logs/mpi-build.log)");
    }
    let mut command = Command::new("bash");
    let launch = ["scripts/launch.sh", "-np", "2", "target/release/examples/train", "--backend", "mpi"];
    command.current_dir(&ctx.root).args(launch);
    let what = "the training run on 2 MPI processes";
    let Some((verdict, fingerprint)) = training_run(ctx, report, "mpi", command, what) else { return };
    // Same settings, same numbers: only the transport differs, and the sum
    // of two ranks' gradients is the same whichever way it travels.
    match IN_PROCESS_FINGERPRINT.get() {
        Some(in_process) if *in_process != fingerprint => {
            let detail = format!(
                "{what} ended in another state (fingerprint {fingerprint}) than the in-process run \
                 ({in_process}): the backends disagree on some result"
            );
            report.check("mpi", Outcome::Fail, &detail);
        }
        Some(_) => {
            let detail =
                format!("{verdict}; replicas equal, and equal to the in-process run's ({fingerprint})");
            report.check("mpi", Outcome::Ok, &detail);
        }
        None => {
            let detail = format!(
                "{verdict}; replicas equal, fingerprint {fingerprint} (not compared with the in-process \
                 run: the train check did not run)"
            );
            report.check("mpi", Outcome::Ok, &detail);
        }
    }
}

/// Runs a training command. On success returns its PASS line and its
/// replicas' fingerprint, for the caller's verdict; otherwise reports check
/// `name` failed (`what` names the run in the message), its log in `NAME.log`.
fn training_run(
    ctx: &Context,
    report: &mut Report,
    name: &str,
    command: Command,
    what: &str,
) -> Option<(String, String)> {
    let log = format!("{name}.log");
    let limit = ctx.limit(CHAPTER_LIMIT);
    let captured = run_or_fail(report, name, command, limit, ctx.log(&log), false)?;
    if captured.finished.success() {
        let verdict = captured.output.lines().rev().find(|line| line.starts_with("PASS")).unwrap_or("");
        if let Some(fingerprint) = replicas_fingerprint(&captured.output) {
            return Some((verdict.to_string(), fingerprint.to_string()));
        }
        process::print_last_lines(&captured.output, 10);
        let detail = format!(
            "{what} printed no `replicas: bitwise equal ... fingerprint` line: nothing proves that its \
             ranks ended in the same state (target/test-logs/{log})"
        );
        report.check(name, Outcome::Fail, &detail);
        return None;
    }
    process::print_last_lines(&captured.output, 30);
    let detail = if captured.finished.timed_out {
        format!("stopped after {}: {what} hangs", describe_limit(CHAPTER_LIMIT))
    } else {
        format!("{what} missed its target or failed, the replicas ending unequal included (target/test-logs/{log})")
    };
    report.check(name, Outcome::Fail, &detail);
    None
}

#[cfg(test)]
mod tests {
    use super::replicas_fingerprint;

    #[test]
    fn the_fingerprint_is_read_from_the_replicas_line_only() {
        let run = "step 600 | loss 0.0036\nreplicas: bitwise equal on all 2 rank(s), fingerprint \
                   0x00ab12cd34ef5678 (the final checkpoint's checksum: weights)\nPASS: reached";
        assert_eq!(replicas_fingerprint(run), Some("0x00ab12cd34ef5678"));
        assert_eq!(replicas_fingerprint("PASS: reached held-out accuracy 0.9994"), None);
        let failed = "error: training failed: rank 0 returned an error: the replicas differ after step 4";
        assert_eq!(replicas_fingerprint(failed), None);
    }
}
