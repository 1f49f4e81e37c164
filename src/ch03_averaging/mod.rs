//! Chapter 03: averaging gradients. You write `sync_gradients`, which
//! replaces every rank's gradient by the average over all ranks, so that
//! every replica takes the step one process would take on the global batch.
//!
//! Your code:           `cargo test --test chapter_03`
//! The reference code:  `cargo test --features solutions --test chapter_03`
//!
//! Here: this chapter's [`SimpleDistributedDataParallelism`], chapter 2's
//! (its replica check is the library's, so you can start here) plus one
//! method that runs your code, and [`train_step`], one DDP step as this
//! chapter teaches it.

use std::ops::Deref;

use tch::nn::{self, Module};
use tch::Tensor;

use crate::dist::{DistError, Group};

pub use crate::ddp::seams::LocalBackward;
pub use crate::ddp::{InitError, Replicated};

pub mod exercise; // the file you edit
pub mod solution; // the reference solution

/// `learner::f` is your `exercise.rs`, or `solution.rs` with `--features solutions`.
#[cfg(not(feature = "solutions"))]
pub use exercise as learner;
#[cfg(feature = "solutions")]
pub use solution as learner;

// ANCHOR: wrapper
/// The DDP wrapper as this chapter leaves it: chapter 2's, whose replicas
/// start equal, now able to average its gradients across ranks, one
/// all-reduce per parameter. (picotron calls this stage
/// `DataParallelNaive`.) The core's accessors come through `Deref`.
pub struct SimpleDistributedDataParallelism<M: Module> {
    replicated: Replicated<M>,
}

impl<M: Module> SimpleDistributedDataParallelism<M> {
    /// Wraps `module` after checking that every rank holds bitwise the same
    /// parameters and buffers (chapter 2, the library's check).
    pub fn new(module: M, vs: &nn::VarStore, pg: Group) -> Result<Self, InitError> {
        Ok(SimpleDistributedDataParallelism { replicated: Replicated::new(module, vs, pg)? })
    }

    // ANCHOR: sync_method
    /// Averages every parameter's gradient over all ranks with YOUR
    /// `learner::sync_gradients`. Call it on every rank after
    /// `loss.backward()` and before `optimizer.step()`.
    pub fn sync_gradients(&self) -> Result<(), DistError> {
        learner::sync_gradients(self.process_group().as_ref(), self.parameters())
    }
    // ANCHOR_END: sync_method
}
// ANCHOR_END: wrapper

impl<M: Module> Deref for SimpleDistributedDataParallelism<M> {
    type Target = Replicated<M>;

    fn deref(&self) -> &Replicated<M> {
        &self.replicated
    }
}

// ANCHOR: train_step
/// One DDP training step on this rank's rows `x` and targets `y`: the
/// single-process step with one line added. `loss_fn(prediction, target)`
/// must return the MEAN loss over the rows. Returns this rank's loss.
pub fn train_step<M: Module>(
    ddp: &SimpleDistributedDataParallelism<M>,
    optimizer: &mut nn::Optimizer,
    x: &Tensor,
    y: &Tensor,
    loss_fn: impl Fn(&Tensor, &Tensor) -> Tensor,
) -> Result<f64, DistError> {
    optimizer.zero_grad();
    let loss = loss_fn(&ddp.forward(x), y); // [] the mean over this rank's rows
    ddp.backward_local(&loss)?; // this rank's gradient, in every .grad
    ddp.sync_gradients()?; // the line DDP adds: now every rank holds the global batch's mean gradient
    optimizer.step();
    Ok(loss.double_value(&[]))
}
// ANCHOR_END: train_step
