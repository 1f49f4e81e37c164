//! Tests of the notebook helpers (`ddp_workbook::notebook`), through the
//! public API a notebook uses: every rank runs and the values come back in
//! rank order, a collective that some ranks skip fails naming a skipping
//! rank, bad arguments are clear errors.
//!
//! Run: `cargo test --test notebook`
//! (The private parts: `cargo test --lib notebook`; the module's doc test:
//! `cargo test --doc notebook`.)

use ddp_workbook::dist::ReduceOp;
use ddp_workbook::notebook::{on_ranks, on_some_ranks};
use ddp_workbook::tch::Tensor;

#[test]
fn every_rank_runs_and_values_come_back_in_rank_order() {
    let values = on_ranks(3, |pg, out| {
        let mut t = Tensor::from(pg.rank() as f64 + 1.0);
        pg.all_reduce(&mut t, ReduceOp::Sum)?;
        writeln!(out, "rank {} sees {}", out.rank(), t.double_value(&[]))?;
        Ok((pg.rank(), t.double_value(&[])))
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(values, vec![(0, 6.0), (1, 6.0), (2, 6.0)]);
}

#[test]
fn a_collective_on_some_ranks_only_fails_naming_the_rank_that_skipped() {
    let error = on_some_ranks(3, &[0, 1], |pg, _out| {
        let mut t = Tensor::from(1.0);
        pg.all_reduce(&mut t, ReduceOp::Sum)?;
        Ok(())
    })
    .expect_err("rank 2 skipped the all_reduce");
    let message = error.to_string();
    let rank0 = error.error_of(0).map(|e| format!("{e:#}")).unwrap_or_default();
    assert!(rank0.contains("all_reduce") && rank0.contains("rank 2"), "{message}");
    assert!(message.contains("rank(s) [2] skipped"), "{message}");
}

#[test]
fn without_a_collective_the_skipping_ranks_just_return_none() {
    let values = on_some_ranks(3, &[1], |pg, _out| Ok(pg.rank() * 10)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(values, vec![None, Some(10), None]);
}

#[test]
fn bad_arguments_are_clear_errors() {
    let no_ranks = on_ranks(0, |_pg, _out| Ok(())).expect_err("zero ranks");
    assert!(no_ranks.to_string().contains("at least one rank"), "{no_ranks}");
    let missing = on_some_ranks(2, &[0, 5], |_pg, _out| Ok(())).expect_err("rank 5 of 2");
    assert!(missing.to_string().contains("rank 5 does not exist"), "{missing}");
    let twice = on_some_ranks(3, &[1, 1], |_pg, _out| Ok(())).expect_err("rank 1 twice");
    assert!(twice.to_string().contains("listed twice"), "{twice}");
}
