//! Chapter 04 tests, edge cases: the `no_sync` switch is restored on every
//! way out of its scope (the end of a block, `?`, a panic, nested scopes,
//! a scope opened while the switch was already off) and really decides
//! whether backward communicates; `accumulate_and_step` leaves the switch as
//! it found it, also when a backward fails; bad input gets a clear error,
//! before a weight or a gradient changes or a byte is sent.
//!
//! Compiled into `cargo test --test chapter_04` (see `tests/chapter_04.rs`).

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};

use ddp_workbook::ch04_accumulation::{
    learner, micro_batch_size, split_micro_batches, AccumulationError, LocalBackward,
    SimpleDistributedDataParallelism,
};
use ddp_workbook::check::{max_reference_diff, snapshot};
use ddp_workbook::models::Mlp;
use ddp_workbook::tch::{Device, Kind, Tensor};

use super::training::*;
use crate::common::gradients;

/// Opens a no_sync scope, then leaves it early through `?`.
fn leave_early(ddp: &SimpleDistributedDataParallelism<Mlp>) -> Result<(), String> {
    let _guard = ddp.no_sync();
    Err("an error in the middle of the scope".to_string())?;
    unreachable!("`?` returns before this line")
}

#[test]
fn no_sync_restores_the_previous_state_on_every_way_out() {
    run(2, |pg| {
        let (vs, model) = Mlp::seeded(MODEL_SEED, SIZES, Kind::Double);
        let ddp = SimpleDistributedDataParallelism::new(model, &vs, pg)?;
        let on = || ddp.require_backward_grad_sync();
        anyhow::ensure!(on(), "the switch must start on");
        {
            let _guard = ddp.no_sync();
            anyhow::ensure!(
                !on(),
                "your open_no_sync left the switch on: inside a no_sync scope backward must not sync"
            );
        }
        anyhow::ensure!(
            on(),
            "after a no_sync scope's block ended the switch was still off: your open_no_sync's NoSyncScope \
             must turn sync back on when it is dropped, or every later backward of this rank trains alone"
        );
        anyhow::ensure!(
            leave_early(&ddp).is_err() && on(),
            "after leaving a no_sync scope through `?` the switch was still off: your open_no_sync's \
             NoSyncScope must close on every way out of its block, `?` included"
        );
        let caught = catch_unwind(AssertUnwindSafe(|| {
            let _guard = ddp.no_sync();
            // A panic that unwinds like `panic!` but skips the panic hook, so
            // that this expected panic prints no message or backtrace.
            resume_unwind(Box::new("a deliberate panic inside no_sync"));
        }));
        anyhow::ensure!(
            caught.is_err() && on(),
            "after a panic unwound through a no_sync scope the switch was still off: your open_no_sync's \
             NoSyncScope must close on every way out of its block, a panic included"
        );
        {
            let _outer = ddp.no_sync();
            {
                let _inner = ddp.no_sync();
                anyhow::ensure!(
                    !on(),
                    "your open_no_sync turned the switch on in a scope nested in another: it must stay off"
                );
            }
            anyhow::ensure!(
                !on(),
                "closing an INNER no_sync scope turned the switch on, so the rest of the outer scope would \
                 sync: your open_no_sync's NoSyncScope must leave behind the state it found when it opened \
                 (off, inside an outer scope), not `on`"
            );
            // A panic out of an inner scope, caught inside the outer one.
            let caught = catch_unwind(AssertUnwindSafe(|| {
                let _inner = ddp.no_sync();
                resume_unwind(Box::new("a deliberate panic inside a nested no_sync"));
            }));
            anyhow::ensure!(
                caught.is_err() && !on(),
                "a panic out of an INNER no_sync scope, caught inside the outer one, turned the switch on: \
                 your open_no_sync's NoSyncScope must leave behind the state it found, on a panic too"
            );
        }
        anyhow::ensure!(
            on(),
            "closing the OUTER no_sync scope left the switch off: your open_no_sync's NoSyncScope must turn \
             sync back on when the outermost scope closes"
        );
        ddp.set_require_backward_grad_sync(false);
        ddp.no_sync_scope(|| ());
        anyhow::ensure!(
            !on(),
            "a no_sync scope opened while the switch was off turned it on when it closed: your \
             open_no_sync's NoSyncScope must leave behind the state it found, not `on`"
        );
        ddp.set_require_backward_grad_sync(true);
        anyhow::ensure!(
            ddp.no_sync_scope(|| 7) == 7 && on(),
            "no_sync_scope must return the closure's value, and your open_no_sync's NoSyncScope turn the \
             switch back on after it"
        );

        // And the switch really decides whether backward communicates.
        let all_reduces = || ddp.process_group().stats().all_reduce;
        let x = Tensor::ones([2, 4], (Kind::Double, ddp_workbook::tch::Device::Cpu)); // [2, 4]
        let before = all_reduces();
        ddp.no_sync_scope(|| ddp.backward(&ddp.forward(&x).sum(Kind::Double)))?;
        anyhow::ensure!(all_reduces() == before, "backward inside no_sync must not communicate");
        ddp.backward(&ddp.forward(&x).sum(Kind::Double))?;
        anyhow::ensure!(
            all_reduces() == before + PARAMS_WITH_GRAD,
            "backward outside no_sync: one all-reduce per gradient"
        );
        Ok(())
    });
}

