//! `cargo workbook test` shows the failure
//! that points at the learner's code most directly, not the first. The three
//! runs below are real: each is a reference solution broken on purpose in
//! one function, its chapter's tests run, and each failure kept with the
//! first line of its panic message. Before the ranking, the first failure
//! was shown, and it blamed another function or said nothing specific.
//! Run: cargo test -p xtask --test workbook_ranking

use xtask::libtest_json::SuiteTally;
use xtask::workbook::ranking::{pointing, rank_failures, Pointing};
use xtask::workbook::{self, verdict, Chapter};

fn chapter(number: &str) -> Chapter {
    let chapters = workbook::chapters(&xtask::repo_root()).expect("the chapters are readable");
    workbook::find(&chapters, number).expect("the chapter exists").clone()
}

/// A run's failures, in the order they failed: (test name, its message).
fn tally(failures: &[(&str, &str)]) -> SuiteTally {
    let mut tally = SuiteTally::default();
    for (name, message) in failures {
        let stdout = format!("thread '{name}' panicked at tests/common/mod.rs:69:9:\n{message}\n");
        let event = serde_like_json(name, &stdout);
        tally.record_line(&event);
    }
    tally
}

/// One libtest JSON event for a failed test (the runner's reader parses it).
fn serde_like_json(name: &str, stdout: &str) -> String {
    let escape = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
    format!(
        r#"{{ "type": "test", "event": "failed", "name": "{}", "stdout": "{}" }}"#,
        escape(name),
        escape(stdout)
    )
}

/// The test names in the order `cargo workbook test` lists them.
fn ranked_names(chapter: &Chapter, tally: &SuiteTally) -> Vec<String> {
    rank_failures(chapter, tally).iter().map(|r| tally.failures[r.index].0.clone()).collect()
}

#[test]
fn a_wrong_no_sync_scope_is_blamed_on_open_no_sync_not_on_accumulate_and_step() {
    // A NoSyncScope that turns the switch on when it closes, instead of
    // leaving the state it found.
    let ch04 = chapter("04");
    let run = tally(&[
        (
            "edge_cases::accumulate_and_step_leaves_the_sync_switch_as_it_found_it",
            "rank 0 returned an error: your accumulate_and_step, called with the sync switch off (inside the \
             caller's no_sync), turned it on",
        ),
        (
            "edge_cases::no_sync_restores_the_previous_state_on_every_way_out",
            "rank 0 returned an error: closing an INNER no_sync scope turned the switch on, so the rest of the \
             outer scope would sync: your open_no_sync's NoSyncScope must leave behind the state it found when \
             it opened (off, inside an outer scope), not `on`",
        ),
    ]);
    assert_eq!(
        ranked_names(&ch04, &run)[0],
        "edge_cases::no_sync_restores_the_previous_state_on_every_way_out",
        "both messages say `your ...`; open_no_sync comes first in the exercise, and accumulate_and_step \
         calls it through no_sync"
    );
    let lines = verdict::describe(&ch04, &run, 1);
    assert!(lines.iter().any(|l| l.contains("start with `open_no_sync`")), "{lines:#?}");
    assert!(lines.iter().any(|l| l.contains("`cargo workbook test 04 2` shows the next")), "{lines:#?}");
}

#[test]
fn a_wrong_bucket_order_is_blamed_on_the_order_not_on_the_first_cap_rule() {
    // plan_buckets with the right buckets, reversed. Every layout test says
    // so now; before, the first failure spoke of the caps.
    let ch05 = chapter("05");
    let order = "your plan_buckets planned the right buckets in the wrong order";
    let run = tally(&[
        ("layout_for_tiny_caps_is_the_one_the_chapter_explains", order),
        ("layout_rules::the_first_cap_stops_applying_the_moment_the_first_bucket_closes", order),
        ("plan_buckets_follows_the_three_rules_on_hand_made_sizes", order),
    ]);
    let first = &rank_failures(&ch05, &run)[0];
    assert_eq!((first.pointing, first.function.as_deref()), (Pointing::SaysYour, Some("plan_buckets")));
    let lines = verdict::describe(&ch05, &run, 1);
    assert!(lines.iter().any(|l| l.contains(order)), "{lines:#?}");
}

