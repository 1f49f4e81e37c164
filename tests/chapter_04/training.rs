//! Chapter 04 tests, shared part: the model, the data, the optimizers, and a
//! training loop that runs each optimizer step one of four ways (your
//! `accumulate_and_step`, sync on every micro-step, forget to divide by k,
//! never sync) and records what every rank did at every step; one process on
//! the whole global batch as the reference; and the check that compares them.
//!
//! Compiled into `cargo test --test chapter_04` (see `tests/chapter_04.rs`).

use approx::abs_diff_eq;
use ddp_workbook::ch04_accumulation::{
    learner, micro_batch_size, split_micro_batches, SimpleDistributedDataParallelism,
};
use ddp_workbook::check::{compare_replicas, compare_to_reference, max_reference_diff, snapshot};
use ddp_workbook::data::Regression;
use ddp_workbook::models::Mlp;
use ddp_workbook::tch::nn;
use ddp_workbook::tch::{Kind, Tensor};

use crate::common::{global_batches, gradients, train_single_process};

pub use crate::common::{mse, run, Optim, Step, TOLERANCE};

pub const SIZES: &[i64] = &[4, 16, 1];
pub const MODEL_SEED: i64 = 3;
pub const DATA_SEED: i64 = 4;
/// Rows of one global batch: 12 = 2 rows x 3 steps x 2 ranks = 2 x 2 x 3 = 3 x 4 x 1.
pub const GLOBAL_BATCH: i64 = 12;
/// Optimizer steps per run.
pub const STEPS: usize = 4;
/// The MLP's 2 weights and 2 biases: each has a gradient after every step.
pub const PARAMS_WITH_GRAD: u64 = 4;
/// (world size N, accumulation steps k) pairs to test.
pub const SETUPS: &[(usize, i64)] = &[(1, 4), (2, 3), (3, 2)];

/// How each rank runs one optimizer step of k micro-steps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Loop {
    /// Your `accumulate_and_step`: loss / k, sync on the last micro-step only.
    Chapter,
    /// Loss / k, but sync after every micro-step: right, and k times the talk.
    SyncEveryMicroStep,
    /// Negative control: the loss is NOT divided by k.
    ForgetToDivide,
    /// Negative control: every micro-step inside no_sync, no sync at all.
    NeverSync,
}

fn data() -> Regression {
    Regression::new(DATA_SEED, GLOBAL_BATCH * STEPS as i64, 4, 1, Kind::Double)
}

fn mlp() -> (nn::VarStore, Mlp) {
    Mlp::seeded(MODEL_SEED, SIZES, Kind::Double)
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

/// Trains STEPS steps on `n` ranks with k micro-steps each; `per_rank[r][s]`.
pub fn train_ddp(n: usize, k: i64, optim: Optim, how: Loop) -> Vec<Vec<Step>> {
    run(n, |pg| {
        let data = data();
        let (vs, model) = mlp();
        let mut opt = optim.build(&vs)?;
        let rank = pg.rank() as i64;
        let ddp = SimpleDistributedDataParallelism::new(model, &vs, pg)?;
        let mut steps = vec![];
        for step in 0..STEPS as i64 {
            let micro = micro_batch_size(GLOBAL_BATCH, n, k)?; // rows per micro-batch
            let rows = micro * k; // this rank's rows of the global batch
            let (x, y) = data.batch(step * GLOBAL_BATCH + rank * rows, rows); // [rows, 4], [rows, 1]
            let micro_batches = split_micro_batches(&x, &y, k)?; // k x ([micro, 4], [micro, 1])
            let before = ddp.stats().all_reduce;
            let loss = match how {
                Loop::Chapter => learner::accumulate_and_step(&ddp, &mut opt, &micro_batches, mse)?,
                _ => other_step(&ddp, &mut opt, &micro_batches, how)?,
            };
            let all_reduces = ddp.stats().all_reduce - before;
            steps.push(Step {
                params: snapshot(ddp.parameters()),
                grads: gradients(ddp.parameters()),
                loss,
                all_reduces,
            });
        }
        Ok(steps)
    })
}

/// One process, one model, all GLOBAL_BATCH rows per step.
pub fn one_process(optim: Optim) -> Vec<Step> {
    train_single_process(mlp, optim, &global_batches(&data(), GLOBAL_BATCH, STEPS))
}

/// Claims 1 and 2, after every step: bitwise replicas, and rank 0 equal to
/// one process (weights, gradients and loss). Returns the largest difference.
pub fn check_against_one_process(n: usize, k: i64, optim: Optim, how: Loop) -> f64 {
    let runs = train_ddp(n, k, optim, how);
    let reference = one_process(optim);
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
        let loss_diff = (mean_loss - reference[s].loss).abs(); // for the largest difference printed below
        assert!(
            abs_diff_eq!(mean_loss, reference[s].loss, epsilon = TOLERANCE),
            "{at}: the returned losses average to {mean_loss}, one process has {}: return the SUM of \
             the k losses divided by k (this rank's mean loss)",
            reference[s].loss
        );
        largest = largest.max(max_reference_diff(&per_rank[0], &reference[s].params)).max(loss_diff);
    }
    println!("{how:?}, {optim:?} on {n} rank(s) x {k} micro-step(s): largest difference from one process over {STEPS} steps: {largest:.3e}");
    largest
}
