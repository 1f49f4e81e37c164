//! The `teeth` check's verdict on a chapter's run on
//! the stubs: each test reaches the exercise (fails naming it) or is a
//! control (in a `mod controls`, passes); anything else is drift. And each
//! chapter's tests are the same in the stubs' build and the solutions',
//! down to a real crate with a test behind `#[cfg(feature = "solutions")]`.
//! Run: cargo test -p xtask --test teeth

use std::fs::{self, File};
use std::path::Path;

use xtask::libtest_json::SuiteTally;
use xtask::report::Report;
use xtask::teeth_check::{
    compare_builds, compare_chapter_builds, is_control, judge, listed_tests, OneBuildOnly, SOLUTIONS_FEATURES,
};
use xtask::test_executables::build;
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

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|name| name.to_string()).collect()
}

#[test]
fn the_test_list_is_read_from_libtests_terse_listing() {
    let listing = "shards::fits: test\ncontrols::fake_is_caught: test\nspeed: benchmark\n";
    assert_eq!(listed_tests(listing), names(&["controls::fake_is_caught", "shards::fits"]));
}

#[test]
fn a_test_in_one_build_only_is_drift_either_way() {
    let both = ["shards::fits", "controls::fake_is_caught"];
    let solutions = names(&[&both[..], &["training::only_with_solutions"]].concat());
    let stubs = names(&[&both[..], &["training::only_without"]].concat());
    let problems = compare_builds("chapter_11", &stubs, &solutions, &[]);
    assert_eq!(problems.len(), 2, "{problems:#?}");
    assert!(problems[0].starts_with("training::only_with_solutions: exists only with --features"));
    assert!(problems[0].contains("teeth never judges it"), "{}", problems[0]);
    assert!(problems[1].starts_with("training::only_without: exists only without --features"));
    assert!(problems[1].contains("the solutions run never runs it"), "{}", problems[1]);
    assert!(compare_builds("chapter_11", &stubs, &stubs, &[]).is_empty(), "equal lists are fine");
}

#[test]
fn only_a_listed_control_with_a_reason_may_be_in_one_build() {
    let stubs = names(&["shards::fits"]);
    let solutions = names(&["shards::fits", "controls::the_reference_tells_them_apart"]);
    let entry = |chapter, test, reason| OneBuildOnly { chapter, test, reason };
    let listed = [entry("chapter_11", "controls::the_reference_tells_them_apart", "needs the reference")];
    assert!(compare_builds("chapter_11", &stubs, &solutions, &listed).is_empty());
    // Listed for another chapter: not this one's.
    let elsewhere = [entry("chapter_12", "controls::the_reference_tells_them_apart", "needs the reference")];
    assert_eq!(compare_builds("chapter_11", &stubs, &solutions, &elsewhere).len(), 1);
    // No reason; not a control; stale (in both builds).
    let no_reason = [entry("chapter_11", "controls::the_reference_tells_them_apart", " ")];
    let problems = compare_builds("chapter_11", &stubs, &solutions, &no_reason);
    assert!(problems.len() == 1 && problems[0].contains("without a reason"), "{problems:#?}");
    let solutions = names(&["shards::fits", "shards::hidden"]);
    let not_control = [entry("chapter_11", "shards::hidden", "why not")];
    let problems = compare_builds("chapter_11", &stubs, &solutions, &not_control);
    assert!(problems.len() == 1 && problems[0].contains("not in a `mod controls`"), "{problems:#?}");
    let stale = [entry("chapter_11", "controls::gone", "was needed once")];
    let problems = compare_builds("chapter_11", &stubs, &stubs, &stale);
    assert!(
        problems.len() == 1 && problems[0].contains("in neither build: remove the entry"),
        "{problems:#?}"
    );
}

/// A crate laid out as the workbook is, with one chapter whose stub panics
/// naming its exercise and whose test `gated` exists only with the
/// solutions feature when `gate` is set.
fn write_chapter_crate(root: &Path, gate: bool) {
    fs::create_dir_all(root.join("src")).expect("a temporary folder");
    fs::create_dir_all(root.join("tests")).expect("a temporary folder");
    let features = "[features]\nsolutions = []\nmpi = []\nnccl = []\n";
    let manifest =
        format!("[package]\nname = \"tiny\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n{features}");
    fs::write(root.join("Cargo.toml"), manifest).expect("writes");
    let lib = "#[cfg(not(feature = \"solutions\"))]\npub fn exercise() -> u32 {\n    todo!(\"exercise ch01: exercise\")\n}\n\
               #[cfg(feature = \"solutions\")]\npub fn exercise() -> u32 {\n    1\n}\n";
    fs::write(root.join("src/lib.rs"), lib).expect("writes");
    let gate = if gate { "#[cfg(feature = \"solutions\")]\n" } else { "" };
    let tests = format!(
        "#[test]\nfn reaches() {{\n    assert_eq!(tiny::exercise(), 1);\n}}\n\n{gate}#[test]\nfn gated() {{\n    assert_eq!(tiny::exercise(), 1);\n}}\n"
    );
    fs::write(root.join("tests/chapter_01.rs"), tests).expect("writes");
}

#[test]
fn a_chapter_test_behind_the_solutions_feature_fails_teeth_in_a_real_build() {
    let root = std::env::temp_dir().join(format!("xtask-teeth-gated-{}", std::process::id()));
    let ctx = Context { root: root.clone(), log_dir: root.join("logs"), ci: true };
    write_chapter_crate(&root, true);
    fs::create_dir_all(&ctx.log_dir).expect("a temporary folder");
    let mut log = File::create(ctx.log("build.log")).expect("a log");
    let args = ["--test", "chapter_01"];
    let (_, stubs) = build(&ctx, &args, None, &mut log, false).expect("cargo starts");
    let (_, solutions) =
        build(&ctx, &["--features", SOLUTIONS_FEATURES, args[0], args[1]], None, &mut log, false)
            .expect("cargo starts");
    let problems =
        compare_chapter_builds(&ctx, "chapter_01", &stubs, &solutions).expect("both build and list");
    assert!(
        problems.len() == 1 && problems[0].starts_with("gated: exists only with --features"),
        "{problems:#?}"
    );
    let mut report = Report::new();
    xtask::teeth_check::teeth(&ctx, &mut report);
    assert_eq!(report.failed(), 1, "the gated test is never judged on the stubs: teeth must fail");
    // The control: the same chapter without the gate passes teeth.
    write_chapter_crate(&root, false);
    let mut report = Report::new();
    xtask::teeth_check::teeth(&ctx, &mut report);
    assert_eq!(report.failed(), 0, "without the gate both tests reach the exercise");
    let _ = fs::remove_dir_all(root);
}
