//! Calls that pair up with the same operation, shape and dtype: what the
//! process group can and cannot tell apart. An untagged call is named by
//! the place it was made (file, line, column): a rank that skips a call, or
//! makes two same-shaped calls in another order, pairs calls made in
//! different places and gets a `Mismatch` naming both. What is still not
//! caught: two same-shaped calls made from the same place (one line in a
//! loop) with different data; tags exist for that. Tagged with
//! `dist::tagged`, such calls are a `Mismatch` on every rank, naming both.
//! Run: `cargo test --test dist tags`

use ddp_workbook::ddp::naive;
use ddp_workbook::dist::{tagged, DistError, ReduceOp};
use ddp_workbook::tch::{Kind, Tensor};

use super::{dist_error, run_err, run_ok, values, GENEROUS};

/// Rank `rank`'s tensor called `name`: "a" holds 1s, "b" holds 100s, times rank + 1.
fn named(name: &str, rank: usize) -> Tensor {
    let base = if name == "a" { 1.0 } else { 100.0 };
    Tensor::full([2], base * (rank + 1) as f64, (Kind::Double, ddp_workbook::tch::Device::Cpu))
}

#[test]
fn untagged_calls_in_another_order_from_one_place_pair_up_silently_which_is_why_tags_exist() {
    // The limitation the docs state: same operation, shape and dtype, made
    // from the same line, so the calls pair up and "a" on rank 0 is summed
    // with "b" on rank 1.
    let sums = run_ok(2, |pg| {
        let order = if pg.rank() == 0 { ["a", "b"] } else { ["b", "a"] };
        let mut first = named(order[0], pg.rank());
        pg.all_reduce(&mut first, ReduceOp::Sum)?;
        Ok(values(&first)[0])
    });
    assert_eq!(sums, vec![1.0 + 200.0; 2], "untagged, the backend cannot tell a from b");
}

/// Every rank's error is a Mismatch whose detail names both places.
fn assert_mismatch_names_both_sites(error: &ddp_workbook::dist::SpawnError) {
    for rank in 0..2 {
        match dist_error(error, rank) {
            DistError::Mismatch { detail, .. } => {
                let sites = detail.matches(" at tests/dist/tags.rs:").count();
                assert_eq!(sites, 2, "rank {rank}: the detail must name both calls' places: {detail}");
            }
            other => panic!("rank {rank}: expected a Mismatch, got {other}"),
        }
    }
}

#[test]
fn untagged_same_shaped_calls_from_two_places_in_another_order_are_a_mismatch() {
    let error = run_err(2, GENEROUS, |pg| {
        let (mut a, mut b) = (named("a", pg.rank()), named("b", pg.rank()));
        if pg.rank() == 0 {
            pg.all_reduce(&mut a, ReduceOp::Sum)?;
            pg.all_reduce(&mut b, ReduceOp::Sum)?;
        } else {
            pg.all_reduce(&mut b, ReduceOp::Sum)?;
            pg.all_reduce(&mut a, ReduceOp::Sum)?;
        }
        Ok(())
    });
    assert_mismatch_names_both_sites(&error);
}

#[test]
fn a_rank_that_skips_one_untagged_call_is_caught_at_that_call() {
    let error = run_err(2, GENEROUS, |pg| {
        let (mut a, mut b) = (named("a", pg.rank()), named("b", pg.rank()));
        if pg.rank() == 0 {
            pg.all_reduce(&mut a, ReduceOp::Sum)?; // rank 1 skips this one
        }
        pg.all_reduce(&mut b, ReduceOp::Sum)?;
        Ok(())
    });
    assert!(error.to_string().contains("call #0"), "{error}");
    assert_mismatch_names_both_sites(&error);
}

#[test]
fn tagged_calls_in_another_order_are_a_mismatch_on_every_rank() {
    let error = run_err(2, GENEROUS, |pg| {
        let order = if pg.rank() == 0 { ["a", "b"] } else { ["b", "a"] };
        for name in order {
            let mut t = named(name, pg.rank());
            tagged(name, || pg.all_reduce(&mut t, ReduceOp::Sum))?;
        }
        Ok(())
    });
    for rank in 0..2 {
        match dist_error(&error, rank) {
            DistError::Mismatch { detail, .. } => {
                assert!(detail.contains("tagged \"a\"") && detail.contains("tagged \"b\""), "{detail}");
            }
            other => panic!("rank {rank}: expected a Mismatch, got {other}"),
        }
    }
}

#[test]
fn a_rank_that_skips_one_tagged_call_is_caught_at_that_call() {
    let error = run_err(2, GENEROUS, |pg| {
        let names: &[&str] = if pg.rank() == 0 { &["a", "b"] } else { &["b"] };
        for name in names {
            let mut t = named(name, pg.rank());
            tagged(*name, || pg.all_reduce(&mut t, ReduceOp::Sum))?;
        }
        Ok(())
    });
    let message = error.to_string();
    assert!(message.contains("call #0") && message.contains("tagged \"b\""), "{message}");
}

#[test]
fn tags_nest_and_are_restored_after_a_panic() {
    let outer = tagged("sync 1", || {
        let inner = tagged("bucket 0", ddp_workbook::dist::current_tag);
        (inner, ddp_workbook::dist::current_tag())
    });
    assert_eq!(outer, (Some("sync 1, bucket 0".to_string()), Some("sync 1".to_string())));
    let _ = std::panic::catch_unwind(|| tagged("doomed", || panic!("on purpose")));
    assert_eq!(ddp_workbook::dist::current_tag(), None, "a panic inside `tagged` must not leave its tag set");
}

#[test]
fn the_naive_sync_names_its_calls_so_a_different_parameter_order_fails() {
    // Two same-shaped "gradients" walked in opposite orders by the library's
    // naive sync: without its tags this would average a with b.
    let error = run_err(2, GENEROUS, |pg| {
        let mut params = vec![];
        for name in ["a", "b"] {
            let param = named(name, 0).set_requires_grad(true);
            (&param * 1.0).sum(Kind::Double).backward(); // a gradient of ones
            params.push((name.to_string(), param));
        }
        if pg.rank() == 1 {
            params.reverse();
        }
        naive::sync_gradients(pg.as_ref(), &params)?;
        Ok(())
    });
    let message = error.to_string();
    assert!(message.contains("gradient of `a`") && message.contains("gradient of `b`"), "{message}");
}