#[test]
fn bad_input_gets_a_clear_error_not_a_panic() {
    // The arithmetic: 12 rows do not split over 2 ranks x 5 steps.
    let message =
        micro_batch_size(GLOBAL_BATCH, 2, 5).expect_err("12 rows over 2 x 5 must be refused").to_string();
    println!("micro_batch_size(12, 2, 5): {message}");
    assert!(
        message.contains("12 rows") && message.contains("10"),
        "the message must name the rows and the 2 x 5 = 10 parts: {message}"
    );
    assert!(matches!(micro_batch_size(GLOBAL_BATCH, 2, 0), Err(AccumulationError::NoMicroBatches { .. })));
    assert_eq!(micro_batch_size(GLOBAL_BATCH, 2, 3).ok(), Some(2));
    let rows_of_zeros = || {
        let options = (Kind::Double, ddp_workbook::tch::Device::Cpu);
        (Tensor::zeros([6, 4], options), Tensor::zeros([6, 1], options)) // [6, 4], [6, 1]
    };
    let (x, y) = rows_of_zeros();
    assert!(matches!(split_micro_batches(&x, &y, 0), Err(AccumulationError::NoMicroBatches { .. })));
    assert!(matches!(
        split_micro_batches(&x, &y, 4),
        Err(AccumulationError::Uneven { rows: 6, parts: 4, .. })
    ));
    assert!(
        matches!(split_micro_batches(&x, &y, 12), Err(AccumulationError::Uneven { .. })),
        "6 rows cannot make 12 non-empty micro-batches"
    );

    // The step itself: refused before it changes a weight or sends a byte.
    run(2, |pg| {
        let (vs, model) = Mlp::seeded(MODEL_SEED, SIZES, Kind::Double);
        let mut opt = Optim::Sgd.build(&vs)?;
        let ddp = SimpleDistributedDataParallelism::new(model, &vs, pg)?;
        let (before, calls) = (snapshot(ddp.parameters()), ddp.process_group().stats().all_reduce);
        let (x, y) = rows_of_zeros(); // Tensors are not Sync: each rank makes its own
        let unequal = vec![(x.narrow(0, 0, 4), y.narrow(0, 0, 4)), (x.narrow(0, 4, 2), y.narrow(0, 4, 2))];
        let mismatched = vec![(x.shallow_clone(), y.narrow(0, 0, 5))];
        for (what, micro_batches) in [
            ("no micro-batches", vec![]),
            ("micro-batches of 4 and 2 rows", unequal),
            ("6 inputs, 5 targets", mismatched),
        ] {
            let result = learner::accumulate_and_step(&ddp, &mut opt, &micro_batches, mse);
            let Err(error) = result else {
                anyhow::bail!("accumulate_and_step accepted {what}: call check_micro_batches first")
            };
            if ddp.process_group().rank() == 0 {
                println!("accumulate_and_step with {what}: {error}");
            }
        }
        anyhow::ensure!(
            max_reference_diff(ddp.parameters(), &before) == 0.0,
            "a refused step must not change the weights"
        );
        anyhow::ensure!(
            ddp.process_group().stats().all_reduce == calls,
            "a refused step must not communicate"
        );
        anyhow::ensure!(ddp.require_backward_grad_sync(), "a refused step must leave the sync switch on");
        Ok(())
    });
}

