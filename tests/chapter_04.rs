//! Chapter 04 tests: gradient accumulation and no_sync. N ranks, each running
//! k micro-batches per optimizer step, must stay bitwise identical, take the
//! same steps as one process on the whole global batch, and all-reduce k
//! times less often than a loop that syncs every micro-step.
//!
//! Your code:           `cargo test --test chapter_04`
//! The reference code:  `cargo test --features solutions --test chapter_04`
//! See the measured numbers: add `-- --nocapture`
//!
//! Why it is exact. A global batch of B rows = micro-batch m x k steps x N
//! ranks. Rank r's micro-batch j holds m rows and its loss is their mean,
//! L_rj. Divided by k, the k backward passes ADD UP in `.grad`:
//!     grad on rank r = (1/k) * (grad L_r1 + ... + grad L_rk),
//! the gradient of the mean over rank r's k*m rows. The all-reduce (SUM, then
//! / N) after the last micro-step averages that over the ranks: the gradient
//! of the mean over all N*k*m = B rows, which is what one process computes on
//! the whole batch. Only the order of the floating-point additions differs.
//!
//! Three files, one test binary:
//! - this file: the chapter's claims (k micro-steps on N ranks equal one
//!   step on the global batch, under SGD and Adam; k times fewer
//!   all-reduces) and the negative controls (forget / k, never sync);
//! - `chapter_04/training.rs`: the shared part: constants, the training
//!   loops, one process as the reference, the comparison;
//! - `chapter_04/edge_cases.rs`: `no_sync` restores the switch on every way
//!   out of its scope, and bad input gets a clear error.

// `#[path]`, because a module file directly in `tests/` would be built as a
// test binary of its own.
mod common;
#[path = "chapter_04/edge_cases.rs"]
mod edge_cases;
#[path = "chapter_04/training.rs"]
mod training;

use approx::abs_diff_eq;
use ddp_workbook::check::{max_reference_diff, max_replica_diff, snapshot};
use training::*;

#[test]
fn sgd_k_micro_steps_on_n_ranks_equal_one_step_on_the_global_batch() {
    for &(n, k) in SETUPS {
        check_against_one_process(n, k, Optim::Sgd, Loop::Chapter);
    }
}

#[test]
fn adam_k_micro_steps_on_n_ranks_equal_one_step_on_the_global_batch() {
    for &(n, k) in SETUPS {
        check_against_one_process(n, k, Optim::Adam, Loop::Chapter);
    }
}

#[test]
fn one_all_reduce_per_parameter_per_step_k_times_fewer_than_syncing_every_micro_step() {
    for &(n, k) in &[(2, 3), (3, 2)] {
        let chapter: Vec<u64> =
            train_ddp(n, k, Optim::Sgd, Loop::Chapter).iter().flatten().map(|s| s.all_reduces).collect();
        let every: Vec<u64> = train_ddp(n, k, Optim::Sgd, Loop::SyncEveryMicroStep)
            .iter()
            .flatten()
            .map(|s| s.all_reduces)
            .collect();
        let (total_chapter, total_every) = (chapter.iter().sum::<u64>(), every.iter().sum::<u64>());
        println!(
            "{n} ranks x {k} micro-steps, {STEPS} optimizer steps: all-reduces per rank per step {:?} with no_sync, \
             {:?} syncing every micro-step; totals over all ranks {total_chapter} vs {total_every} (ratio {})",
            &chapter[..STEPS], &every[..STEPS], total_every as f64 / total_chapter as f64
        );
        assert!(
            chapter.iter().all(|&c| c == PARAMS_WITH_GRAD),
            "{n} ranks x {k}: every rank must all-reduce each of the {PARAMS_WITH_GRAD} gradients exactly once per \
             optimizer step, but made {chapter:?} (rank by rank, step by step). Put micro-steps 1..k-1 inside \
             ddp.no_sync(), and close that scope before the last micro-step's backward (bind the guard to a \
             name: `let _ = ddp.no_sync();` drops it, and closes the scope, on the same line)"
        );
        assert!(
            every.iter().all(|&c| c == PARAMS_WITH_GRAD * k as u64),
            "the sync-every-micro-step loop: {every:?}"
        );
        assert_eq!(
            total_every,
            k as u64 * total_chapter,
            "no_sync must cut the all-reduces by exactly k = {k}"
        );
    }
    // Syncing every micro-step is not wrong, only k times the communication:
    // the average of sums that were already averaged is the same average.
    check_against_one_process(2, 3, Optim::Sgd, Loop::SyncEveryMicroStep);
}

