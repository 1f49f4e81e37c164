//! Buckets that leave during backward (`ddp::Reducer`): the
//! overlapped sync equals the bucketed sync bitwise and one process within
//! TOLERANCE, buckets leave in order and the first before backward ends, a
//! parameter without a gradient fails on every rank by name (or, with
//! `find_unused_parameters`, one no rank used is left alone), a failed
//! backward on one rank fails the step on every rank, an unarmed backward
//! sends nothing, and
//! a model used in another order than it was registered in gets its buckets
//! re-planned after the first step, the same on every rank.
//!
//! Run: cargo test --test overlap

mod common;
#[path = "overlap/replan.rs"]
mod replan;

use std::time::Instant;

use common::{
    global_batches, mlp_with_an_unused_parameter, mse, run, train_single_process, Optim, TOLERANCE,
};
use ddp_workbook::check::{compare_to_reference, snapshot};
use ddp_workbook::data::Regression;
use ddp_workbook::ddp::{BucketCaps, GradientBuckets, Reducer, SimpleDistributedDataParallelism};
use ddp_workbook::dist::{tagged, Group};
use ddp_workbook::models::{named_parameters, Mlp};
use ddp_workbook::tch::nn::{Module, VarStore};
use ddp_workbook::tch::Kind;

const SIZES: &[i64] = &[4, 32, 32, 1];
const GLOBAL_BATCH: i64 = 12;
const STEPS: usize = 3;
const CAPS: BucketCaps = BucketCaps { cap_bytes: 4096, first_cap_bytes: 512 };

fn mlp() -> (VarStore, Mlp) {
    Mlp::seeded(5, SIZES, Kind::Double)
}

fn data() -> Regression {
    Regression::new(6, GLOBAL_BATCH * STEPS as i64, 4, 1, Kind::Double)
}

/// Trains STEPS steps on this rank's rows, syncing either overlapped or with
/// the chapter-5 bucketed sync after backward; the parameters after each step.
fn train(
    pg: Group,
    overlapped: bool,
    build: fn() -> (VarStore, Mlp),
    find_unused: bool,
) -> anyhow::Result<Vec<common::Named>> {
    let (vs, model) = build();
    let params = named_parameters(&vs);
    let mut optimizer = Optim::Adam.build(&vs)?;
    let buckets = GradientBuckets::plan(pg.as_ref(), &params, CAPS)?;
    anyhow::ensure!(buckets.layout().len() >= 3, "the test wants several buckets");
    let (rows, rank) = (GLOBAL_BATCH / pg.world_size() as i64, pg.rank() as i64);
    let mut after = vec![];
    if overlapped {
        let overlap = Reducer::new(pg.clone(), &params, buckets)?;
        for step in 0..STEPS as i64 {
            let (x, y) = data().batch(step * GLOBAL_BATCH + rank * rows, rows);
            optimizer.zero_grad();
            overlap.arm(format!("step {step}"));
            mse(&model.forward(&x), &y).backward();
            overlap.finish(find_unused, Ok(()))?;
            optimizer.step();
            after.push(snapshot(&params));
        }
    } else {
        for step in 0..STEPS as i64 {
            let (x, y) = data().batch(step * GLOBAL_BATCH + rank * rows, rows);
            optimizer.zero_grad();
            mse(&model.forward(&x), &y).backward();
            tagged(format!("step {step}"), || buckets.sync(pg.as_ref(), &params))?;
            optimizer.step();
            after.push(snapshot(&params));
        }
    }
    Ok(after)
}

