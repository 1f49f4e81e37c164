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

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::time::Duration;

use ddp_workbook::ch04_accumulation::{
    accumulate_and_step, micro_batch_size, split_micro_batches, AccumulationError,
    SimpleDistributedDataParallelism,
};
use ddp_workbook::check::{
    compare_replicas, compare_to_reference, max_reference_diff, max_replica_diff, snapshot,
};
use ddp_workbook::data::Regression;
use ddp_workbook::dist::{spawn_with, Group, SpawnOptions};
use ddp_workbook::models::{named_parameters, Mlp};
use ddp_workbook::tch::nn::{self, Module, OptimizerConfig, VarStore};
use ddp_workbook::tch::{Kind, Reduction, Tensor};

const SIZES: &[i64] = &[4, 16, 1];
const MODEL_SEED: i64 = 3;
const DATA_SEED: i64 = 4;
/// Rows of one global batch: 12 = 2 rows x 3 steps x 2 ranks = 2 x 2 x 3 = 3 x 4 x 1.
const GLOBAL_BATCH: i64 = 12;
/// Optimizer steps per run.
const STEPS: usize = 4;
/// The MLP's 2 weights and 2 biases: each has a gradient after every step.
const PARAMS_WITH_GRAD: u64 = 4;
/// Largest absolute difference allowed between DDP and one process, in f64.
/// The maths is exact; only the order of additions differs (about 1e-16
/// relative). The measured differences are printed with `--nocapture`.
const TOLERANCE: f64 = 1e-10;
/// (world size N, accumulation steps k) pairs to test.
const SETUPS: &[(usize, i64)] = &[(1, 4), (2, 3), (3, 2)];

#[derive(Clone, Copy, Debug)]
enum Optim {
    Sgd,
    Adam,
}

impl Optim {
    fn build(self, vs: &VarStore) -> anyhow::Result<nn::Optimizer> {
        Ok(match self {
            Optim::Sgd => nn::Sgd::default().build(vs, 0.1)?,
            Optim::Adam => nn::Adam::default().build(vs, 0.01)?,
        })
    }
}

/// How each rank runs one optimizer step of k micro-steps.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Loop {
    /// Your `accumulate_and_step`: loss / k, sync on the last micro-step only.
    Chapter,
    /// Loss / k, but sync after every micro-step: right, and k times the talk.
    SyncEveryMicroStep,
    /// Negative control: the loss is NOT divided by k.
    ForgetToDivide,
    /// Negative control: every micro-step inside no_sync, no sync at all.
    NeverSync,
}

fn mse(prediction: &Tensor, target: &Tensor) -> Tensor {
    prediction.mse_loss(target, Reduction::Mean) // [] mean over the micro-batch
}

/// The loops other than the chapter's, written out for comparison.
fn other_step(
    ddp: &SimpleDistributedDataParallelism<Mlp>,
    opt: &mut nn::Optimizer,
    micro: &[(Tensor, Tensor)],
    how: Loop,
) -> anyhow::Result<f64> {
    let k = micro.len();
    let scale = if how == Loop::ForgetToDivide { 1.0 } else { 1.0 / k as f64 };
    opt.zero_grad();
    let mut rank_loss = 0.0;
    for (j, (x, y)) in micro.iter().enumerate() {
        let communicate = match how {
            Loop::SyncEveryMicroStep => true,
            Loop::ForgetToDivide => j + 1 == k,
            Loop::NeverSync | Loop::Chapter => false,
        };
        let loss = mse(&ddp.forward(x), y) * scale; // []
        if communicate {
            ddp.backward(&loss)?;
        } else {
            ddp.no_sync_scope(|| ddp.backward(&loss))?;
        }
        rank_loss += loss.double_value(&[]);
    }
    opt.step();
    Ok(rank_loss)
}

/// After one optimizer step: parameters, their gradients, the loss, and the
/// all-reduces this step made.
struct Step {
    params: Vec<(String, Tensor)>,
    grads: Vec<(String, Tensor)>,
    loss: f64,
    all_reduces: u64,
}

