//! Unit tests of the libtest JSON reader and of
//! the `test result:` line summer. Run: cargo test -p xtask --test libtest_json

use xtask::libtest_json::{failure_excerpt, parse_event, sum_test_result_lines, SuiteTally, TestEvent};

/// What a harness run with `--format json -Z unstable-options` prints:
/// lines taken from a real run, one test of each outcome, one left running.
const RUN: &str = r#"{ "type": "suite", "event": "started", "test_count": 4 }
{ "type": "test", "event": "started", "name": "ring::sums" }
{ "type": "test", "event": "started", "name": "ring::fails" }
{ "type": "test", "event": "started", "name": "ring::hangs" }
{ "type": "test", "name": "ring::sums", "event": "ok" }
{ "type": "test", "name": "ring::fails", "event": "failed", "stdout": "thread 'ring::fails' panicked at src/ch01_collectives/exercise.rs:31:5:\nnot yet implemented: exercise ch01: ring_reduce_scatter\n" }
{ "type": "test", "name": "ring::slow", "event": "ignored", "message": "takes minutes" }
"#;

#[test]
fn events_are_read_by_kind() {
    let events: Vec<TestEvent> = RUN.lines().filter_map(parse_event).collect();
    assert_eq!(events[0], TestEvent::SuiteStarted { test_count: 4 });
    assert_eq!(events[1], TestEvent::Started { name: "ring::sums".into() });
    assert_eq!(events[4], TestEvent::Passed { name: "ring::sums".into() });
    assert!(
        matches!(&events[5], TestEvent::Failed { name, output } if name == "ring::fails" && output.contains("exercise ch01:"))
    );
    let slow = TestEvent::Ignored { name: "ring::slow".into(), reason: "takes minutes".into() };
    assert_eq!(events[6], slow);
}

#[test]
fn a_tally_counts_each_test_and_knows_which_are_still_running() {
    let mut tally = SuiteTally::default();
    RUN.lines().for_each(|line| tally.record_line(line));
    assert_eq!((tally.passed, tally.failed, tally.ignored), (1, 1, 1));
    assert_eq!(tally.running.iter().collect::<Vec<_>>(), ["ring::hangs"]);
    assert!(!tally.finished, "no closing suite event yet");
    assert!(tally.output_contains("exercise ch01:"));
    assert!(!tally.output_contains("exercise ch02:"));

    tally.record_line(r#"{ "type": "suite", "event": "failed", "passed": 1, "failed": 1, "ignored": 1, "measured": 0, "filtered_out": 0, "exec_time": 0.5 }"#);
    assert!(tally.finished);
}

#[test]
fn an_ignored_test_keeps_its_reason_and_one_without_says_so() {
    let mut tally = SuiteTally::default();
    tally.record_line(r#"{ "type": "test", "name": "nccl::two_gpus", "event": "ignored", "message": "needs a GPU: none here" }"#);
    tally.record_line(r#"{ "type": "test", "name": "slow", "event": "ignored" }"#);
    let expected = [("nccl::two_gpus", "needs a GPU: none here"), ("slow", "")];
    let got: Vec<(&str, &str)> = tally.ignored_tests.iter().map(|(n, r)| (n.as_str(), r.as_str())).collect();
    assert_eq!(got, expected);
    assert_eq!(tally.ignored, 2);
}

#[test]
fn a_should_panic_message_is_part_of_the_failure_output() {
    let line =
        r#"{ "type": "test", "name": "t", "event": "failed", "message": "test did not panic as expected" }"#;
    let Some(TestEvent::Failed { output, .. }) = parse_event(line) else { panic!("not a failure") };
    assert_eq!(output, "test did not panic as expected");
}

#[test]
fn lines_that_are_not_events_are_kept_as_output() {
    let mut tally = SuiteTally::default();
    tally.record_line("printed past the capture: exercise ch03: x");
    tally.record_line("");
    tally.record_line(r#"{ "type": "bench", "name": "b", "median": 1, "deviation": 0 }"#);
    assert_eq!(tally.other_lines, ["printed past the capture: exercise ch03: x"]);
    assert!(tally.output_contains("exercise ch03:"));
    assert_eq!(parse_event("not json"), None);
    assert_eq!(parse_event(r#"{"type": "test", "event": "timeout", "name": "t"}"#), Some(TestEvent::Other));
}

#[test]
fn test_result_lines_are_summed() {
    let output = "\
running 3 tests
test a ... ok
test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.01s

   Doc-tests ddp_workbook
test result: FAILED. 10 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out; finished in 4.20s
not a result: 99 passed; 99 failed
";
    assert_eq!(sum_test_result_lines(output), (13, 2, 1));
    assert_eq!(sum_test_result_lines(""), (0, 0, 0));
}

#[test]
fn a_failure_excerpt_keeps_the_panic_message_and_drops_the_backtrace() {
    let output = "\
some output first
thread 'a' (12) panicked at tests/chapter_03.rs:122:29:
rank 1 panicked: not yet implemented: exercise ch03: sync_gradients
stack backtrace:
   0: __rustc::rust_begin_unwind
note: Some details are omitted
";
    assert_eq!(
        failure_excerpt(output, 15),
        "thread 'a' (12) panicked at tests/chapter_03.rs:122:29:\nrank 1 panicked: not yet implemented: exercise ch03: sync_gradients"
    );
    assert_eq!(failure_excerpt("no panic\nat all\nhere", 2), "at all\nhere");
}
