//! The core every DDP wrapper shares: a model replicated on every rank of a
//! process group, checked at construction, with its tensors listed in a
//! fixed order. The wrappers (the library's
//! [`SimpleDistributedDataParallelism`](super::SimpleDistributedDataParallelism)
//! and the chapters' stages) hold one and add only their own methods; they
//! reach its accessors through `Deref`.

use tch::nn::{self, Module};
use tch::Tensor;

use super::replica_check::{verified_tensors, verify_replicas, InitError, ReplicaCheck};
use crate::dist::{CommStats, DistError, Group, ReduceOp};
use crate::models::Named;

// ANCHOR: replicated
/// A model replicated on every rank of a process group. It owns the model
/// and remembers its tensors in a fixed order, the same on every rank.
pub struct Replicated<M: Module> {
    module: M,
    /// The parameters that require grad, in registration order, each tensor
    /// once (shallow handles: they share storage, and `.grad()`, with the
    /// model). A parameter frozen before wrapping is not among them.
    parameters: Vec<Named>,
    /// Non-trainable tensors (buffers), sorted by name.
    buffers: Vec<Named>,
    process_group: Group,
}

impl<M: Module> Replicated<M> {
    /// Wraps `module`, whose variables live in `vs`, after checking that every
    /// rank of `pg` holds bitwise the same parameters and buffers. Every rank
    /// must call it (it runs collectives); on a mismatch every rank gets the
    /// same error.
    pub fn new(module: M, vs: &nn::VarStore, pg: Group) -> Result<Self, InitError> {
        Self::checked_with(module, vs, pg, verify_replicas)
    }

    /// [`new`](Self::new), comparing the values with `check`: the library's
    /// [`verify_replicas`], its broadcast ([`InitSync::Broadcast`](super::InitSync),
    /// the finished wrapper's default), or chapter 2's through `ddp::seams`.
    pub(crate) fn checked_with(
        module: M,
        vs: &nn::VarStore,
        pg: Group,
        check: ReplicaCheck,
    ) -> Result<Self, InitError> {
        let (parameters, buffers) = verified_tensors(vs, pg.as_ref(), check)?;
        Ok(Replicated { module, parameters, buffers, process_group: pg })
    }

    /// Runs the wrapped model: the forward pass needs no communication.
    pub fn forward(&self, xs: &Tensor) -> Tensor {
        self.module.forward(xs)
    }
}
// ANCHOR_END: replicated

impl<M: Module> Replicated<M> {
    /// The wrapped model. Save ITS weights (the `VarStore` you built it
    /// from), on rank 0 only: they are the same on every rank.
    pub fn module(&self) -> &M {
        &self.module
    }

    /// Unwraps the model, e.g. to evaluate it alone after training.
    pub fn into_module(self) -> M {
        self.module
    }

    pub fn process_group(&self) -> &Group {
        &self.process_group
    }

    pub fn rank(&self) -> usize {
        self.process_group.rank()
    }

    pub fn world_size(&self) -> usize {
        self.process_group.world_size()
    }

    /// The parameters that require grad, in registration order, each tensor
    /// once (tied weights are one parameter): the ones DDP averages.
    pub fn parameters(&self) -> &[Named] {
        &self.parameters
    }

    /// The non-trainable tensors, sorted by name.
    pub fn buffers(&self) -> &[Named] {
        &self.buffers
    }

    /// What this rank has sent through the process group so far (every
    /// call, construction's checks included).
    pub fn stats(&self) -> CommStats {
        self.process_group.stats()
    }

    /// The mean of `value` over all ranks, for logging: each rank's loss is
    /// the loss of its own shard; this is the global batch's. Every rank must
    /// call it (one all-reduce).
    pub fn mean_over_ranks(&self, value: f64) -> Result<f64, DistError> {
        let mut value = Tensor::from(value); // [] f64
        self.process_group.all_reduce(&mut value, ReduceOp::Sum)?;
        Ok(value.double_value(&[]) / self.world_size() as f64)
    }

    /// Runs `loss.backward()`, which ADDS this loss's gradients to every
    /// parameter's `.grad`, and syncs nothing. A loss that is not a scalar,
    /// or has no gradient, becomes an error that names this rank instead of
    /// a panic in libtorch. Crate-private: a wrapper's `backward` calls it
    /// and then syncs; the chapters reach it as `backward_local` through
    /// `ddp::seams::LocalBackward`.
    pub(crate) fn local_backward(&self, loss: &Tensor) -> Result<(), DistError> {
        loss.f_backward().map_err(|source| DistError::Torch {
            rank: self.rank(),
            op: "loss.backward()".to_string(),
            cause: source,
        })
    }
}
