//! Chapter 04 exercise: the `no_sync` switch and the gradient accumulation
//! loop. This is the file you edit.
//!
//! Check your work: `cargo test --test chapter_04`
//!
//! `SimpleDistributedDataParallelism::no_sync` in `mod.rs` calls your
//! `begin_no_sync` when a scope opens; the guard it returns puts the switch
//! back when the scope closes. The tests call your `accumulate_and_step` once
//! per optimizer step, on every rank.

use std::cell::Cell;

use tch::nn::{self, Module};
use tch::Tensor;

use super::{AccumulationError, SimpleDistributedDataParallelism};

// ANCHOR: begin_no_sync_stub
/// Turns the sync switch off and returns the state it had just before, which
/// the `NoSyncGuard` puts back when the scope ends.
#[allow(unused_variables)] // delete this line once you use the argument
pub fn begin_no_sync(require_sync: &Cell<bool>) -> bool {
    // TODO: open a no_sync scope. Afterwards the switch is off, and what you
    // return is what the guard writes back when the scope closes.
    // Keep: scopes nest. Inside an outer scope the switch is already off, and
    // closing an inner scope must leave it off; closing the outermost scope
    // turns it back on only if it was on when that scope opened.
    // Yours to decide: how you keep the previous state (a `Cell<bool>` can be
    // read, written, or both in one call: see its docs).
    // Stuck? `cargo workbook hint 04` gives hints one at a time.
    todo!("exercise ch04: begin_no_sync in src/ch04_accumulation/exercise.rs")
}
// ANCHOR_END: begin_no_sync_stub

// ANCHOR: accumulate_stub
/// One optimizer step from k = `micro_batches.len()` micro-batches of this
/// rank: the gradients of all k add up in `.grad`, the ranks average them
/// once, after the last, and the optimizer steps. `loss_fn(prediction,
/// target)` returns a micro-batch's mean loss. Returns this rank's loss: the
/// mean over its k micro-batches.
#[allow(unused_variables)] // delete this line once you use the arguments
pub fn accumulate_and_step<M: Module>(
    ddp: &SimpleDistributedDataParallelism<M>,
    optimizer: &mut nn::Optimizer,
    micro_batches: &[(Tensor, Tensor)],
    loss_fn: impl Fn(&Tensor, &Tensor) -> Tensor,
) -> Result<f64, AccumulationError> {
    // TODO: one optimizer step from k micro-batches of this rank. backward
    // ADDS to `.grad`, so the k gradients pile up there; they must add up to
    // the gradient of the mean loss over all k micro-batches, the ranks must
    // average them once, after the last backward, and then the optimizer
    // steps once.
    // Keep: bad input (no micro-batch, micro-batches of different sizes) is
    // refused before anything changes; the previous step's gradients play no
    // part; one all-reduce per parameter per optimizer step, not k (the tests
    // count them); the sync switch ends as it was, however the function
    // returns, `?` included; the returned loss is this rank's mean over its
    // k micro-batches.
    // Yours to decide: where the factor 1/k goes (the chapter shows what
    // happens without it), and how you keep the first k - 1 backward passes
    // from communicating while the last one does.
    // Available: `super::check_micro_batches`, `optimizer.zero_grad()` and
    // `.step()`, `ddp.forward`, `ddp.backward` (it syncs unless a no_sync
    // scope is open), `ddp.no_sync()`, `ddp.no_sync_scope(..)`.
    todo!("exercise ch04: accumulate_and_step in src/ch04_accumulation/exercise.rs")
}
// ANCHOR_END: accumulate_stub
