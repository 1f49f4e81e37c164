//! The finished DDP library: everything the chapters build, written once, as
//! the training run and the examples use it. It imports nothing from the
//! chapters; the chapters are lessons over it (see `docs/architecture.md`).
//!
//! Its files follow PyTorch's nouns:
//!
//! | PyTorch | here | chapter |
//! | --- | --- | --- |
//! | the replica check and broadcast of `DistributedDataParallel.__init__` | `replica_check.rs`: [`verify_replicas`], [`check_same_structure`], [`sync_module_states`], [`InitSync`]; `replicated.rs`: [`Replicated`], the core every wrapper shares | 2 |
//! | one all-reduce per gradient (no buckets) | `naive.rs`: [`naive::sync_gradients`] | 3 |
//! | `DistributedDataParallel`, with `no_sync` | `wrapper/`: [`SimpleDistributedDataParallelism`], [`NoSyncGuard`], [`train_step`], the accumulation arithmetic | 4, 7 |
//! | `Reducer` (`reducer.cpp`): buckets, autograd hooks, the end-of-backward check, comm hooks | `reducer/`: [`Reducer`], [`GradientBuckets`], [`plan_buckets`], [`mark_ready`], [`bf16_compress_hook`], [`bf16_compress_hook_pytorch_order`] | 5, 6, 12 |
//! | `DistributedSampler` | `sampler.rs`: [`DistributedSampler`], [`epoch_shard`] | 7 |
//! | `ZeroRedundancyOptimizer` | `zero/`: [`ShardedAdamW`], [`shard_of`], [`step_bucket`]; `adamw_update.rs`: AdamW's arithmetic, [`AdamWUpdate`] | 11 |
//! | FSDP2's `fully_shard` (ZeRO-3, `FULL_SHARD`; `reshard_after_forward=False` is `SHARD_GRAD_OP`) | `fsdp/`: [`FullyShard`], [`FsdpSchedule`], [`shard_rows`], [`FsdpSgd`], [`FsdpAdamW`] | 14 |
//! | FSDP's `SHARD_GRAD_OP` (`fully_shard(reshard_after_forward=False)`), DeepSpeed's ZeRO stage 2 | `zero/grad_op.rs`: [`ShardGradOp`]; `zero/grad_shards.rs`: [`reduce_scatter_bucket`], [`keep_shard`] | 13 |
//! | (none: PyTorch reads its caching allocator) | `memory.rs`: [`MemoryLedger`], the bytes of parameters, gradients and optimizer state a strategy holds | 11, 13, 14 |
//! | (none: the decision guide, as arithmetic) | `plan.rs`: [`plan_memory`], the bytes of model states per device under DDP, ZeRO-1, ZeRO-2 and FSDP, and which fits | 99 |
//! | (none: the workbook's doors for the chapters) | `seams.rs`: [`seams`], never used by the library | 2-6, 11, 14 |
//!
//! ```no_run
//! use ddp_workbook::ddp::SimpleDistributedDataParallelism;
//! use ddp_workbook::dist::spawn;
//! use ddp_workbook::models::Mlp;
//! use ddp_workbook::tch::{Kind, Reduction, Tensor};
//!
//! spawn(2, |pg| {
//!     let (vs, mlp) = Mlp::seeded(0, &[4, 8, 1], Kind::Float); // the same seed on every rank
//!     let ddp = SimpleDistributedDataParallelism::new(mlp, &vs, pg)?; // rank 0's weights everywhere
//!     let (x, y) = (Tensor::ones([2, 4], (Kind::Float, vs.device())), Tensor::zeros([2, 1], (Kind::Float, vs.device())));
//!     let loss = ddp.forward(&x).mse_loss(&y, Reduction::Mean);
//!     ddp.backward(&loss)?; // the gradients are now averaged over both ranks
//!     Ok(())
//! })
//! .unwrap();
//! ```

mod adamw_update;
mod fsdp;
mod memory;
pub mod naive;
mod plan;
mod reducer;
mod replica_check;
mod replicated;
mod sampler;
pub mod seams;
mod wrapper;
mod zero;

pub use crate::models::Named;
pub use adamw_update::{param_steps, AdamWUpdate};
/// FSDP's schedule functions one by one (`pre_forward`, `post_backward`, ...).
pub use fsdp::schedule as fsdp_schedule;
pub use fsdp::{
    divide_factors, shard_rows, Action, FsdpAdamW, FsdpEvent, FsdpOptions, FsdpSchedule, FsdpSgd, FullyShard,
    ShardedParameter, UnitAt,
};
pub use memory::{tensor_bytes, HeldBytes, Holding, MemoryEvent, MemoryLedger};
pub use plan::{
    plan_memory, BytesPerParameter, MemoryPlan, PlanError, PlanRow, Precision, ShardingStage, Verdict, GIB,
};
pub use reducer::{
    agree_on_order, bf16_compress_hook, bf16_compress_hook_pytorch_order, check_plan, layout_fingerprint,
    mark_ready, plan_buckets, replanned, sync_bucket, Bucket, BucketCaps, BucketProgress, BucketingError,
    CommHook, GradientBuckets, Launch, ParamMeta, Reducer, StepRecord, DEFAULT_BUCKET_CAP_BYTES,
    DEFAULT_FIRST_BUCKET_CAP_BYTES, MIB,
};
pub use replica_check::{
    check_same_structure, sync_module_states, verified_tensors, verify_replicas, InitError, InitSync,
};
pub use replicated::Replicated;
pub use sampler::{
    epoch_shard, permutation, rows, samples_per_rank, shard_indices, DistributedSampler, SamplerError,
    SamplerOptions,
};
pub use wrapper::accumulation::{
    check_micro_batches, micro_batch_size, split_micro_batches, AccumulationError,
};
pub use wrapper::no_sync::{NoSyncGuard, SyncSwitch};
pub use wrapper::step::{train_step, train_step_with};
pub use wrapper::{SimpleDistributedDataParallelism, StepOptimizer, UnusedParameters};
pub use zero::{
    keep_shard, reduce_scatter_bucket, GradOpSteps, InFlight, KeepShard, ReduceScatterBucket, ShardGradOp,
    BUCKETS_IN_FLIGHT,
};
pub use zero::{shard_of, step_bucket, Shard, ShardedAdamW, ShardedBucket};
