//! Chapter 14 tests, part 6: the controls, which never run your code. They
//! check that the walk of `schedule.rs` passes the library's schedule and
//! names each mistake it looks for on a schedule built to make it: one that
//! forgets to free after forward, one that frees the root too early, one
//! that never prefetches, one that reduce-scatters inside `no_sync`.

use ddp_workbook::ch14_fsdp::{Action, FsdpSchedule, UnitAt};
use ddp_workbook::ddp::fsdp_schedule;

use super::schedule::walk;

fn library() -> FsdpSchedule {
    FsdpSchedule::default()
}

fn mistake(schedule: FsdpSchedule, reshard: bool, sync: bool) -> String {
    walk(schedule, 3, reshard, sync).expect_err("the walk must find the mistake")
}

#[test]
fn the_librarys_schedule_walks_clean() {
    for units in 1..=4 {
        for (reshard, sync) in [(true, true), (true, false), (false, true), (false, false)] {
            walk(library(), units, reshard, sync).unwrap_or_else(|m| panic!("the library's schedule {m}"));
        }
    }
}

#[test]
fn the_walk_names_each_mistake() {
    fn keeps_everything(_: UnitAt) -> Vec<Action> {
        vec![]
    }
    fn frees_the_root_too(at: UnitAt) -> Vec<Action> {
        if at.reshard_after_forward {
            vec![Action::Free(at.unit)]
        } else {
            vec![]
        }
    }
    fn only_gathers(at: UnitAt) -> Vec<Action> {
        vec![Action::Gather(at.unit)]
    }
    fn always_reduce_scatters(at: UnitAt) -> Vec<Action> {
        vec![Action::ReduceScatter(at.unit), Action::Free(at.unit)]
    }
    // Each message names the mistake, then the function at fault as "your
    // <function>": `cargo workbook test` shows and files a failure by that.
    let cases: [(FsdpSchedule, bool, &str, &str); 4] = [
        (
            FsdpSchedule { post_forward: keeps_everything, ..library() },
            true,
            "forgets to free",
            "post_forward",
        ),
        (
            FsdpSchedule { post_forward: frees_the_root_too, ..library() },
            true,
            "frees too early",
            "post_forward",
        ),
        (
            FsdpSchedule { pre_forward: only_gathers, ..library() },
            true,
            "never prefetches in forward",
            "pre_forward",
        ),
        (
            FsdpSchedule { pre_backward: only_gathers, ..library() },
            true,
            "never prefetches in backward",
            "pre_backward",
        ),
    ];
    for (schedule, reshard, name, fault) in cases {
        let message = mistake(schedule, reshard, true);
        assert!(message.starts_with(name), "expected a message naming `{name}`, got: {message}");
        assert!(message.contains(&format!("your {fault}")), "expected it to name `your {fault}`: {message}");
    }
    let message = mistake(FsdpSchedule { post_backward: always_reduce_scatters, ..library() }, true, false);
    assert!(message.starts_with("reduce-scatters inside no_sync"), "{message}");
    assert!(message.contains("your post_backward"), "{message}");
    let _ = fsdp_schedule::post_backward; // the library's, which the controls start from
}

#[test]
fn freeing_the_root_after_forward_is_filed_under_post_forward_in_words_that_agree() {
    // Freeing the root after forward used to be reported with "its
    // pre_forward" as the only function named, so the runner said "start
    // with `pre_forward`"; and the setting said "(1 units, ...)".
    fn frees_the_root_too(at: UnitAt) -> Vec<Action> {
        vec![Action::Free(at.unit)]
    }
    let schedule = FsdpSchedule { post_forward: frees_the_root_too, ..library() };
    let message = walk(schedule, 1, true, true).expect_err("the walk must find the mistake");
    let expected = "frees too early (or never gathers): unit 0's backward (lm_head) would run on freed \
                    parameters after post_forward(unit 0) (1 unit, reshard_after_forward=true, \
                    requires_gradient_sync=true): your post_forward freed it too early (post_forward(unit 0) \
                    returned Action::Free(0))";
    assert!(message.starts_with(expected), "expected it to start with\n{expected}\ngot\n{message}");
    assert!(!message.contains("your pre_forward"), "it must name only the function at fault: {message}");
}