#[test]
fn a_division_before_the_wait_is_shown_by_the_test_that_diagnoses_it() {
    // finish_bucket dividing before work.wait(): the first failure was a
    // launch_bucket test whose message only said the mean was not 1.5.
    let ch06 = chapter("06");
    let run = tally(&[
        ("steps::launch_bucket_returns_before_the_all_reduce_has_finished", "rank 0: `w`'s gradient is the mean of 1 and 2"),
        (
            "training::no_sync_sends_nothing_and_accumulates_and_the_step_equals_one_process",
            "rank 0, 2 micro-batches, after step 2: the distributed model differs from the single-process reference",
        ),
        (
            "waiting::the_bucket_is_read_and_divided_only_where_the_all_reduce_cannot_overwrite_it",
            "rank 0's gradient is 3, the mean is 1.5. It is the sum, undivided: your launch_bucket or \
             finish_bucket divided while the all-reduce still owned the bucket",
        ),
    ]);
    let names = ranked_names(&ch06, &run);
    assert_eq!(
        names[0],
        "waiting::the_bucket_is_read_and_divided_only_where_the_all_reduce_cannot_overwrite_it"
    );
    assert_eq!(names[1], "steps::launch_bucket_returns_before_the_all_reduce_has_finished", "named after it");
    assert_eq!(names[2], "training::no_sync_sends_nothing_and_accumulates_and_the_step_equals_one_process");
    let second = verdict::describe(&ch06, &run, 2);
    assert!(second.iter().any(|l| l.contains("the mean of 1 and 2")), "failure 2 in full: {second:#?}");
    assert!(second.iter().any(|l| l.contains("`cargo workbook test 06 3` shows the next")), "{second:#?}");
}

#[test]
fn controls_rank_last_and_a_symptom_is_said_to_be_one() {
    let exercises = ["mark_ready".to_string(), "launch_bucket".to_string()];
    let levels = [
        ("controls::a_fake_sync_is_caught", "your mark_ready"),
        ("negative_control_without_sync", "your mark_ready"),
        ("replicas_match", "the replicas differ"),
        ("replicas_match", "mark_ready returned bucket 1"),
        ("mark_ready_lets_buckets_leave", "left: [2]"),
        ("training::steps", "your launch_bucket or your mark_ready"), // mark_ready comes first in the exercise
    ];
    let got: Vec<(Pointing, Option<String>)> =
        levels.iter().map(|(name, out)| pointing(&exercises, name, out)).collect();
    let mark = Some("mark_ready".to_string());
    assert_eq!(
        got,
        [
            (Pointing::Control, None),
            (Pointing::Control, None),
            (Pointing::Symptom, None),
            (Pointing::Mentions, mark.clone()),
            (Pointing::NamedAfter, mark.clone()),
            (Pointing::SaysYour, mark),
        ]
    );
}

/// Fails unless `fragment` is in the chapter test source `path`: the runs
/// below quote the chapter tests' messages, and must not outlive them.
fn quoted_from(path: &str, fragment: &str) {
    let source = std::fs::read_to_string(xtask::repo_root().join(path)).expect("the test source is readable");
    let joined: String = source.split("\\\n").map(str::trim_start).collect::<Vec<_>>().join("");
    assert!(joined.contains(fragment), "{path} no longer says {fragment:?}");
}

#[test]
fn a_hook_that_never_divides_is_first_told_it_returns_the_sum() {
    // bf16_compress_hook with no division, in the order the failures came on
    // a run where the bit-order test finished first. That test used to say
    // "rounded to bf16 once more than the all-reduce needs", a symptom tied
    // with the bound test's, so the order of finishing decided which showed.
    let ch12 = chapter("12");
    let sum = "did your bf16_compress_hook divide by the world size?";
    quoted_from("tests/chapter_12/arithmetic.rs", sum);
    quoted_from("tests/chapter_12.rs", "outside the bound before any question of roundings");
    let run = tally(&[
        (
            "the_mean_has_no_rounding_the_wire_does_not_need",
            &format!(
                "Float on 3 ranks, outside the bound before any question of roundings: element 4485 is \
                 4.9375e0 where the mean over 3 ranks is 1.6332736760377884e0: an error of 170.605 times the \
                 bound. It is the SUM of the 3 ranks' values: {sum}"
            ),
        ),
        (
            "the_mean_is_within_n_bf16_roundings_on_2_3_and_4_ranks",
            &format!(
                "Float on 2 ranks: element 7641 is -2.09375e0. It is the SUM of the 2 ranks' values: {sum}"
            ),
        ),
        (
            "training::each_step_is_within_the_bound_and_the_replicas_stay_bitwise_equal",
            &format!(
                "rank 2 returned an error: step 0: element 2553. It is the SUM of the 3 ranks' values: {sum}"
            ),
        ),
    ]);
    for ranked in rank_failures(&ch12, &run) {
        assert_eq!(ranked.pointing, Pointing::SaysYour, "{}", run.failures[ranked.index].0);
    }
    let lines = verdict::describe(&ch12, &run, 1);
    assert!(lines.iter().any(|l| l.contains(sum)), "{lines:#?}");
    assert!(lines.iter().any(|l| l.contains("start with `bf16_compress_hook`")), "{lines:#?}");
}

