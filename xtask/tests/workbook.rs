//! xtask/tests/workbook.rs: the pieces of `cargo workbook`: reading the
//! hints, choosing the next one, naming a test as a claim, and finding the
//! chapters of this repository with their exercises and hints.
//! Run: cargo test -p xtask --test workbook

use xtask::libtest_json::SuiteTally;
use xtask::workbook::{self, hints, verdict};

const HINTS: &str = "<!-- a header comment -->

<!-- ANCHOR: plan-1 -->
**The idea.** Walk backwards.
<!-- ANCHOR_END: plan-1 -->

<!-- ANCHOR: plan-2 -->
**The API.**

- `Bucket::new`
<!-- ANCHOR_END: plan-2 -->

<!-- ANCHOR: sync-1 -->
Copy in, reduce, copy out.
<!-- ANCHOR_END: sync-1 -->
";

#[test]
fn hints_are_read_between_their_anchors_in_file_order() {
    let parsed = hints::parse(HINTS);
    let summary: Vec<(&str, usize)> = parsed.iter().map(|h| (h.function.as_str(), h.step)).collect();
    assert_eq!(summary, [("plan", 1), ("plan", 2), ("sync", 1)]);
    assert_eq!(parsed[1].text, "**The API.**\n\n- `Bucket::new`");
}

#[test]
fn the_next_hint_is_the_first_unseen_step_of_the_first_exercise_not_done() {
    let parsed = hints::parse(HINTS);
    let order = vec!["sync".to_string(), "plan".to_string()];
    let next = |seen_plan, seen_sync| {
        let seen = move |f: &str| if f == "plan" { seen_plan } else { seen_sync };
        hints::next(&parsed, &order, seen).map(|h| (h.function.clone(), h.step))
    };
    assert_eq!(next(0, 0), Some(("sync".into(), 1)), "the first exercise in the order first");
    assert_eq!(next(0, 1), Some(("plan".into(), 1)), "then the next exercise");
    assert_eq!(next(1, 1), Some(("plan".into(), 2)));
    assert_eq!(next(2, 1), None, "all seen");
}

#[test]
fn a_test_name_reads_as_the_claim_it_checks() {
    assert_eq!(verdict::claim("one_rank_is_exactly_one_process"), "one rank is exactly one process");
    assert_eq!(verdict::claim("sampler::every_epoch_is_new"), "every epoch is new (sampler)");
}

#[test]
fn this_repositorys_chapters_have_their_exercises_hints_and_pages() {
    let root = xtask::repo_root();
    let chapters = workbook::chapters(&root).expect("the chapters are readable");
    let numbers: Vec<&str> = chapters.iter().map(|c| c.number.as_str()).collect();
    assert_eq!(numbers, ["01", "02", "03", "04", "05", "06", "07"]);
    let ch03 = workbook::find(&chapters, "3").expect("`3` names chapter 03");
    assert_eq!(ch03.exercises, ["sync_gradients"]);
    assert_eq!(ch03.title, "Averaging gradients");
    assert!(workbook::find(&chapters, "chapter_07").is_some() && workbook::find(&chapters, "9").is_none());
    let (count, problems) = hints::check_all(&root).expect("the hints are readable");
    assert!(problems.is_empty(), "{problems:#?}");
    assert_eq!(
        count,
        3 * chapters.iter().map(|c| c.exercises.len()).sum::<usize>(),
        "three hints per exercise"
    );
}

#[test]
fn a_verdict_names_unwritten_exercises_once_instead_of_every_failure() {
    let root = xtask::repo_root();
    let chapters = workbook::chapters(&root).expect("the chapters are readable");
    let ch03 = workbook::find(&chapters, "03").expect("chapter 03");
    let mut tally = SuiteTally::default();
    for line in [
        r#"{ "type": "test", "event": "ok", "name": "negative_control" }"#,
        r#"{ "type": "test", "event": "failed", "name": "one_rank", "stdout": "not yet implemented: exercise ch03: sync_gradients in src/ch03_averaging/exercise.rs" }"#,
    ] {
        tally.record_line(line);
    }
    let lines = verdict::describe(ch03, &tally);
    assert!(lines[0].ends_with("1 of 2 claims hold"), "{lines:?}");
    assert!(lines.iter().any(|l| l.starts_with("not written yet: sync_gradients")), "{lines:?}");
}

#[test]
fn the_failure_shown_in_full_is_a_rule_not_a_negative_control() {
    let mut tally = SuiteTally::default();
    for line in [
        r#"{ "type": "test", "event": "failed", "name": "negative_control_every_rank_on_one_shard", "stdout": "far from rank 0's part" }"#,
        r#"{ "type": "test", "event": "failed", "name": "sampler::padding_is_strided", "stdout": "rank r takes positions r, r + n" }"#,
    ] {
        tally.record_line(line);
    }
    assert_eq!(verdict::most_telling_failure(&tally), Some(1), "the rule's own test explains the bug");
    let only_control = {
        let mut t = SuiteTally::default();
        t.record_line(r#"{ "type": "test", "event": "failed", "name": "negative_control_x", "stdout": "" }"#);
        t
    };
    assert_eq!(verdict::most_telling_failure(&only_control), Some(0));
}
