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
    let cases: [(FsdpSchedule, bool, &str); 4] = [
        (FsdpSchedule { post_forward: keeps_everything, ..library() }, true, "forgets to free"),
        (FsdpSchedule { post_forward: frees_the_root_too, ..library() }, true, "frees too early"),
        (FsdpSchedule { pre_forward: only_gathers, ..library() }, true, "never prefetches in forward"),
        (FsdpSchedule { pre_backward: only_gathers, ..library() }, true, "never prefetches in backward"),
    ];
    for (schedule, reshard, name) in cases {
        let message = mistake(schedule, reshard, true);
        assert!(message.starts_with(name), "expected a message naming `{name}`, got: {message}");
    }
    let message = mistake(FsdpSchedule { post_backward: always_reduce_scatters, ..library() }, true, false);
    assert!(message.starts_with("reduce-scatters inside no_sync"), "{message}");
    let _ = fsdp_schedule::post_backward; // the library's, which the controls start from
}
