//! Chapter 04 reference solution: the `no_sync` switch and the gradient
//! accumulation loop.
//!
//! Run the chapter's tests on it: `cargo test --features solutions --test chapter_04`

use std::cell::Cell;

use tch::nn::{self, Module};
use tch::Tensor;

use super::{check_micro_batches, AccumulationError, SimpleDistributedDataParallelism};

// ANCHOR: begin_no_sync
/// Turns the sync switch off and returns the state it had just before, which
/// the `NoSyncGuard` puts back when the scope ends.
pub fn begin_no_sync(require_sync: &Cell<bool>) -> bool {
    // Remember, do not assume: in a nested scope the switch is already off,
    // and the inner guard must give back "off", not "on".
    require_sync.replace(false)
}
// ANCHOR_END: begin_no_sync

// ANCHOR: accumulate_and_step
/// One optimizer step from k = `micro_batches.len()` micro-batches of this
/// rank: the gradients of all k add up in `.grad`, the ranks average them
/// once, after the last, and the optimizer steps. `loss_fn(prediction,
/// target)` returns a micro-batch's mean loss. Returns this rank's loss: the
/// mean over its k micro-batches.
pub fn accumulate_and_step<M: Module>(
    ddp: &SimpleDistributedDataParallelism<M>,
    optimizer: &mut nn::Optimizer,
    micro_batches: &[(Tensor, Tensor)],
    loss_fn: impl Fn(&Tensor, &Tensor) -> Tensor,
) -> Result<f64, AccumulationError> {
    // Refuse bad input before anything changes: no gradient, no step.
    let k = check_micro_batches(micro_batches)? as f64;
    let Some(((last_x, last_y), earlier)) = micro_batches.split_last() else {
        unreachable!("check_micro_batches refuses an empty list");
    };
    // backward ADDS to .grad, so the previous step's gradients must go.
    optimizer.zero_grad();
    let mut rank_loss = 0.0;
    {
        let _no_sync = ddp.no_sync(); // micro-steps 1 .. k-1: accumulate, send nothing
        for (x, y) in earlier {
            // Each micro-batch's mean loss / k: the k gradients then add up
            // to the gradient of the mean over all k micro-batches.
            let loss = loss_fn(&ddp.forward(x), y) / k; // []
            ddp.backward(&loss)?; // a `?` here still drops the guard
            rank_loss += loss.double_value(&[]);
        }
    } // _no_sync dropped: the switch is back to what it was (on, normally)
      // Micro-step k: this backward adds the last gradients, then averages the
      // sums over all ranks: one all-reduce per parameter for the whole step.
    let loss = loss_fn(&ddp.forward(last_x), last_y) / k; // []
    ddp.backward(&loss)?;
    rank_loss += loss.double_value(&[]);
    optimizer.step();
    Ok(rank_loss)
}
// ANCHOR_END: accumulate_and_step