fn grads_of(params: &[(String, Tensor)]) -> Vec<(String, Tensor)> {
    snapshot(&params.iter().map(|(name, p)| (name.clone(), p.grad())).collect::<Vec<_>>())
}

fn run<T: Send>(world_size: usize, f: impl Fn(Group) -> anyhow::Result<T> + Sync) -> Vec<T> {
    let options = SpawnOptions::new(world_size).timeout(Duration::from_secs(20));
    spawn_with(options, f).unwrap_or_else(|e| panic!("{e}"))
}

/// Trains STEPS steps on `n` ranks with k micro-steps each; `per_rank[r][s]`.
fn train_ddp(n: usize, k: i64, optim: Optim, how: Loop) -> Vec<Vec<Step>> {
    run(n, |pg| {
        let data = Regression::new(DATA_SEED, GLOBAL_BATCH * STEPS as i64, 4, 1, Kind::Double);
        let (vs, model) = Mlp::seeded(MODEL_SEED, SIZES, Kind::Double);
        let mut opt = optim.build(&vs)?;
        let rank = pg.rank() as i64;
        let ddp = SimpleDistributedDataParallelism::new(model, &vs, pg)?;
        let mut steps = vec![];
        for step in 0..STEPS as i64 {
            // ANCHOR: accumulation_step
            let micro = micro_batch_size(GLOBAL_BATCH, n, k)?; // rows per micro-batch
            let rows = micro * k; // this rank's rows of the global batch
            let (x, y) = data.batch(step * GLOBAL_BATCH + rank * rows, rows); // [rows, 4], [rows, 1]
            let micro_batches = split_micro_batches(&x, &y, k)?; // k x ([micro, 4], [micro, 1])
            let before = ddp.process_group().stats().all_reduce;
            let loss = match how {
                Loop::Chapter => accumulate_and_step(&ddp, &mut opt, &micro_batches, mse)?,
                _ => other_step(&ddp, &mut opt, &micro_batches, how)?,
            };
            let all_reduces = ddp.process_group().stats().all_reduce - before;
            // ANCHOR_END: accumulation_step
            steps.push(Step {
                params: snapshot(ddp.parameters()),
                grads: grads_of(ddp.parameters()),
                loss,
                all_reduces,
            });
        }
        Ok(steps)
    })
}

/// One process, one model, all GLOBAL_BATCH rows per step.
fn train_single_process(optim: Optim) -> Vec<Step> {
    let data = Regression::new(DATA_SEED, GLOBAL_BATCH * STEPS as i64, 4, 1, Kind::Double);
    let (vs, model) = Mlp::seeded(MODEL_SEED, SIZES, Kind::Double);
    let mut opt = optim.build(&vs).expect("the optimizer builds");
    (0..STEPS as i64)
        .map(|step| {
            let (x, y) = data.batch(step * GLOBAL_BATCH, GLOBAL_BATCH); // [B, 4], [B, 1]
            opt.zero_grad();
            let loss = mse(&model.forward(&x), &y); // mean over all B rows
            loss.backward();
            opt.step();
            let params = named_parameters(&vs);
            Step {
                params: snapshot(&params),
                grads: grads_of(&params),
                loss: loss.double_value(&[]),
                all_reduces: 0,
            }
        })
        .collect()
}

