//! Chapter 04 exercise: the `no_sync` switch and the gradient accumulation
//! loop. This is the file you edit.
//!
//! Check your work: `cargo test --test chapter_04`
//!
//! `SimpleDistributedDataParallelism::no_sync` in `mod.rs` opens its scope
//! with your `open_no_sync` and hands your `NoSyncScope` to the caller. The
//! tests call your `accumulate_and_step` once per optimizer step, on every
//! rank.

use std::cell::Cell;

use tch::nn::{self, Module};
use tch::Tensor;

use super::{AccumulationError, SimpleDistributedDataParallelism};

// ANCHOR: no_sync_scope_stub
/// An open `no_sync` scope on the sync switch `require_sync` (PyTorch's
/// `require_backward_grad_sync`): while it lives, `backward` only adds to
/// `.grad` and sends nothing. Dropping it closes the scope, on every way out
/// of its block (the end, `return` or `?`, a panic unwinding through it), and
/// afterwards `backward` syncs exactly when it did before the scope opened.
/// Scopes nest, and a scope may open while the switch is already off.
#[must_use = "the scope closes when this value is dropped: bind it with `let _scope = ...;`"]
pub struct NoSyncScope<'a> {
    #[allow(dead_code)] // delete this line once you use the field
    require_sync: &'a Cell<bool>,
    // TODO: whatever else an open scope needs to close correctly (yours to
    // decide).
}

/// Opens a `no_sync` scope on `require_sync`: see [`NoSyncScope`] for what
/// must hold while it is open and after it closes.
#[allow(unused_variables)] // delete this line once you use the argument
pub fn open_no_sync(require_sync: &Cell<bool>) -> NoSyncScope<'_> {
    // TODO: open the scope; `NoSyncScope`'s `drop`, below, closes it.
    // Keep: the rules in `NoSyncScope`'s doc comment; the tests try every
    // way out of a scope, scopes inside scopes, and a scope opened with the
    // switch already off. `drop` must never panic: a panic in `drop` while
    // another panic unwinds aborts the whole process.
    // Yours to decide: what an open scope remembers, and what closing it
    // writes (`Cell<bool>` can be read and written through `&`: see its docs).
    // Stuck? `cargo workbook hint 04` gives hints one at a time.
    todo!("exercise ch04: open_no_sync in src/ch04_accumulation/exercise.rs")
}

impl Drop for NoSyncScope<'_> {
    fn drop(&mut self) {
        // TODO: close the scope (this runs however the scope ends).
    }
}
// ANCHOR_END: no_sync_scope_stub

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
