//! Chapter 04 exercise: the `no_sync` switch and the gradient accumulation
//! loop. This is the file you edit.
//!
//! Check your work: `cargo test --test chapter_04`
//!
//! `AccumulatingDdp::no_sync` in `mod.rs` calls your
//! `begin_no_sync` when a scope opens; the guard it returns puts the switch
//! back when the scope closes. The tests call your `accumulate_and_step` once
//! per optimizer step, on every rank.

use std::cell::Cell;

use tch::nn::{self, Module};
use tch::Tensor;

use super::{AccumulatingDdp, AccumulationError};

// ANCHOR: begin_no_sync_stub
/// Turns the sync switch off and returns the state it had just before, which
/// the `NoSyncGuard` puts back when the scope ends.
#[allow(unused_variables)] // delete this line once you use the argument
pub fn begin_no_sync(require_sync: &Cell<bool>) -> bool {
    // TODO: read the switch's current state (`require_sync.get()`), turn it
    // off (`require_sync.set(false)`), and return the state you read. (Cell
    // has one method that does both at once: find it in its docs.)
    // Do not simply return `true`: inside an outer `no_sync` scope the switch
    // is already off, and when the inner scope closes it must stay off.
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
    ddp: &AccumulatingDdp<M>,
    optimizer: &mut nn::Optimizer,
    micro_batches: &[(Tensor, Tensor)],
    loss_fn: impl Fn(&Tensor, &Tensor) -> Tensor,
) -> Result<f64, AccumulationError> {
    // TODO:
    //   1. `let k = super::check_micro_batches(micro_batches)?;` refuses an
    //      empty list or micro-batches of different sizes before anything
    //      changes; k is their number.
    //   2. `optimizer.zero_grad();` (backward ADDS to .grad: start from nothing).
    //   3. every micro-batch but the last, inside ONE no_sync scope (a block
    //      `{ let _no_sync = ddp.no_sync(); for ... { ... } }`):
    //        let loss = loss_fn(&ddp.forward(x), y) / k as f64; // why / k: see the chapter
    //        ddp.backward(&loss)?;                            // adds to .grad, sends nothing
    //      (`micro_batches.split_last()` gives you the last and the others.)
    //   4. after that block, where the guard has put the switch back, the last
    //      micro-batch the same way: its backward averages the summed
    //      gradients over all ranks.
    //   5. `optimizer.step();` and return the sum of the k divided losses
    //      (`loss.double_value(&[])` reads one).
    todo!("exercise ch04: accumulate_and_step in src/ch04_accumulation/exercise.rs")
}
// ANCHOR_END: accumulate_stub
