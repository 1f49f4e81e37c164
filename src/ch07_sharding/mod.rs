//! Chapter 07: sharding the data. Every rank must train on its own part of
//! each epoch, or N ranks just repeat the same work. You write the heart of
//! the distributed sampler: how many examples each rank gets
//! (`samples_per_rank`) and which ones, epoch after epoch (`epoch_shard`:
//! the epoch's order, shuffled the same way on every rank and anew every
//! epoch, evened out, and cut into strided shards).
//!
//! Your code:           `cargo test --test chapter_07`
//! The reference code:  `cargo test --features solutions --test chapter_07`
//!
//! Already solved, in the library (`src/ddp/`): the [`DistributedSampler`]
//! (its settings and `set_epoch`), the seeded shuffle [`permutation`], the
//! finished
//! [`SimpleDistributedDataParallelism`], one optimizer step with
//! accumulation ([`train_step`]) and [`rows`], which looks a shard's rows up.
//! The library's sampler hands out shards with the library's `epoch_shard`;
//! this chapter's [`shard`] and [`shard_len`] ask YOUR functions about the
//! same sampler.
//!
//! The training run (`examples/train.rs`) is built from these: a sampler per
//! rank, `set_epoch` every epoch, `train_step` on chunks of the shard,
//! `ddp.mean_over_ranks` for the logged loss, and `ddp.sync_time()` for the
//! share of time spent communicating.

pub use crate::ddp::{
    permutation, rows, train_step, BucketCaps, DistributedSampler, SamplerError,
    SimpleDistributedDataParallelism,
};

pub mod exercise; // the file you edit
pub mod solution; // the reference solution

/// `learner::f` is your `exercise.rs`, or `solution.rs` with `--features solutions`.
#[cfg(not(feature = "solutions"))]
pub use exercise as learner;
#[cfg(feature = "solutions")]
pub use solution as learner;

// ANCHOR: shard
/// This rank's indices for the sampler's current epoch, by YOUR
/// `learner::epoch_shard`: what `sampler.indices()` returns once your code
/// is right.
pub fn shard(sampler: &DistributedSampler) -> Vec<i64> {
    learner::epoch_shard(sampler)
}

/// How many indices every rank gets per epoch, by YOUR
/// `learner::samples_per_rank`: what `sampler.len()` returns once your
/// code is right.
pub fn shard_len(sampler: &DistributedSampler) -> usize {
    learner::samples_per_rank(sampler.dataset_len() as usize, sampler.num_replicas(), sampler.drop_last())
}
// ANCHOR_END: shard