#[test]
fn the_overlapped_step_equals_the_bucketed_step_bitwise_and_one_process_within_tolerance() {
    for world_size in [2, 3] {
        let overlapped = run(world_size, |pg| train(pg, true, mlp, false));
        let bucketed = run(world_size, |pg| train(pg, false, mlp, false));
        let reference = train_single_process(mlp, Optim::Adam, &global_batches(&data(), GLOBAL_BATCH, STEPS));
        for rank in 0..world_size {
            for step in 0..STEPS {
                for ((name, a), (_, b)) in overlapped[rank][step].iter().zip(&bucketed[rank][step]) {
                    assert!(
                        a.equal(b),
                        "{world_size} ranks, rank {rank}, step {}: `{name}` differs from the bucketed step",
                        step + 1
                    );
                }
                compare_to_reference(&overlapped[rank][step], &reference[step].params, TOLERANCE)
                    .unwrap_or_else(|report| panic!("rank {rank}, step {}: {report}", step + 1));
            }
        }
    }
}

#[test]
fn buckets_leave_in_bucket_order_and_the_first_before_backward_ends() {
    let per_rank = run(2, |pg| {
        let (vs, model) = mlp();
        let params = named_parameters(&vs);
        let buckets = GradientBuckets::plan(pg.as_ref(), &params, CAPS)?;
        let count = buckets.layout().len();
        let overlap = Reducer::new(pg.clone(), &params, buckets)?;
        let (x, y) = data().batch(pg.rank() as i64 * 6, 6);
        overlap.arm("step".into());
        mse(&model.forward(&x), &y).backward();
        let backward_ended = Instant::now();
        overlap.finish(false, Ok(()))?;
        let record = overlap.last_step();
        Ok((count, record, backward_ended))
    });
    for (rank, (count, record, backward_ended)) in per_rank.into_iter().enumerate() {
        let order: Vec<usize> = record.launches.iter().map(|l| l.bucket).collect();
        assert_eq!(order, (0..count).collect::<Vec<_>>(), "rank {rank}: buckets left in order {order:?}");
        assert!(
            record.launches[0].at < backward_ended,
            "rank {rank}: the first bucket left only after backward ended"
        );
        assert_eq!(
            record.ready_order.first(),
            Some(&((SIZES.len() - 2) * 2)),
            "rank {rank}: the last layer's weight is ready first ({:?})",
            record.ready_order
        );
    }
}

#[test]
fn a_parameter_without_a_gradient_fails_on_every_rank_by_name_unless_expected() {
    let outcomes = ddp_workbook::dist::spawn(2, |pg| {
        Ok(train(pg, true, || mlp_with_an_unused_parameter(5, SIZES), false).err().map(|e| e.to_string()))
    })
    .unwrap_or_else(|e| panic!("{e}"));
    for (rank, error) in outcomes.into_iter().enumerate() {
        let error = error.unwrap_or_else(|| panic!("rank {rank} should have failed"));
        assert!(
            error.contains("\"unused\"") && error.contains("find_unused_parameters: true"),
            "rank {rank}: {error}"
        );
        assert!(
            error.contains("invalid gradient sync at the end of backward:"),
            "rank {rank}: reads {error}"
        );
    }
    // With the option, a parameter no rank uses keeps no gradient: the
    // optimizer skips it, and every other parameter trains as without it.
    let (vs, _) = mlp_with_an_unused_parameter(5, SIZES);
    let initial = snapshot(&named_parameters(&vs));
    let unused_at_start = &initial.iter().find(|(n, _)| n == "unused").expect("the model has it").1;
    let expected = run(2, |pg| train(pg, true, || mlp_with_an_unused_parameter(5, SIZES), true));
    let reference = train_single_process(mlp, Optim::Adam, &global_batches(&data(), GLOBAL_BATCH, STEPS));
    for (rank, steps) in expected.iter().enumerate() {
        for (step, params) in steps.iter().enumerate() {
            let (unused, trained): (Vec<_>, Vec<_>) =
                snapshot(params).into_iter().partition(|(name, _)| name == "unused");
            assert!(unused[0].1.equal(unused_at_start), "rank {rank}, step {}: `unused` moved", step + 1);
            compare_to_reference(&trained, &reference[step].params, TOLERANCE)
                .unwrap_or_else(|report| panic!("rank {rank}, step {}: {report}", step + 1));
        }
    }
}

