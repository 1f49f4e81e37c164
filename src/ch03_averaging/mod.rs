//! Chapter 03: averaging gradients. After `backward()`, each rank holds the
//! gradient of its own slice of the batch. You write [`sync_gradients`], which
//! replaces it on every rank by the average over all ranks, so that every
//! replica takes the same `optimizer.step()` and one process on the whole
//! global batch would have taken that very step too.
//!
//! Your code:           `cargo test --test chapter_03`
//! The reference code:  `cargo test --features solutions --test chapter_03`
//!
//! This file holds chapter 2's wrapper, already solved (its `new` runs the
//! reference `verify_replicas`, not yours from chapter 2, so you can start
//! here), plus one new method, [`SimpleDistributedDataParallelism::sync_gradients`].

use tch::nn::{self, Module};
use tch::Tensor;

use crate::ch02_replicas::verified_tensors;
use crate::dist::{DistError, Group};

pub use crate::ch02_replicas::InitError;

pub mod exercise; // the file you edit
pub mod solution; // the reference solution

#[cfg(not(feature = "solutions"))]
use exercise as active;
#[cfg(feature = "solutions")]
use solution as active;

pub use active::sync_gradients;

/// A model replicated on every rank of a process group, now able to average
/// its gradients across ranks.
pub struct SimpleDistributedDataParallelism<M: Module> {
    module: M,
    /// Trainable tensors, in registration order (shallow handles: they share
    /// storage, and `.grad()`, with the model).
    parameters: Vec<(String, Tensor)>,
    /// Non-trainable tensors (buffers), sorted by name.
    buffers: Vec<(String, Tensor)>,
    process_group: Group,
}

impl<M: Module> SimpleDistributedDataParallelism<M> {
    /// Wraps `module`, whose variables live in `vs`, after checking that every
    /// rank holds bitwise the same parameters and buffers (chapter 2).
    pub fn new(module: M, vs: &nn::VarStore, pg: Group) -> Result<Self, InitError> {
        let (parameters, buffers) = verified_tensors(vs, pg.as_ref())?;
        Ok(SimpleDistributedDataParallelism { module, parameters, buffers, process_group: pg })
    }

    /// Runs the wrapped model: the forward pass needs no communication.
    pub fn forward(&self, xs: &Tensor) -> Tensor {
        self.module.forward(xs)
    }

    // ANCHOR: sync_method
    /// Averages every parameter's gradient over all ranks. Call it on every
    /// rank after `loss.backward()` and before `optimizer.step()`.
    pub fn sync_gradients(&self) -> Result<(), DistError> {
        sync_gradients(self.process_group.as_ref(), &self.parameters)
    }
    // ANCHOR_END: sync_method

    /// The wrapped model (for example to save it on rank 0).
    pub fn module(&self) -> &M {
        &self.module
    }

    pub fn process_group(&self) -> &Group {
        &self.process_group
    }

    /// The trainable tensors, in registration order.
    pub fn parameters(&self) -> &[(String, Tensor)] {
        &self.parameters
    }

    /// The non-trainable tensors, sorted by name.
    pub fn buffers(&self) -> &[(String, Tensor)] {
        &self.buffers
    }
}
