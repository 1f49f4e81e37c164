//! One optimizer step of the whole DDP loop, with gradient accumulation over
//! this rank's micro-batches. The training run (`src/train/run.rs`) and the
//! chapter-7 tests call it once per step.
//!
//! Tested by `cargo test --test chapter_07`.

use tch::nn::{self, Module};
use tch::Tensor;

use super::wrapper::SimpleDistributedDataParallelism;
use crate::dist::DistError;

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
pub fn train_step<M: Module>(
    ddp: &SimpleDistributedDataParallelism<M>,
    optimizer: &mut nn::Optimizer,
    micro_batches: &[&[i64]],
    mut micro_batch_loss: impl FnMut(&[i64]) -> Tensor,
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
    }
    optimizer.step();
    Ok(rank_loss)
}
// ANCHOR_END: train_step

/// At least one micro-batch, all of the same non-zero size: dividing each
/// micro-batch's mean loss by k gives the mean over all rows only then.
fn check_micro_batches(rank: usize, micro_batches: &[&[i64]]) -> Result<(), DistError> {
    let sizes: Vec<usize> = micro_batches.iter().map(|m| m.len()).collect();
    if sizes.is_empty() || sizes[0] == 0 || sizes.iter().any(|&s| s != sizes[0]) {
        let detail = format!(
            "the micro-batches must be at least one, all of the same non-zero size; got sizes {sizes:?}. \
             Cut this rank's indices with `chunks_exact(micro_batch)` and skip what is left over \
             (every rank gets the same count from a DistributedSampler, so all skip alike)"
        );
        return Err(DistError::Invalid { rank, op: "train_step".into(), detail });
    }
    Ok(())
}
