//! The `teeth` check's verdict on a chapter's run on
//! the stubs: each test reaches the exercise (fails naming it) or is a
//! control (in a `mod controls`, passes); anything else is drift.
//! Run: cargo test -p xtask --test teeth

use xtask::libtest_json::SuiteTally;
use xtask::report::Report;
use xtask::teeth_check::{is_control, judge};
use xtask::Context;

const REACHES: &str = r#"{ "type": "test", "event": "failed", "name": "ring_sums", "stdout": "thread 'ring_sums' panicked at src/ch01_collectives/exercise.rs:41:5:\nnot yet implemented: exercise ch01: ring_reduce_scatter in src/ch01_collectives/exercise.rs\n" }"#;
const CONTROL_PASSES: &str =
    r#"{ "type": "test", "event": "ok", "name": "controls::a_fake_all_reduce_is_caught" }"#;
const FINISHED: &str = r#"{ "type": "suite", "event": "failed", "passed": 1, "failed": 1, "ignored": 0 }"#;

fn tally(lines: &[&str]) -> SuiteTally {
    let mut tally = SuiteTally::default();
    lines.iter().for_each(|line| tally.record_line(line));
    tally
}

#[test]
fn controls_are_the_tests_of_a_mod_controls() {
    assert!(is_control("controls::a_fake_all_reduce_is_caught"));
    assert!(is_control("training::controls::without_sync_the_replicas_drift"));
    assert!(!is_control("controls"), "a test named `controls` is not inside the module");
    assert!(!is_control("negative_controls::x") && !is_control("sampler::controls_x"));
}

#[test]
fn a_chapter_whose_tests_reach_the_exercise_or_are_controls_has_no_drift() {
    let teeth = judge("01", &tally(&[REACHES, CONTROL_PASSES, FINISHED]));
    assert!(teeth.drift.is_empty(), "{:#?}", teeth.drift);
    assert_eq!((teeth.reaching.len(), teeth.controls.len()), (1, 1));
    assert_eq!(
        teeth.counts("01"),
        "1 test reaches the exercise (each fails naming 'exercise ch01:'), 1 control passes"
    );
}

#[test]
fn a_test_that_passes_on_the_stubs_and_is_no_control_is_drift() {
    let passes = r#"{ "type": "test", "event": "ok", "name": "ring_checks_nothing" }"#;
    let teeth = judge("01", &tally(&[REACHES, passes, FINISHED]));
    assert_eq!(teeth.drift.len(), 1, "{:#?}", teeth.drift);
    assert!(
        teeth.drift[0].starts_with("ring_checks_nothing: passes on the untouched stubs"),
        "{:?}",
        teeth.drift
    );
}

#[test]
fn a_test_that_fails_without_naming_the_exercise_in_its_own_output_is_drift() {
    // Another test's output names the exercise; this one fails for its own reason.
    let fails_elsewhere =
        r#"{ "type": "test", "event": "failed", "name": "bad_fixture", "stdout": "No such file: data.bin" }"#;
    let teeth = judge("01", &tally(&[REACHES, fails_elsewhere, FINISHED]));
    assert_eq!(teeth.drift.len(), 1, "{:#?}", teeth.drift);
    assert!(teeth.drift[0].contains("bad_fixture: fails on the stubs without naming 'exercise ch01:'"));
    assert!(teeth.drift[0].contains("No such file: data.bin"), "the reason is shown: {:?}", teeth.drift);
}

#[test]
fn a_control_that_fails_on_the_stubs_is_drift() {
    let control_reaches = r#"{ "type": "test", "event": "failed", "name": "controls::uses_the_ring", "stdout": "not yet implemented: exercise ch01: ring_all_gather" }"#;
    let control_broken = r#"{ "type": "test", "event": "failed", "name": "controls::fake_is_caught", "stdout": "assertion failed: caught" }"#;
    let teeth = judge("01", &tally(&[REACHES, control_reaches, control_broken, FINISHED]));
    assert_eq!(teeth.drift.len(), 2, "{:#?}", teeth.drift);
    assert!(teeth
        .drift
        .iter()
        .any(|d| d.starts_with("controls::uses_the_ring: a control that reaches the exercise")));
    assert!(teeth
        .drift
        .iter()
        .any(|d| d.starts_with("controls::fake_is_caught: a control that fails on the stubs")));
}

#[test]
fn ignored_unfinished_and_unreached_are_drift_too() {
    let ignored = r#"{ "type": "test", "event": "ignored", "name": "slow", "message": "takes an hour" }"#;
    let started = r#"{ "type": "test", "event": "started", "name": "crashes" }"#;
    let teeth = judge("01", &tally(&[CONTROL_PASSES, ignored, started]));
    let names: Vec<&str> = teeth.drift.iter().map(|d| d.split(':').next().unwrap_or("")).collect();
    assert_eq!(names, ["slow", "crashes", "no test fails naming 'exercise ch01"], "{:#?}", teeth.drift);
}

#[test]
fn no_chapter_tests_at_all_fails_the_check() {
    let root = std::env::temp_dir().join(format!("xtask-teeth-empty-{}", std::process::id()));
    std::fs::create_dir_all(root.join("tests")).expect("a temporary folder");
    let ctx = Context { root: root.clone(), log_dir: root.join("logs"), ci: true };
    let mut report = Report::new();
    xtask::teeth_check::teeth(&ctx, &mut report);
    assert_eq!(report.failed(), 1, "no tests/chapter_NN.rs must fail, not pass silently");
    let _ = std::fs::remove_dir_all(root);
}