/// Three micro-batches of 2 rows of zeros, 3 x ([2, 4], [2, 1]): valid
/// input, made on each rank (tensors are not `Sync`).
fn three_micro_batches() -> Vec<(Tensor, Tensor)> {
    let options = (Kind::Double, Device::Cpu);
    (0..3).map(|_| (Tensor::zeros([2, 4], options), Tensor::zeros([2, 1], options))).collect()
}

#[test]
fn a_refused_step_leaves_the_gradients_alone() {
    run(2, |pg| {
        let (vs, model) = Mlp::seeded(MODEL_SEED, SIZES, Kind::Double);
        let mut opt = Optim::Sgd.build(&vs)?;
        let ddp = SimpleDistributedDataParallelism::new(model, &vs, pg)?;
        // Gradients from an earlier backward, which the caller may still want.
        let x = Tensor::ones([2, 4], (Kind::Double, Device::Cpu)); // [2, 4]
        ddp.backward_local(&ddp.forward(&x).sum(Kind::Double))?;
        let before = gradients(ddp.parameters());
        anyhow::ensure!(
            before.len() as u64 == PARAMS_WITH_GRAD,
            "the test's premise: every parameter has a gradient"
        );
        let mut unequal = three_micro_batches();
        unequal[2] = (unequal[2].0.narrow(0, 0, 1), unequal[2].1.narrow(0, 0, 1)); // 2, 2 and 1 rows
        for (what, micro_batches) in
            [("no micro-batches", vec![]), ("micro-batches of 2, 2 and 1 rows", unequal)]
        {
            let result = learner::accumulate_and_step(&ddp, &mut opt, &micro_batches, mse);
            anyhow::ensure!(
                result.is_err(),
                "accumulate_and_step accepted {what}: call check_micro_batches first"
            );
            let after = gradients(ddp.parameters());
            let changed =
                if after.len() == before.len() { max_reference_diff(&after, &before) } else { f64::NAN };
            anyhow::ensure!(
                changed == 0.0,
                "your accumulate_and_step, refusing {what}, changed the gradients ({} of {} still defined, \
                 largest change {changed:e}); the chapter expects them untouched, because bad input is refused \
                 before anything changes: call check_micro_batches before optimizer.zero_grad()",
                after.len(),
                before.len()
            );
        }
        Ok(())
    });
}

#[test]
fn accumulate_and_step_leaves_the_sync_switch_as_it_found_it() {
    run(2, |pg| {
        let (vs, model) = Mlp::seeded(MODEL_SEED, SIZES, Kind::Double);
        let mut opt = Optim::Sgd.build(&vs)?;
        let ddp = SimpleDistributedDataParallelism::new(model, &vs, pg)?;
        // A loss without autograd history: the first backward fails, on every
        // rank alike, in the middle of the micro-steps.
        let no_history = |prediction: &Tensor, target: &Tensor| mse(prediction, target).detach();
        let result = learner::accumulate_and_step(&ddp, &mut opt, &three_micro_batches(), no_history);
        let Err(error) = result else {
            anyhow::bail!("accumulate_and_step must pass on the error of a failing backward (`?`)")
        };
        anyhow::ensure!(
            ddp.require_backward_grad_sync(),
            "your accumulate_and_step returned an error from a failing backward ({error}) and left the sync \
             switch off; the chapter expects it back on, as it was, because the switch must end as it was \
             however the function returns, `?` included: hold a scope, `let _guard = ddp.no_sync();`, instead \
             of setting the switch by hand (if you do hold one, the NoSyncScope from open_no_sync is what left \
             it off: see no_sync_restores_the_previous_state_on_every_way_out)"
        );
        // Called inside the caller's own no_sync scope: it must stay off.
        let _outer = ddp.no_sync();
        learner::accumulate_and_step(&ddp, &mut opt, &three_micro_batches(), mse)?;
        anyhow::ensure!(
            !ddp.require_backward_grad_sync(),
            "your accumulate_and_step, called with the sync switch off (inside the caller's no_sync), turned it \
             on; the chapter expects it off, as it was, because the switch ends as it was: let a no_sync scope \
             close instead of turning the switch on by hand (if that is what you do, the NoSyncScope from \
             open_no_sync turned it on: see no_sync_restores_the_previous_state_on_every_way_out)"
        );
        Ok(())
    });
}