#[test]
fn avg_and_a_division_is_told_it_divided_twice() {
    // step_bucket reducing with ReduceOp::Avg and then dividing: the step
    // test used to restate the recipe; it now names the double division,
    // and the runs built on step_bucket quote it.
    let ch11 = chapter("11");
    let twice = "you divided twice: step_bucket reduced with ReduceOp::Avg, which already divides";
    quoted_from("tests/chapter_11/step_bucket.rs", twice);
    let quoted = format!("step_bucket's own test (one bucket on 3 ranks) fails: the first moments are not AdamW's with sum / N: {twice}");
    let run = tally(&[
        ("checkpoint::plain_adamw_resumes_from_the_gathered_checkpoint", &format!("saved by ZeRO-1 on 3 ranks: {quoted}")),
        (
            "step_bucket::step_bucket_averages_as_ddp_and_updates_the_bucket_in_place",
            &format!("step_bucket, one bucket of 10 elements on 3 ranks (tolerance 0): the first moments are not AdamW's with sum / N: {twice}"),
        ),
        ("training::zero_takes_the_steps_of_plain_ddp_and_of_one_process_on_2_3_and_4_ranks", &format!("Likely: {quoted}")),
    ]);
    assert_eq!(
        ranked_names(&ch11, &run)[0],
        "step_bucket::step_bucket_averages_as_ddp_and_updates_the_bucket_in_place"
    );
    let lines = verdict::describe(&ch11, &run, 1);
    assert!(lines.iter().any(|l| l.contains(twice)), "{lines:#?}");
    assert!(lines.iter().any(|l| l.contains("start with `step_bucket`")), "{lines:#?}");
}

#[test]
fn a_division_in_launch_bucket_is_filed_under_launch_bucket() {
    // launch_bucket dividing after all_reduce_async, finish_bucket not
    // dividing: the waiting test used to blame finish_bucket ("your
    // finish_bucket divided before work.wait() (or a launch_bucket ...)");
    // it now reads the bucket as launch_bucket left it, and names it.
    let ch06 = chapter("06");
    let launch = "your launch_bucket divided the bucket after all_reduce_async had started";
    quoted_from("tests/chapter_06/waiting.rs", launch);
    let run = tally(&[
        ("steps::launch_bucket_returns_before_the_all_reduce_has_finished", "rank 0: `w`'s gradient is the mean of 1 and 2"),
        (
            "training::the_overlapped_step_equals_chapter_5_and_one_process_and_the_replicas_each_other_bitwise",
            "2 ranks, Sgd, after step 1: your overlapped sync differs from chapter 5's bucketed sync",
        ),
        (
            "waiting::the_bucket_is_read_and_divided_only_where_the_all_reduce_cannot_overwrite_it",
            &format!(
                "rank 0's gradient is 3, the mean is 1.5. It is the sum, undivided: {launch} (it held 0.5 when \
                 launch_bucket returned, not this rank's 1)"
            ),
        ),
    ]);
    assert_eq!(
        ranked_names(&ch06, &run)[0],
        "waiting::the_bucket_is_read_and_divided_only_where_the_all_reduce_cannot_overwrite_it"
    );
    let lines = verdict::describe(&ch06, &run, 1);
    assert!(lines.iter().any(|l| l.contains("start with `launch_bucket`")), "{lines:#?}");
}

#[test]
fn a_root_freed_after_forward_is_blamed_on_post_forward_not_pre_forward() {
    // post_forward freeing the root too with reshard_after_forward: every
    // chapter 14 test walks the schedule first and fails with the walk's
    // message. It used to name no function with "your", and its only
    // mention was "its pre_forward", so the runner said "start with
    // `pre_forward`" under a message about post_forward.
    let ch14 = chapter("14");
    let culprit = "your post_forward freed it too early";
    quoted_from("tests/chapter_14/schedule.rs", "your {hook} freed it too early");
    let message = format!(
        "your schedule frees too early (or never gathers): unit 0's backward (lm_head) would run on freed \
         parameters after post_forward(unit 0) (1 unit, reshard_after_forward=true, \
         requires_gradient_sync=true): {culprit} (post_forward(unit 0) returned Action::Free(0)). A unit \
         must be gathered before it computes and freed only after, and nothing gathers the root (unit 0) \
         again between its forward and its backward: it has no pre-backward hook"
    );
    let run = tally(&[
        ("training::gpt_resharding_with_sgd_equals_ddp_bitwise_on_2_ranks", &message),
        ("schedule::your_schedule_gathers_before_compute_frees_after_and_prefetches", &message),
        ("wire::resharding_sends_one_and_a_half_times_ddps_all_reduce", &message),
    ]);
    let first = &rank_failures(&ch14, &run)[0];
    assert_eq!((first.pointing, first.function.as_deref()), (Pointing::SaysYour, Some("post_forward")));
    let lines = verdict::describe(&ch14, &run, 1);
    assert!(lines.iter().any(|l| l.contains("start with `post_forward`")), "{lines:#?}");
}
