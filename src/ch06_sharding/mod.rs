//! Chapter 06: sharding the data. Every rank must train on its own part of
//! each epoch, or N ranks just repeat the same work. You write the heart of
//! the [`DistributedSampler`]: how many examples each rank gets
//! ([`samples_per_rank`]) and which ones ([`shard_indices`]).
//!
//! Your code:           `cargo test --test chapter_06`
//! The reference code:  `cargo test --features solutions --test chapter_06`
//!
//! Already solved, in this folder:
//! - `sampler.rs`: the sampler around your two functions, with the seeded
//!   shuffle that gives every rank the same order ([`permutation`]);
//! - `ddp.rs`: the whole [`SimpleDistributedDataParallelism`], assembled from
//!   the reference code of chapters 2 to 5 (replica check, buckets,
//!   `no_sync` and `backward`), with a clock on the gradient sync;
//! - `step.rs`: [`train_step`], one optimizer step with accumulation;
//! - this file: [`rows`], which looks a shard's rows up in a tensor.
//!
//! The training run (`examples/train.rs`) is built from these: a sampler per
//! rank, `set_epoch` every epoch, `train_step` on chunks of
//! `sampler.indices()`, `ddp.mean_over_ranks` for the logged loss, and
//! `ddp.sync_time()` for the share of time spent communicating.

use tch::Tensor;

pub mod exercise; // the file you edit
pub mod solution; // the reference solution

pub mod ddp;
pub mod sampler;
pub mod step;

#[cfg(not(feature = "solutions"))]
use exercise as active;
#[cfg(feature = "solutions")]
use solution as active;

pub use crate::ch04_accumulation::NoSyncGuard;
pub use active::{samples_per_rank, shard_indices};
pub use ddp::SimpleDistributedDataParallelism;
pub use sampler::{permutation, DistributedSampler, SamplerError};
pub use step::train_step;

pub use crate::ch05_bucketing::{
    BucketingError, InitError, DEFAULT_BUCKET_CAP_BYTES, DEFAULT_FIRST_BUCKET_CAP_BYTES, MIB,
};

// ANCHOR: rows
/// The rows of `tensor` at `indices`, in that order: `[indices.len(), ..]`,
/// a copy (rows picked one by one cannot be a view). Panics on an index
/// outside `0..tensor.size()[0]`.
pub fn rows(tensor: &Tensor, indices: &[i64]) -> Tensor {
    let index = Tensor::from_slice(indices).to_device(tensor.device()); // [indices.len()]
    tensor.index_select(0, &index) // [indices.len(), ..]
}
// ANCHOR_END: rows
