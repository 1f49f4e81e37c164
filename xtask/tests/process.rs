//! Unit tests of the command runner: merged and
//! separate output streams, and the time limit that stops a command together
//! with the processes it started. Run: cargo test -p xtask --test process

use std::process::Command;
use std::time::{Duration, Instant};

use xtask::process::{describe_status, run_with_lines, Stream, Streams};

fn shell(script: &str) -> Command {
    let mut command = Command::new("sh");
    command.args(["-c", script]);
    command
}

#[test]
fn merged_output_keeps_the_order_of_stdout_and_stderr() {
    let mut lines = Vec::new();
    let script = "echo one; echo two >&2; echo three";
    let finished = run_with_lines(shell(script), Streams::Merged, None, |stream, line| {
        lines.push((stream, line.to_string()));
    })
    .expect("sh runs");
    assert!(finished.success());
    let expected = ["one", "two", "three"].map(|line| (Stream::Stdout, line.to_string()));
    assert_eq!(lines, expected);
}

#[test]
fn separate_streams_say_where_each_line_came_from() {
    let mut stderr_lines = Vec::new();
    let finished =
        run_with_lines(shell("echo out; echo err >&2; exit 3"), Streams::Separate, None, |stream, line| {
            if stream == Stream::Stderr {
                stderr_lines.push(line.to_string());
            }
        })
        .expect("sh runs");
    assert_eq!(stderr_lines, ["err"]);
    assert!(!finished.success());
    assert_eq!(describe_status(&finished.status), "exit status 3");
}

#[test]
fn a_limit_stops_the_command_and_what_it_started() {
    let started = Instant::now();
    let mut lines = Vec::new();
    // The background sleep holds the output pipe open: only stopping the
    // whole process group lets the run end.
    let script = "echo started; sleep 60 & wait";
    let finished =
        run_with_lines(shell(script), Streams::Merged, Some(Duration::from_millis(500)), |_, line| {
            lines.push(line.to_string());
        })
        .expect("sh runs");
    assert!(finished.timed_out);
    assert!(!finished.success());
    assert_eq!(lines, ["started"]);
    assert!(started.elapsed() < Duration::from_secs(20), "took {:?}", started.elapsed());
}
