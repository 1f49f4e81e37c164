//! Chapter 11: sharding the optimizer (ZeRO stage 1). Plain DDP keeps the
//! whole AdamW state on every rank: two moments per parameter, N identical
//! copies. Here each rank owns one shard of every bucket's flat parameters
//! and steps AdamW on that shard only, so it keeps 1/N of the moments.
//!
//! Your code:           `cargo test --test chapter_11`
//! The reference code:  `cargo test --features solutions --test chapter_11`
//! See the measured numbers: add `-- --nocapture`
//!
//! You write two functions in `exercise.rs`:
//! 1. `shard_of`: which part of a flat buffer of `numel` elements a rank
//!    owns, padded so that every rank's part is as long as every other's;
//! 2. `step_bucket`: one ZeRO-1 step of one bucket: `reduce_scatter` of the
//!    gradients instead of DDP's `all_reduce`, AdamW on this rank's shard,
//!    `all_gather` of the updated shards back into every rank's parameters.
//!
//! The optimizer that drives them is the library's (`src/ddp/zero/mod.rs`,
//! what the training run's `--zero 1` uses): it lays the parameters out in
//! the library's buckets (`ddp::plan_buckets`), checks the shard YOUR
//! `shard_of` returns, copies the gradients into the padded buffers before
//! each step and runs YOUR `step_bucket` on every bucket. This file's
//! [`ShardedAdamW`] is that optimizer built with your functions, through the
//! seam `ddp::seams::ZeroWithSteps::with_steps`. The model is the library's
//! [`Replicated`] (replicas checked at construction); its backward is plain
//! `loss.backward()`, since the gradients are synced inside the step. The
//! AdamW arithmetic is the library's ([`AdamWUpdate`], `src/ddp/adamw_update.rs`).
//! The same file gathers the shards into one state to save
//! (`gathered_state`), and cuts them again on load (`load_state`).

use std::ops::{Deref, DerefMut};

use crate::ddp::Named;
use crate::dist::{DistError, Group};

use crate::ddp::seams::{ZeroSteps, ZeroWithSteps}; // which two functions a ShardedAdamW runs
pub use crate::ddp::{AdamWUpdate, BucketCaps, Replicated, Shard, ShardedBucket};
pub use crate::train::AdamW;

pub mod exercise; // the file you edit
pub mod solution; // the reference solution

/// `learner::f` is your `exercise.rs`, or `solution.rs` with `--features solutions`.
#[cfg(not(feature = "solutions"))]
pub use exercise as learner;
#[cfg(feature = "solutions")]
pub use solution as learner;

/// The library's `ShardedAdamW` (every method: `step`, `zero_grad`,
/// `gathered_state`, `load_state`, `moment_bytes`, the field `lr`, ...),
/// built with YOUR `shard_of` and `step_bucket`.
pub struct ShardedAdamW(crate::ddp::ShardedAdamW);

// ANCHOR: new
impl ShardedAdamW {
    /// The library's optimizer running YOUR `learner::shard_of` and
    /// `learner::step_bucket`. Every rank calls it with the same parameters
    /// and caps; `lr` and `weight_decay` as in [`AdamW`].
    pub fn new(
        params: &[Named],
        pg: Group,
        caps: BucketCaps,
        lr: f64,
        weight_decay: f64,
    ) -> Result<Self, DistError> {
        let yours = ZeroSteps { shard_of: learner::shard_of, step_bucket: learner::step_bucket };
        crate::ddp::ShardedAdamW::with_steps(params, pg, caps, lr, weight_decay, yours).map(ShardedAdamW)
    }
}
// ANCHOR_END: new

impl Deref for ShardedAdamW {
    type Target = crate::ddp::ShardedAdamW;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl DerefMut for ShardedAdamW {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}
