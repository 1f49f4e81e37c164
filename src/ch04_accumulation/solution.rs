//! Chapter 04 reference solution: the `no_sync` switch and the gradient
//! accumulation loop.
//!
//! Run the chapter's tests on it: `cargo test --features solutions --test chapter_04`

use std::cell::Cell;

use tch::nn::{self, Module};
use tch::Tensor;

use super::{check_micro_batches, AccumulationError, SimpleDistributedDataParallelism};

// ANCHOR: no_sync_scope
/// An open `no_sync` scope on the sync switch `require_sync` (PyTorch's
/// `require_backward_grad_sync`): while it lives, `backward` only adds to
/// `.grad` and sends nothing. Dropping it closes the scope, on every way out
/// of its block (the end, `return` or `?`, a panic unwinding through it), and
/// afterwards `backward` syncs exactly when it did before the scope opened.
/// Scopes nest, and a scope may open while the switch is already off.
#[must_use = "the scope closes when this value is dropped: bind it with `let _scope = ...;`"]
pub struct NoSyncScope<'a> {
    require_sync: &'a Cell<bool>,
    /// The switch's state when this scope opened: what closing puts back.
    /// Remembered, not assumed: inside an outer scope it is already off, and
    /// closing the inner scope must leave it off.
    was_on: bool,
}

/// Opens a `no_sync` scope on `require_sync`: see [`NoSyncScope`] for what
/// must hold while it is open and after it closes.
pub fn open_no_sync(require_sync: &Cell<bool>) -> NoSyncScope<'_> {
    let was_on = require_sync.replace(false); // off now; what it was, in one call
    NoSyncScope { require_sync, was_on }
}

impl Drop for NoSyncScope<'_> {
    fn drop(&mut self) {
        // Runs on every way out of the scope, a panic included: so the
        // restore lives here, not at the end of the caller's block. Only a
        // `Cell::set`, which cannot panic.
        self.require_sync.set(self.was_on);
    }
}
// ANCHOR_END: no_sync_scope

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
