//! Chapter 14: sharding the parameters (FSDP, ZeRO stage 3, PyTorch's
//! `fully_shard` with `FULL_SHARD`). Chapter 11 sharded the optimizer
//! state; here each rank stores only its rows of every parameter, and a
//! unit's full parameters exist only while it computes: gathered before,
//! freed after.
//!
//! Your code:           `cargo test --test chapter_14`
//! The reference code:  `cargo test --features solutions --test chapter_14`
//! See the measured numbers: add `-- --nocapture`
//!
//! You write five functions in `exercise.rs`:
//! 1. `shard_rows`: which rows (dim 0) of a parameter a rank keeps;
//! 2. the schedule, four hooks that return [`Action`]s: `pre_forward`,
//!    `post_forward`, `pre_backward`, `post_backward`: when to gather a
//!    unit's parameters, when to prefetch the next unit's, when to free
//!    them, and when to reduce-scatter its gradients.
//!
//! The plumbing is the library's (`src/ddp/fsdp/`, the finished
//! `FullyShard`): it cuts the model into units (each GPT block, or each
//! MLP layer, is a unit; the rest is the root, unit 0), keeps the shards,
//! runs the collectives on a communication thread, calls your hooks at the
//! right moments, counts every byte in a `MemoryLedger`, and averages the
//! reduce-scattered gradients as PyTorch does (`divide_factors`, given).
//! This file's [`FullyShard`] is that library type built with your five
//! functions, through the seam `ddp::seams::FsdpWithSchedule`.

use std::ops::Deref;

use tch::nn::VarStore;

use crate::ddp::seams::FsdpWithSchedule; // whose schedule a FullyShard runs
use crate::dist::{DistError, Group};
use crate::models::{Gpt, Mlp};

pub use crate::ddp::{
    divide_factors, Action, FsdpAdamW, FsdpEvent, FsdpOptions, FsdpSchedule, FsdpSgd, MemoryLedger, UnitAt,
};

pub mod exercise; // the file you edit
pub mod solution; // the reference solution

/// `learner::f` is your `exercise.rs`, or `solution.rs` with `--features solutions`.
#[cfg(not(feature = "solutions"))]
pub use exercise as learner;
#[cfg(feature = "solutions")]
pub use solution as learner;

// ANCHOR: yours
/// Your five functions as one schedule; the gradient division is the
/// library's (PyTorch's float64 pre- and post-division).
pub fn your_schedule() -> FsdpSchedule {
    FsdpSchedule {
        shard_rows: learner::shard_rows,
        pre_forward: learner::pre_forward,
        post_forward: learner::post_forward,
        pre_backward: learner::pre_backward,
        post_backward: learner::post_backward,
        divide_factors,
    }
}
// ANCHOR_END: yours

/// The library's `FullyShard` (every method: `forward_with`, `backward`,
/// `set_requires_gradient_sync`, `zero_grad`, `full_parameters`,
/// `ledger`, ...), running YOUR schedule.
pub struct FullyShard(crate::ddp::FullyShard);

// ANCHOR: new
impl FullyShard {
    /// `fully_shard(block)` on each block of `gpt`, then on the GPT, with
    /// your schedule. Every rank calls it, on the same seeded model.
    pub fn gpt(gpt: &Gpt, vs: &VarStore, pg: Group, options: FsdpOptions) -> Result<Self, DistError> {
        crate::ddp::FullyShard::gpt_with_schedule(gpt, vs, pg, options, your_schedule()).map(FullyShard)
    }

    /// `fully_shard` on the MLP only, or on each layer first (`per_layer`),
    /// with your schedule.
    pub fn mlp(
        mlp: &Mlp,
        vs: &VarStore,
        pg: Group,
        options: FsdpOptions,
        per_layer: bool,
    ) -> Result<Self, DistError> {
        crate::ddp::FullyShard::mlp_with_schedule(mlp, vs, pg, options, per_layer, your_schedule())
            .map(FullyShard)
    }
}
// ANCHOR_END: new

impl Deref for FullyShard {
    type Target = crate::ddp::FullyShard;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}
