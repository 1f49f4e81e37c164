//! Unit tests of the notebook helpers' private parts: the text printed
//! under a cell (`report`), the output a rank wrote before it panicked
//! (`run_collecting_output`), and `median`. The public API is tested from
//! outside, in `tests/notebook.rs`; these stay here because they look at
//! what a notebook only sees printed.
//!
//! Run: `cargo test --lib notebook`

use super::report::report;
use super::*;
use crate::dist::RankFailure;

#[test]
fn the_report_lists_ranks_in_order_and_the_failure_after_them() {
    let texts = vec!["a\n".to_string(), "b".to_string(), String::new(), String::new()];
    let failed = RanksFailed::Ranks {
        failures: vec![(1, RankFailure::Panicked("boom".into()))],
        panic_locations: vec![(1, "cell_3.rs:3:5".into())],
        skipped: vec![3],
    };
    let text = report(&texts, &[3], Some(&failed));
    assert_eq!(
        text.lines().take(5).collect::<Vec<_>>(),
        ["── Rank 0 ──", "a", "── Rank 1 (failed) ──", "b", "── Rank 3 (skipped this closure) ──"],
        "rank 2 wrote nothing and did not fail: no heading"
    );
    assert_eq!(report(&texts[2..], &[], None), "", "silent ranks print nothing");
    let failure = text.lines().nth(5).unwrap_or_default();
    assert!(failure.starts_with("✗ 1 rank(s) failed"), "{text}");
    assert!(text.contains("first: rank 1 panicked: boom (in cell_3.rs:3:5)"), "{text}");
    let same = RanksFailed::Ranks {
        failures: vec![(2, RankFailure::Panicked("boom".into())), (0, RankFailure::Panicked("boom".into()))],
        panic_locations: vec![],
        skipped: vec![],
    };
    assert!(same.to_string().ends_with("then: rank 0 failed the same way as rank 2"), "{same}");
    assert!(text.contains("rank(s) [3] skipped"), "{text}");
}

#[test]
fn output_written_before_a_panic_survives_and_the_panic_becomes_an_error() {
    let (texts, _, result) = run_collecting_output(SpawnOptions::new(2), None, |pg, out| {
        writeln!(out, "rank {} before", pg.rank())?;
        if pg.rank() == 1 {
            todo!("exercise ch99: planted in a test");
        }
        // Rank 0 waits for rank 1 in a collective, which rank 1 never reaches.
        pg.barrier()?;
        writeln!(out, "rank 0 passed the barrier")?;
        Ok(())
    });
    assert_eq!(texts, ["rank 0 before\n", "rank 1 before\n"], "rank 0 cannot pass the barrier");
    let error = result.expect_err("rank 1 panicked, so the run must fail");
    assert_eq!(error.first_failed_rank(), Some(1));
    let message = error.to_string();
    assert!(message.contains("first: rank 1 panicked: not yet implemented: exercise ch99"), "{message}");
    assert!(message.contains(concat!(file!(), ":")), "the panic's location is kept: {message}");
    assert!(matches!(error.failure_of(0), Some(RankFailure::Error(_))), "{message}");
}

#[test]
fn median_time_runs_f_as_often_as_asked_and_takes_the_middle_time() {
    let mut calls = 0;
    median_time(3, || calls += 1);
    assert_eq!(calls, 3);
    let ms = Duration::from_millis;
    assert_eq!(median(vec![ms(5), ms(200), ms(1)]), ms(5), "one slow run must not be the median");
    assert_eq!(median(vec![ms(4), ms(2)]), ms(4));
}

#[test]
fn a_world_prints_each_ranks_lines_under_its_heading_in_rank_order() {
    let world = World::start(3).unwrap_or_else(|e| panic!("{e}"));
    let (text, values) = world.cell(&[0, 1, 2], |rank| {
        // Rank 0 writes last, rank 2 first: the text is still in rank order.
        std::thread::sleep(Duration::from_millis(20 * (2 - rank.rank() as u64)));
        writeln!(rank, "rank {} of {}", rank.rank(), rank.world_size())?;
        let out = rank.out();
        writeln!(out, "second line of rank {}", rank.rank())?;
        Ok(rank.rank() * 10)
    });
    assert_eq!(values.unwrap_or_else(|e| panic!("{e}")), [0, 10, 20]);
    let expected: String =
        (0..3).map(|r| format!("── Rank {r} ──\nrank {r} of 3\nsecond line of rank {r}\n")).collect();
    assert_eq!(text, expected);
    let (text, failed) =
        world.cell(&[1], |_rank| -> anyhow::Result<()> { anyhow::bail!("no data on rank 1") });
    assert!(failed.is_err());
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[..2], ["── Rank 0 (skipped this closure) ──", "── Rank 1 (failed) ──"], "{text}");
    assert!(
        text.ends_with(
            "Values that hold the old group (built from rank.pg() before this cell) must be built again.\n"
        ),
        "{text}"
    );
}