#[test]
fn negative_control_forgetting_to_divide_by_k_makes_the_gradient_k_times_too_big() {
    let (n, k) = (2, 3);
    let (runs, reference) = (train_ddp(n, k, Optim::Sgd, Loop::ForgetToDivide), one_process(Optim::Sgd));
    // Step 1 starts from the same weights, so the k summed, undivided
    // micro-batch gradients are exactly k times the right gradient.
    let k_times_right: Vec<_> =
        reference[0].grads.iter().map(|(name, g)| (name.clone(), g * k as f64)).collect();
    let from_right = max_reference_diff(&runs[0][0].grads, &reference[0].grads);
    let from_k_times = max_reference_diff(&runs[0][0].grads, &k_times_right);
    let sgd_off = max_reference_diff(&runs[0][0].params, &reference[0].params);
    let mean_loss = runs.iter().map(|steps| steps[0].loss).sum::<f64>() / n as f64;
    println!(
        "without / k ({n} ranks x {k}): gradient {from_right:.3e} from the right one and {from_k_times:.3e} from k times it; \
         after one SGD step the weights are {sgd_off:.3e} off; loss {mean_loss:.6} = {:.3} x the right {:.6}",
        mean_loss / reference[0].loss, reference[0].loss
    );
    assert!(
        from_k_times <= k as f64 * TOLERANCE,
        "without / k the gradient should be k times the right one, but is {from_k_times:.3e} from it"
    );
    assert!(
        from_right > 1e6 * TOLERANCE,
        "without / k the gradient should be wrong, yet it is {from_right:.3e} from the right one"
    );
    assert!(
        sgd_off > 1e6 * TOLERANCE,
        "without / k the SGD step should be wrong, yet it is {sgd_off:.3e} off"
    );
    assert!(
        abs_diff_eq!(mean_loss, k as f64 * reference[0].loss, epsilon = k as f64 * TOLERANCE),
        "without / k the loss is k times the mean"
    );
    // The replicas still agree with each other: this bug does not show as drift.
    let last: Vec<_> = runs.iter().map(|steps| snapshot(&steps[STEPS - 1].params)).collect();
    assert_eq!(max_replica_diff(&last), 0.0, "the control's replicas should agree: only the scale is wrong");

    // Adam hides most of it: its step divides the gradient by the gradient's
    // own running size, so the factor k cancels except against Adam's eps.
    let adam = train_ddp(n, k, Optim::Adam, Loop::ForgetToDivide);
    let adam_off = max_reference_diff(&adam[0][0].params, &one_process(Optim::Adam)[0].params);
    println!(
        "without / k under Adam: the weights are only {adam_off:.3e} off after one step (SGD: {sgd_off:.3e})"
    );
    assert!(
        adam_off > TOLERANCE,
        "the test still sees the bug under Adam ({adam_off:.3e} > tolerance {TOLERANCE:.3e})"
    );
    assert!(
        adam_off < 1e-3 * sgd_off,
        "Adam should shrink the damage: {adam_off:.3e} vs SGD's {sgd_off:.3e}"
    );
}

#[test]
fn negative_control_without_any_sync_the_replicas_diverge() {
    for &(n, k) in &[(2, 3), (3, 2)] {
        let runs = train_ddp(n, k, Optim::Sgd, Loop::NeverSync);
        let reference = one_process(Optim::Sgd);
        let last: Vec<_> = runs.iter().map(|steps| snapshot(&steps[STEPS - 1].params)).collect();
        let drift = max_replica_diff(&last);
        let off = max_reference_diff(&last[0], &reference[STEPS - 1].params);
        println!(
            "{n} ranks x {k} WITHOUT any sync: replicas {drift:.3e} apart, rank 0 {off:.3e} from one process"
        );
        assert!(
            drift > 1e6 * TOLERANCE,
            "{n} ranks x {k}: without sync the replicas still agree to {drift:.3e}"
        );
        assert!(
            off > 1e6 * TOLERANCE,
            "{n} ranks x {k}: without sync rank 0 still matches one process to {off:.3e}"
        );
        assert!(runs.iter().flatten().all(|s| s.all_reduces == 0), "the control must not communicate");
    }
}
