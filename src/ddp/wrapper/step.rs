//! Spoiler: this file holds the reference answer to chapter 4's
//! `accumulate_and_step` (`src/ch04_accumulation/exercise.rs`): `train_step`
//! is that loop. Working through the book? Write yours first; the book shows
//! the parts of this file you need, and the answer on the solution page.
//!
//! One optimizer step of the whole DDP loop, with gradient accumulation over
//! this rank's micro-batches: [`train_step`]. The training run
//! (`src/train/run.rs`) and the chapter-7 tests call it once per step, with
//! any optimizer that has the two methods of [`StepOptimizer`]: tch's
//! `nn::Optimizer` (below), the run's `AdamW`, or ZeRO's `ShardedAdamW`.

use tch::nn::{self, Module};
use tch::{TchError, Tensor};

use super::accumulation::check_micro_batch_sizes;
use super::{SimpleDistributedDataParallelism, StepOptimizer};
use crate::dist::DistError;

/// tch's optimizers read `.grad()` every step. (Their `step` panics on a
/// libtorch error; it has no fallible form.)
impl StepOptimizer for nn::Optimizer {
    fn zero_grad(&mut self) {
        nn::Optimizer::zero_grad(self);
    }

    fn step(&mut self) -> Result<(), TchError> {
        nn::Optimizer::step(self);
        Ok(())
    }
}

// ANCHOR: train_step
/// One optimizer step from this rank's micro-batches (lists of example
/// indices, e.g. consecutive chunks of `sampler.indices()`), all of the same
/// size. `micro_batch_loss(indices)` looks the rows up, runs
/// `ddp.forward` and returns their MEAN loss. The k = `micro_batches.len()`
/// gradients add up in `.grad`, the ranks average them once, after the last
/// micro-batch (one all-reduce per bucket), and the optimizer steps.
///
/// Returns this rank's loss, the mean over its micro-batches; for the
/// global batch's loss, pass it to `ddp.mean_over_ranks`.
pub fn train_step<M: Module, O: StepOptimizer>(
    ddp: &SimpleDistributedDataParallelism<M>,
    optimizer: &mut O,
    micro_batches: &[&[i64]],
    micro_batch_loss: impl FnMut(&[i64]) -> Tensor,
) -> Result<f64, DistError> {
    train_step_with(ddp, optimizer, micro_batches, micro_batch_loss, |_| {})
}

/// [`train_step`], calling `after_backward(i)` once micro-batch `i`'s
/// backward (and, for the last one, the sync) has returned: where a caller
/// times the phases of its steps, as the training run does.
pub fn train_step_with<M: Module, O: StepOptimizer>(
    ddp: &SimpleDistributedDataParallelism<M>,
    optimizer: &mut O,
    micro_batches: &[&[i64]],
    mut micro_batch_loss: impl FnMut(&[i64]) -> Tensor,
    mut after_backward: impl FnMut(usize),
) -> Result<f64, DistError> {
    check_micro_batches(ddp.rank(), micro_batches)?;
    let k = micro_batches.len();
    optimizer.zero_grad(); // backward ADDS to .grad: clear the last step's
    let mut rank_loss = 0.0;
    for (i, indices) in micro_batches.iter().enumerate() {
        // Divide by k: the k gradients then add up to the gradient of the
        // mean over all k micro-batches, not k times it.
        let loss = micro_batch_loss(indices) / k as f64; // []
        if i + 1 < k {
            let _no_sync = ddp.no_sync();
            ddp.backward(&loss)?; // accumulate on this rank; send nothing
        } else {
            ddp.backward(&loss)?; // accumulate, then average: one all-reduce per bucket
        }
        rank_loss += loss.double_value(&[]);
        after_backward(i);
    }
    ddp.optimizer_step(optimizer)?; // on the new buckets if the first sync re-planned them
    Ok(rank_loss)
}
// ANCHOR_END: train_step

/// `batch.rs`'s rule for micro-batches, for lists of indices (the rows of
/// their inputs and targets alike), as an error that names this rank.
fn check_micro_batches(rank: usize, micro_batches: &[&[i64]]) -> Result<(), DistError> {
    let sizes = micro_batches.iter().map(|m| (m.len() as i64, m.len() as i64)).collect();
    check_micro_batch_sizes(sizes).map(|_k| ()).map_err(|error| DistError::Invalid {
        rank,
        op: "train_step".into(),
        detail: error.to_string(),
    })
}