/// Rank 1's loss is not a scalar, so its backward fails before computing
/// anything; rank 0's succeeds. The wrapper with `find_unused_parameters`
/// must not let rank 0 step on (its gradient + rank 1's zeros) / 2.
#[test]
fn a_failed_backward_on_one_rank_fails_the_step_on_every_rank_naming_it() {
    let outcomes = ddp_workbook::dist::spawn(2, |pg| {
        let (vs, model) = mlp();
        let ddp = SimpleDistributedDataParallelism::with_bucket_caps(model, &vs, pg.clone(), CAPS)?
            .find_unused_parameters(true);
        let (x, y) = data().batch(pg.rank() as i64 * 6, 6);
        let prediction = ddp.forward(&x);
        let loss = if pg.rank() == 1 { (&prediction - &y).square() } else { mse(&prediction, &y) };
        Ok(ddp.backward(&loss).err().map(|e| e.to_string()))
    })
    .unwrap_or_else(|e| panic!("no rank may hang or panic: {e}"));
    let error =
        |rank: usize| outcomes[rank].clone().unwrap_or_else(|| panic!("rank {rank} must fail the step"));
    let (peer, failed) = (error(0), error(1));
    assert!(
        peer.contains("rank 1 returned an error from loss.backward()"),
        "rank 0 must name rank 1's failed backward: {peer}"
    );
    assert!(
        failed.contains("loss.backward()") && failed.starts_with("rank 1"),
        "rank 1 reports its own: {failed}"
    );
}

#[test]
fn an_unarmed_backward_sends_nothing_and_accumulates_locally() {
    let per_rank = run(2, |pg| {
        let (vs, model) = mlp();
        let params = named_parameters(&vs);
        let buckets = GradientBuckets::plan(pg.as_ref(), &params, CAPS)?;
        let overlap = Reducer::new(pg.clone(), &params, buckets)?;
        let (x, y) = data().batch(pg.rank() as i64 * 6, 6);
        let before = pg.stats().all_reduce;
        mse(&model.forward(&x), &y).backward(); // not armed: no_sync
        mse(&model.forward(&x), &y).backward();
        let during = pg.stats().all_reduce - before;
        let local = params[0].1.grad().copy();
        overlap.arm("sync".into());
        mse(&model.forward(&x), &y).backward();
        overlap.finish(false, Ok(()))?;
        Ok((during, local, pg.stats().all_reduce - before))
    });
    for (rank, (during, _, total)) in per_rank.iter().enumerate() {
        assert_eq!(*during, 0, "rank {rank}: all-reduces while not armed");
        assert!(*total > 0, "rank {rank}: the armed backward synced");
    }
    assert!(!per_rank[0].1.equal(&per_rank[1].1), "unsynced gradients stay each rank's own");
}

#[test]
fn a_second_wrapper_on_the_same_model_keeps_its_hooks_when_the_first_is_dropped() {
    let per_rank = run(2, |pg| {
        let (vs, model) = mlp();
        // Both wrap the variables of `vs` (the first with a stand-in module):
        // every parameter gets a hook from each.
        let stand_in = ddp_workbook::tch::nn::func(|x| x.shallow_clone());
        let first = SimpleDistributedDataParallelism::with_bucket_caps(stand_in, &vs, pg.clone(), CAPS)?;
        let second = SimpleDistributedDataParallelism::with_bucket_caps(model, &vs, pg.clone(), CAPS)?;
        drop(first); // must remove its own hooks, not the second's
        let (x, y) = data().batch(pg.rank() as i64 * 6, 6);
        second.backward(&mse(&second.forward(&x), &y))?;
        Ok(second.last_step())
    });
    for (rank, record) in per_rank.iter().enumerate() {
        let ended = record.backward_ended.expect("a synced step");
        assert!(
            !record.ready_order.is_empty() && record.launches[0].at < ended,
            "rank {rank}: the second wrapper's hooks must still fire during backward ({} gradients ready)",
            record.ready_order.len()
        );
    }
}