/// Claims 1 and 2, after every step: bitwise replicas, and rank 0 equal to
/// one process (weights, gradients and loss). Returns the largest difference.
fn check_against_one_process(n: usize, k: i64, optim: Optim, how: Loop) -> f64 {
    let runs = train_ddp(n, k, optim, how);
    let reference = train_single_process(optim);
    let mut largest: f64 = 0.0;
    for s in 0..STEPS {
        let at = format!("{optim:?}, {n} rank(s) x {k} micro-step(s), after optimizer step {}", s + 1);
        let per_rank: Vec<_> = runs.iter().map(|steps| snapshot(&steps[s].params)).collect();
        compare_replicas(&per_rank, 0.0).unwrap_or_else(|report| {
            panic!(
                "{at}: {}",
                report.hint("sync on the last micro-step of EVERY optimizer step, on every rank")
            )
        });
        let hint = "divide every micro-batch's loss by k, and sync once, after the last micro-step";
        compare_to_reference(&runs[0][s].grads, &reference[s].grads, TOLERANCE)
            .unwrap_or_else(|report| panic!("{at}, the GRADIENTS: {}", report.hint(hint)));
        compare_to_reference(&per_rank[0], &reference[s].params, TOLERANCE)
            .unwrap_or_else(|report| panic!("{at}, the WEIGHTS: {}", report.hint(hint)));
        let mean_loss = runs.iter().map(|steps| steps[s].loss).sum::<f64>() / n as f64;
        let loss_diff = (mean_loss - reference[s].loss).abs();
        assert!(
            loss_diff <= TOLERANCE,
            "{at}: the returned losses average to {mean_loss}, one process has {}: return the SUM of \
             the k losses divided by k (this rank's mean loss)",
            reference[s].loss
        );
        largest = largest.max(max_reference_diff(&per_rank[0], &reference[s].params)).max(loss_diff);
    }
    println!("{how:?}, {optim:?} on {n} rank(s) x {k} micro-step(s): largest difference from one process over {STEPS} steps: {largest:.3e}");
    largest
}

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
             ddp.no_sync(), and close that scope before the last micro-step's backward"
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
    let (runs, reference) =
        (train_ddp(n, k, Optim::Sgd, Loop::ForgetToDivide), train_single_process(Optim::Sgd));
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
        (mean_loss - k as f64 * reference[0].loss).abs() <= k as f64 * TOLERANCE,
        "without / k the loss is k times the mean"
    );
    // The replicas still agree with each other: this bug does not show as drift.
    let last: Vec<_> = runs.iter().map(|steps| snapshot(&steps[STEPS - 1].params)).collect();
    assert_eq!(max_replica_diff(&last), 0.0, "the control's replicas should agree: only the scale is wrong");

    // Adam hides most of it: its step divides the gradient by the gradient's
    // own running size, so the factor k cancels except against Adam's eps.
    let adam = train_ddp(n, k, Optim::Adam, Loop::ForgetToDivide);
    let adam_off = max_reference_diff(&adam[0][0].params, &train_single_process(Optim::Adam)[0].params);
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
        let reference = train_single_process(Optim::Sgd);
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
            anyhow::ensure!(!on(), "inside no_sync the switch must be off");
        }
        anyhow::ensure!(on(), "after a no_sync block the switch must be back on");
        anyhow::ensure!(
            leave_early(&ddp).is_err() && on(),
            "after leaving no_sync through `?` the switch must be back on"
        );
        let caught = catch_unwind(AssertUnwindSafe(|| {
            let _guard = ddp.no_sync();
            // A panic that unwinds like `panic!` but skips the panic hook, so
            // that this expected panic prints no message or backtrace.
            resume_unwind(Box::new("a deliberate panic inside no_sync"));
        }));
        anyhow::ensure!(caught.is_err() && on(), "after a panic inside no_sync the switch must be back on");
        {
            let _outer = ddp.no_sync();
            {
                let _inner = ddp.no_sync();
                anyhow::ensure!(!on(), "inside nested no_sync scopes the switch must be off");
            }
            anyhow::ensure!(
                !on(),
                "closing an INNER no_sync must leave the switch off (return the previous state, not `true`)"
            );
        }
        anyhow::ensure!(on(), "closing the outer no_sync must turn the switch back on");
        ddp.set_require_backward_grad_sync(false);
        ddp.no_sync_scope(|| ());
        anyhow::ensure!(!on(), "no_sync opened while the switch was off must leave it off");
        ddp.set_require_backward_grad_sync(true);
        anyhow::ensure!(
            ddp.no_sync_scope(|| 7) == 7 && on(),
            "no_sync_scope must return the closure's value and restore"
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
            let result = accumulate_and_step(&ddp, &mut opt, &micro_batches, mse);
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
