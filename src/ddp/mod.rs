//! The finished DDP library: everything the chapters build, written once, as
//! the training run and the examples use it. It imports nothing from the
//! chapters; the chapters are lessons over it (see `docs/architecture.md`).
//!
//! | piece | file | chapter |
//! | --- | --- | --- |
//! | replica checks: [`check_same_structure`], [`verify_replicas`] | `replicas.rs` | 2 |
//! | the wrapper core every stage shares: [`Replicated`] | `replicated.rs` | 2 |
//! | one all-reduce per parameter: [`naive::sync_gradients`] | `naive.rs` | 3 |
//! | the `no_sync` switch and guard: [`SyncSwitch`], [`NoSyncGuard`] | `no_sync.rs` | 4 |
//! | batch arithmetic: [`micro_batch_size`], [`split_micro_batches`] | `batch.rs` | 4 |
//! | bucket layouts: [`plan_buckets`], [`Bucket`], [`BucketCaps`] | `layout.rs` | 5 |
//! | the buckets, gradients kept in them, the end-of-backward check: [`GradientBuckets`] | `buckets.rs` | 5, 6 |
//! | planning them, and the copying sync: [`sync_bucket`] | `bucketed.rs` | 5 |
//! | the sampler: [`DistributedSampler`], [`epoch_shard`], [`shard_indices`] | `sampler.rs` | 7 |
//! | what it is built from: [`SamplerOptions`], [`SamplerError`] | `sampler_options.rs` | 7 |
//! | buckets that leave during backward: [`OverlappedBuckets`], [`mark_ready`] | `overlap.rs` | 6 |
//! | what they show: [`StepRecord`], the layout | `overlap_record.rs` | 6 |
//! | buckets re-planned from the observed order: [`agree_on_order`], [`replanned`] | `layout.rs` | 6 |
//! | the finished wrapper: [`SimpleDistributedDataParallelism`] | `wrapper.rs` | 7 |
//! | one optimizer step with accumulation: [`train_step`], for any [`StepOptimizer`] | `step.rs` | 7 |
//! | communication hooks: [`CommHook`], [`bf16_compress_hook`] (bf16 on the wire) | `comm_hook.rs` | 12 |
//! | ZeRO-1, AdamW sharded over the ranks: [`ShardedAdamW`], [`AdamWUpdate`] (its arithmetic) | `zero.rs`, `zero_steps.rs`, `zero_checkpoint.rs`, `adamw_update.rs` | 11 |
//! | the chapters' seams, never used by the library: [`seams`] | `seams.rs` | 2-6, 11 |
//!
//! ```no_run
//! use ddp_workbook::ddp::SimpleDistributedDataParallelism;
//! use ddp_workbook::dist::spawn;
//! use ddp_workbook::models::Mlp;
//! use ddp_workbook::tch::{Kind, Reduction, Tensor};
//!
//! spawn(2, |pg| {
//!     let (vs, mlp) = Mlp::seeded(0, &[4, 8, 1], Kind::Float); // the same seed on every rank
//!     let ddp = SimpleDistributedDataParallelism::new(mlp, &vs, pg)?; // checks the replicas
//!     let (x, y) = (Tensor::ones([2, 4], (Kind::Float, vs.device())), Tensor::zeros([2, 1], (Kind::Float, vs.device())));
//!     let loss = ddp.forward(&x).mse_loss(&y, Reduction::Mean);
//!     ddp.backward(&loss)?; // the gradients are now averaged over both ranks
//!     Ok(())
//! })
//! .unwrap();
//! ```

mod adamw_update;
mod batch;
mod bucketed;
mod buckets;
mod comm_hook;
mod end_of_backward;
mod layout;
pub mod naive;
mod no_sync;
mod overlap;
mod overlap_record;
mod replicas;
mod replicated;
mod sampler;
mod sampler_options;
pub mod seams;
mod step;
mod wrapper;
mod zero;
mod zero_checkpoint;
mod zero_steps;

pub use crate::models::Named;
pub use adamw_update::AdamWUpdate;
pub use batch::{check_micro_batches, micro_batch_size, split_micro_batches, AccumulationError};
pub use bucketed::{sync_bucket, BucketingError};
pub use buckets::{FlatGroups, GradientBuckets};
pub use comm_hook::{bf16_compress_hook, CommHook};
pub use layout::{
    agree_on_order, check_plan, layout_fingerprint, plan_buckets, replanned, Bucket, BucketCaps, ParamMeta,
    DEFAULT_BUCKET_CAP_BYTES, DEFAULT_FIRST_BUCKET_CAP_BYTES, MIB,
};
pub use no_sync::{NoSyncGuard, SyncSwitch};
pub use overlap::{mark_ready, BucketProgress, OverlappedBuckets};
pub use overlap_record::{Launch, StepRecord};
pub use replicas::{check_same_structure, verified_tensors, verify_replicas, InitError};
pub use replicated::Replicated;
pub use sampler::{epoch_shard, permutation, rows, samples_per_rank, shard_indices, DistributedSampler};
pub use sampler_options::{SamplerError, SamplerOptions};
pub use step::{train_step, train_step_with};
pub use wrapper::{SimpleDistributedDataParallelism, StepOptimizer};
pub use zero::{Shard, ShardedAdamW, ShardedBucket};
pub use zero_steps::{shard_of, step_bucket};
