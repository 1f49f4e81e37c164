//! Chapter 13: sharding the gradients (ZeRO stage 2; FSDP's
//! `SHARD_GRAD_OP`, `fully_shard(reshard_after_forward=False)`). ZeRO-1
//! sharded the moments but every rank still held the whole gradient until
//! the step. Here each bucket is reduce-scattered during backward, as soon
//! as its gradients are final, and each rank keeps only its shard of the
//! average: the full gradient never exists at once.
//!
//! Your code:           `cargo test --test chapter_13`
//! The reference code:  `cargo test --features solutions --test chapter_13`
//! See the measured numbers: add `-- --nocapture`
//!
//! You write two functions in `exercise.rs`:
//! 1. `reduce_scatter_bucket`: when a bucket's gradients are final, what leaves (the
//!    members' gradients back to back, then the padding), when the full
//!    gradients may go, and the reduce-scatter started on the
//!    communication thread;
//! 2. `keep_shard`: once it is done, what this rank keeps (its chunk of
//!    the average, DDP's bits) and when the full buffer may go.
//!
//! The wrapper that runs them is the library's (`src/ddp/zero/grad_op.rs`):
//! its gradient-ready hooks (chapter 6's) decide when a bucket is complete,
//! it lays out the buckets with `shard_of` (chapter 11's), keeps at most
//! `BUCKETS_IN_FLIGHT` buckets in flight, checks what your functions
//! return, accounts every byte in a `MemoryLedger`, and steps AdamW on the
//! shards. This file's [`ShardGradOp`] is that wrapper built with your
//! functions, through the seam `ddp::seams::GradOpWithSteps::with_steps`.

use std::ops::{Deref, DerefMut};

use tch::nn::{self, Module};

use crate::autograd::AutogradError;
use crate::ddp::seams::{GradOpSteps, GradOpWithSteps}; // which functions a ShardGradOp runs
use crate::dist::{DistError, Group, ProcessGroup};

pub use crate::ddp::{shard_of, BucketCaps, InFlight, Named, Shard};

/// Turns an error of `crate::autograd` (`clear_grad`'s) met while doing
/// `op` into a [`DistError`] that names this rank, as `torch_error` does
/// for libtorch's: `clear_grad(param).map_err(autograd_error(pg, "letting a gradient go"))?`.
pub fn autograd_error(
    pg: &dyn ProcessGroup,
    op: impl Into<String>,
) -> impl FnOnce(AutogradError) -> DistError {
    let (rank, op) = (pg.rank(), op.into());
    move |error| DistError::Invalid { rank, op, detail: error.to_string() }
}

pub mod exercise; // the file you edit
pub mod solution; // the reference solution

/// `learner::f` is your `exercise.rs`, or `solution.rs` with `--features solutions`.
#[cfg(not(feature = "solutions"))]
pub use exercise as learner;
#[cfg(feature = "solutions")]
pub use solution as learner;

/// The library's `ShardGradOp` (every method: `forward`, `backward`,
/// `no_sync`, `step`, `zero_grad`, `ledger`, ...), built with YOUR
/// `reduce_scatter_bucket` and `keep_shard`.
pub struct ShardGradOp<M: Module>(crate::ddp::ShardGradOp<M>);

// ANCHOR: new
impl<M: Module> ShardGradOp<M> {
    /// The library's ZeRO-2 wrapper running YOUR `learner::reduce_scatter_bucket`
    /// and `learner::keep_shard`. Every rank calls it with the same
    /// model and caps; AdamW with `lr` and `weight_decay`.
    pub fn new(
        module: M,
        vs: &nn::VarStore,
        pg: Group,
        caps: BucketCaps,
        lr: f64,
        weight_decay: f64,
    ) -> Result<Self, DistError> {
        let yours = GradOpSteps {
            shard_of,
            reduce_scatter_bucket: learner::reduce_scatter_bucket,
            keep_shard: learner::keep_shard,
        };
        crate::ddp::ShardGradOp::with_steps(module, vs, pg, caps, lr, weight_decay, yours).map(ShardGradOp)
    }

    /// Whether a parameter may go unused in a step (PyTorch's `find_unused_parameters`).
    pub fn find_unused_parameters(self, on: bool) -> Self {
        ShardGradOp(self.0.find_unused_parameters(on))
    }
}
// ANCHOR_END: new

impl<M: Module> Deref for ShardGradOp<M> {
    type Target = crate::ddp::ShardGradOp<M>;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl<M: Module> DerefMut for ShardGradOp<M> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}
