//! Chapter 03 tests, the controls, which never run your code: training
//! without `sync_gradients` makes the replicas drift far beyond the
//! tolerance, so the checks of `tests/chapter_03.rs` cannot pass by
//! accident; a sync that forgets the division is far off with SGD and only
//! just beyond the tolerance with Adam, which is why the tests use both. Compiled
//! into `cargo test --test chapter_03` (libtest names it `controls::...`).
//! A control passes on the untouched stubs too; `cargo xtask test --only
//! teeth` checks that it does, and that every test outside `mod controls`
//! reaches your code.

use ddp_workbook::ch03_averaging::{LocalBackward, SimpleDistributedDataParallelism};
use ddp_workbook::check::{compare_to_reference, max_reference_diff, max_replica_diff, snapshot};
use ddp_workbook::dist::{DistError, ProcessGroup, ReduceOp};
use ddp_workbook::tch::Tensor;

use super::common::{global_batches, mse, run, train_single_process, Optim, TOLERANCE};
use super::{data, mlp, train_ddp, GLOBAL_BATCH, HINTS, STEPS};

#[test]
fn negative_control_without_sync_the_replicas_drift_apart() {
    for (world_size, optim) in [(2, Optim::Sgd), (3, Optim::Sgd), (2, Optim::Adam), (3, Optim::Adam)] {
        let runs = train_ddp(world_size, optim, false, mlp);
        let reference = train_single_process(mlp, optim, &global_batches(&data(), GLOBAL_BATCH, STEPS));
        let last: Vec<_> = runs.iter().map(|run| snapshot(&run.after_each_step[STEPS - 1])).collect();
        let drift = max_replica_diff(&last);
        let off = max_reference_diff(&last[0], &reference[STEPS - 1].params);
        println!("{optim:?} on {world_size} ranks WITHOUT sync: replicas {drift:e} apart, rank 0 {off:e} from one process");
        // Far beyond the tolerance: so the checks above cannot pass by accident.
        assert!(
            drift > 1e6 * TOLERANCE,
            "{optim:?}, {world_size} ranks: without sync the replicas still agree to {drift:e}"
        );
        assert!(
            off > 1e6 * TOLERANCE,
            "{optim:?}, {world_size} ranks: without sync rank 0 still matches one process to {off:e}"
        );
        assert!(
            runs.iter().all(|run| run.all_reduces.iter().all(|&n| n == 0)),
            "the control must not communicate"
        );
    }
}

/// The classic bug, on purpose: every gradient summed over the ranks and
/// never divided, so each rank steps with N times the mean gradient.
fn sync_without_the_division(pg: &dyn ProcessGroup, params: &[(String, Tensor)]) -> Result<(), DistError> {
    for (_, param) in params {
        let mut grad = param.grad();
        if grad.defined() {
            pg.all_reduce(&mut grad, ReduceOp::Sum)?;
        }
    }
    Ok(())
}

#[test]
fn negative_control_without_the_division_sgd_is_far_off_and_adam_barely() {
    // One step on 2 ranks, each on its own half of the first global batch.
    let reference = |optim| train_single_process(mlp, optim, &global_batches(&data(), GLOBAL_BATCH, 1));
    let off = |optim: Optim| {
        let per_rank = run(2, |pg| {
            let (vs, model) = mlp();
            let mut optimizer = optim.build(&vs)?;
            let ddp = SimpleDistributedDataParallelism::new(model, &vs, pg.clone())?;
            let rows = GLOBAL_BATCH / 2;
            let (x, y) = data().batch(pg.rank() as i64 * rows, rows);
            optimizer.zero_grad();
            ddp.backward_local(&mse(&ddp.forward(&x), &y))?;
            sync_without_the_division(pg.as_ref(), ddp.parameters())?;
            optimizer.step();
            Ok(snapshot(ddp.parameters()))
        });
        let expected = &reference(optim)[0].params;
        let report =
            compare_to_reference(&per_rank[0], expected, TOLERANCE).expect_err("the bug went unseen");
        println!("{optim:?} on 2 ranks, rank 0 after step 1: {}", report.hint(HINTS.reference));
        max_reference_diff(&per_rank[0], expected)
    };
    let (sgd, adam) = (off(Optim::Sgd), off(Optim::Adam));
    println!("without the division, after one step: SGD {sgd:.3e} from one process, Adam {adam:.3e}");
    // SGD steps with twice the gradient; Adam's update divides the gradient by
    // the root of its own running square, so doubling it changes the step only
    // through epsilon: a tolerance of 1e-6 would let the bug through there.
    assert!(sgd > 1e-2, "SGD: {sgd:e}");
    assert!(adam > 1e3 * TOLERANCE && adam < 1e-6, "Adam: {adam:e}");
}
