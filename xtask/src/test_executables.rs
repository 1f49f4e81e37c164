//! Builds test executables through
//! `cargo test --no-run --message-format=json` and runs each one the way
//! `cargo test` would, but with libtest's JSON output, so that every test is
//! counted from its own event. Used by the `solutions` and `teeth` checks.

use std::fs::File;
use std::io::{self, Write};
use std::process::Command;
use std::time::Duration;

use crate::cargo_json::{BuildOutcome, TestExecutable};
use crate::libtest_json::{failure_excerpt, parse_event, SuiteTally, TestEvent};
use crate::process::{self, Finished, Stream, Streams};
use crate::Context;

/// Variables that `cargo run` gave this runner about the xtask package; a
/// test executable must not see them as if they described its own package.
const XTASK_PACKAGE_VARIABLES: &[&str] = &[
    "CARGO_PKG_NAME",
    "CARGO_PKG_VERSION",
    "CARGO_PKG_DESCRIPTION",
    "CARGO_CRATE_NAME",
    "CARGO_BIN_NAME",
    "CARGO_PRIMARY_PACKAGE",
    "CARGO_MANIFEST_PATH",
];

/// Builds the test executables of `cargo test --no-run <args>`; the build's
/// stderr and diagnostics go to `log`, and to our stdout when `echo` is set.
pub fn build(
    ctx: &Context,
    args: &[&str],
    limit: Option<Duration>,
    log: &mut File,
    echo: bool,
) -> io::Result<(Finished, BuildOutcome)> {
    let mut command = ctx.cargo();
    command.args(["test", "--no-run", "--message-format=json"]).args(args);
    writeln!(log, "$ {}", process::command_line(&command))?;
    let mut outcome = BuildOutcome::default();
    let finished = process::run_with_lines(command, Streams::Separate, limit, |stream, line| {
        let shown = match stream {
            Stream::Stdout => outcome.record(line), // JSON: only diagnostics are for people
            Stream::Stderr => Some(line.to_string()), // "Compiling ...", cargo's own errors
        };
        if let Some(text) = shown {
            let text = text.trim_end();
            let _ = writeln!(log, "{text}");
            if echo {
                println!("{text}");
            }
        }
    })?;
    Ok((finished, outcome))
}

/// Runs one test executable from the repository root, as `cargo test` does
/// (and with CARGO_MANIFEST_DIR, which some tests read), with libtest's JSON
/// output; `harness_args` go to libtest too (`--include-ignored`). The log
/// gets cargo's familiar lines: `test NAME ... ok`.
pub fn run(
    ctx: &Context,
    executable: &TestExecutable,
    harness_args: &[&str],
    limit: Option<Duration>,
    log: &mut File,
) -> io::Result<(Finished, SuiteTally)> {
    let mut command = Command::new(&executable.path);
    command.args(["--format", "json", "-Z", "unstable-options"]).args(harness_args);
    command.current_dir(&ctx.root).env("CARGO_MANIFEST_DIR", &ctx.root);
    // RUSTC_BOOTSTRAP lets a harness built by stable Rust accept the
    // `-Z unstable-options` that --format json needs. It is set here, for
    // this process only: cargo tracks it, and would rebuild everything if a
    // cargo command saw it.
    command.env("RUSTC_BOOTSTRAP", "1");
    for name in XTASK_PACKAGE_VARIABLES {
        command.env_remove(name);
    }
    writeln!(log, "\n     Running {} ({})", executable.cargo_selector(), ctx.display(&executable.path))?;
    let mut tally = SuiteTally::default();
    let finished = process::run_with_lines(command, Streams::Separate, limit, |stream, line| {
        match (stream, parse_event(line)) {
            (Stream::Stdout, Some(event)) => {
                write_event(log, &event);
                tally.record(event);
            }
            (_, _) => {
                let _ = writeln!(log, "{line}");
                if !line.trim().is_empty() {
                    tally.other_lines.push(line.to_string());
                }
            }
        }
    })?;
    let (passed, failed, ignored) = (tally.passed, tally.failed, tally.ignored);
    writeln!(log, "test result: {passed} passed; {failed} failed; {ignored} ignored")?;
    if !finished.success() {
        writeln!(log, "(the executable ended with {})", describe_end(&finished, &tally))?;
    }
    Ok((finished, tally))
}

fn write_event(log: &mut File, event: &TestEvent) {
    let _ = match event {
        TestEvent::Passed { name } => writeln!(log, "test {name} ... ok"),
        TestEvent::Ignored { name, reason } if reason.is_empty() => writeln!(log, "test {name} ... ignored"),
        TestEvent::Ignored { name, reason } => writeln!(log, "test {name} ... ignored, {reason}"),
        TestEvent::Failed { name, output } => {
            writeln!(log, "test {name} ... FAILED\n---- {name} output ----\n{}", output.trim_end())
        }
        _ => Ok(()),
    };
}

/// How a run that did not succeed ended, naming the tests it left running.
pub fn describe_end(finished: &Finished, tally: &SuiteTally) -> String {
    let mut words = process::describe_status(&finished.status);
    if finished.timed_out {
        words = "its time limit".to_string();
    }
    if !tally.running.is_empty() {
        let names: Vec<&str> = tally.running.iter().map(String::as_str).collect();
        words.push_str(&format!(", while running: {}", names.join(", ")));
    }
    words
}

/// Prints the first `count` failed tests' names and panic messages (the
/// whole output is in the log), indented, with the command that runs each
/// again (`extra_args`: ` --features solutions,mpi,nccl`).
pub fn print_failures(executable: &TestExecutable, tally: &SuiteTally, count: usize, extra_args: &str) {
    for (name, output) in tally.failures.iter().take(count) {
        println!("    FAILED  {}  {name}", executable.target_name);
        for line in failure_excerpt(output, 15).lines() {
            println!("        {line}");
        }
        let selector = executable.cargo_selector();
        println!("        (again: cargo test{extra_args} {selector} -- --exact {name})");
    }
    if tally.failures.len() > count {
        println!("    ... and {} more failed tests (see the log)", tally.failures.len() - count);
    }
}

/// Prints each ignored test with its reason, so that a skip is never silent.
pub fn print_ignored(executable: &TestExecutable, tally: &SuiteTally) {
    for (name, reason) in &tally.ignored_tests {
        let reason = if reason.is_empty() { "#[ignore] gives no reason" } else { reason.as_str() };
        println!("    skipped {}  {name}: {reason}", executable.target_name);
    }
}

/// Prints the first `count` lines of the rendered compiler errors.
pub fn print_errors(outcome: &BuildOutcome, count: usize) {
    let text = outcome.errors.join("\n");
    for line in text.lines().take(count) {
        println!("    {line}");
    }
}
