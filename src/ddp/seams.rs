//! The workbook's seams, where a chapter runs the learner's function inside
//! library machinery. This module exists for the chapters (`src/chNN_*/`)
//! and their tests only; the finished library, the training run and the
//! examples never call it, and the runner's `layering` check fails any other
//! file that names it (`cargo xtask test --only layering`). Everything here
//! is a thin door into the library's own code: the library runs the same
//! code with its own functions, through crate-private entry points, so
//! nothing here is on the finished wrapper's path.
//!
//! Each door is a trait, implemented for the library type it opens: a chapter
//! imports it (as it imports [`LocalBackward`]), and without the import the
//! library's types offer no such method.
//!
//! | seam | the learner's function | chapter |
//! | --- | --- | --- |
//! | [`WithReplicaCheck::with_replica_check`] | `verify_replicas` | 2 |
//! | [`LocalBackward::backward_local`] | (a backward that syncs nothing, which every stage's `backward` builds on) | 2-6 |
//! | [`NoSyncWith::no_sync_with`] | `open_no_sync` (and its `NoSyncScope`) | 4 |
//! | [`BucketsWith::plan_with`], [`BucketsWith::sync_with`] | `plan_buckets`, `sync_bucket` | 5 |
//! | [`ReducerWithSteps::with_steps`], [`OverlapSteps`] | `mark_ready`, `launch_bucket`, `finish_bucket` | 6 |
//! | [`ZeroWithSteps::with_steps`], [`ZeroSteps`] | `shard_of`, `step_bucket` | 11 |
//! | [`GradOpWithSteps::with_steps`], [`GradOpSteps`] | `reduce_scatter_bucket`, `keep_shard` | 13 |
//! | [`FsdpWithSchedule::gpt_with_schedule`], [`FsdpWithSchedule::mlp_with_schedule`] | `shard_rows`, `pre_forward`, `post_forward`, `pre_backward`, `post_backward` | 14 |

use std::cell::Cell;

use tch::nn::{self, Module};
use tch::Tensor;

use super::reducer::steps::{BucketSteps, Buckets};
use super::reducer::{Bucket, BucketCaps, BucketProgress, BucketingError, GradientBuckets, Reducer};
use super::replica_check::InitError;
use super::replicated::Replicated;
use super::wrapper::no_sync::SyncSwitch;
use super::zero::ShardedAdamW;
use super::{FsdpOptions, FsdpSchedule, FullyShard};
use crate::dist::{tagged, DistError, Group, ProcessGroup, Work};
use crate::models::Named;
use crate::models::{Gpt, Mlp};

pub use super::reducer::PlanBuckets;
pub use super::replica_check::ReplicaCheck;
pub use super::zero::GradOpSteps;
pub use super::zero::ZeroSteps;

/// `loss.backward()` and nothing else: this rank's gradients, added to
/// every `.grad`, synced with no one. Every chapter stage builds its
/// `backward` on it; the finished wrapper does not offer it, since a
/// backward that silently skips the sync is what DDP exists to prevent.
/// Without this trait in scope the finished wrapper has no such method:
///
/// ```compile_fail
/// use ddp_workbook::ddp::SimpleDistributedDataParallelism;
/// use ddp_workbook::models::Mlp;
/// use ddp_workbook::tch::Tensor;
///
/// fn skip_the_sync(ddp: &SimpleDistributedDataParallelism<Mlp>, loss: &Tensor) {
///     ddp.backward_local(loss).unwrap(); // error[E0599]: no method named `backward_local`
/// }
/// ```
///
/// and the same code with the seam imported compiles (what a chapter does):
///
/// ```
/// use ddp_workbook::ddp::seams::LocalBackward;
/// use ddp_workbook::ddp::SimpleDistributedDataParallelism;
/// use ddp_workbook::models::Mlp;
/// use ddp_workbook::tch::Tensor;
///
/// fn skip_the_sync(ddp: &SimpleDistributedDataParallelism<Mlp>, loss: &Tensor) {
///     ddp.backward_local(loss).unwrap();
/// }
/// ```
pub trait LocalBackward {
    /// Runs `loss.backward()`, which ADDS this loss's gradients to every
    /// parameter's `.grad`. A loss that is not a scalar, or has no
    /// gradient, becomes an error that names this rank.
    fn backward_local(&self, loss: &Tensor) -> Result<(), DistError>;
}

impl<M: Module> LocalBackward for Replicated<M> {
    fn backward_local(&self, loss: &Tensor) -> Result<(), DistError> {
        self.local_backward(loss)
    }
}

/// Chapter 2's door: a [`Replicated`] whose replicas are compared by the
/// learner's `verify_replicas`.
pub trait WithReplicaCheck<M: Module>: Sized {
    /// [`Replicated::new`], comparing the values with `check` instead of
    /// the library's `verify_replicas` (chapter 2 passes the learner's).
    fn with_replica_check(
        module: M,
        vs: &nn::VarStore,
        pg: Group,
        check: ReplicaCheck,
    ) -> Result<Self, InitError>;
}

impl<M: Module> WithReplicaCheck<M> for Replicated<M> {
    fn with_replica_check(
        module: M,
        vs: &nn::VarStore,
        pg: Group,
        check: ReplicaCheck,
    ) -> Result<Self, InitError> {
        Self::checked_with(module, vs, pg, check)
    }
}

/// Chapter 4's door: the `no_sync` switch, opened by the learner's scope.
pub trait NoSyncWith {
    /// [`SyncSwitch::no_sync`], with the scope opened by `open` on the
    /// switch's cell instead of the library's guard (chapter 4's
    /// `open_no_sync`, whose scope type is the learner's).
    fn no_sync_with<'a, Scope: 'a>(&'a self, open: fn(&'a Cell<bool>) -> Scope) -> Scope;
}

impl NoSyncWith for SyncSwitch {
    fn no_sync_with<'a, Scope: 'a>(&'a self, open: fn(&'a Cell<bool>) -> Scope) -> Scope {
        open(self.cell())
    }
}

/// How one bucket is averaged by copying (chapter 5's `sync_bucket`; the
/// library's reference is `ddp::sync_bucket`).
pub type SyncBucket = fn(&dyn ProcessGroup, &Bucket, &mut Tensor, &[Named]) -> Result<(), DistError>;

/// Chapter 5's doors: buckets planned by the learner's `plan_buckets`, and
/// synced by the learner's `sync_bucket`.
pub trait BucketsWith: Sized {
    /// [`GradientBuckets::plan`] with `planner` instead of the library's
    /// `plan_buckets`: the result is checked to be a layout of these
    /// parameters, and the same on every rank. Every rank must call it,
    /// with the same caps.
    fn plan_with(
        pg: &dyn ProcessGroup,
        params: &[Named],
        caps: BucketCaps,
        planner: PlanBuckets,
    ) -> Result<Self, BucketingError>;

    /// Averages every gradient over all ranks, one all-reduce per bucket, in
    /// bucket order, with `sync`; then checks that no rank used a parameter
    /// that this rank did not.
    fn sync_with(&self, pg: &dyn ProcessGroup, params: &[Named], sync: SyncBucket) -> Result<(), DistError>;
}

impl BucketsWith for GradientBuckets {
    fn plan_with(
        pg: &dyn ProcessGroup,
        params: &[Named],
        caps: BucketCaps,
        planner: PlanBuckets,
    ) -> Result<Self, BucketingError> {
        Self::planned_by(pg, params, caps, planner)
    }

    // ANCHOR: sync_with
    fn sync_with(&self, pg: &dyn ProcessGroup, params: &[Named], sync: SyncBucket) -> Result<(), DistError> {
        for (index, bucket) in self.layout().iter().enumerate() {
            // A second handle on the same storage: the sync needs `&mut`, and
            // `&self` is what lets backward run inside a no_sync scope.
            let mut buffer = self.buffer(index);
            // Named, so that ranks whose buckets pair up wrongly get an error.
            tagged(format!("bucket {index}"), || sync(pg, bucket, &mut buffer, params))?;
            self.check_missing_gradients(pg, index, params).map_err(|error| match error {
                DistError::Invalid { rank, op, detail } => {
                    let hint = "If this rank is right, check that sync_bucket fills the slot of a \
                                parameter without gradient with zeros.";
                    DistError::Invalid { rank, op, detail: format!("{detail} {hint}") }
                }
                other => other,
            })?;
        }
        Ok(())
    }
    // ANCHOR_END: sync_with
}

/// A hook said parameter `param`'s gradient is final. Returns the buckets to
/// launch now, in order. See the chapter-6 exercise for the contract.
pub type MarkReady = fn(&mut BucketProgress, usize) -> Vec<usize>;
/// Starts one bucket's all-reduce (SUM) and returns its handle.
pub type LaunchBucket = fn(&dyn ProcessGroup, &Bucket, &mut Tensor, &[Named]) -> Result<Work, DistError>;
/// Waits for one launched bucket and leaves the average in the gradients.
pub type FinishBucket = fn(&dyn ProcessGroup, &Bucket, &mut Tensor, Work, &[Named]) -> Result<(), DistError>;

/// Three steps a [`Reducer`] runs instead of the library's
/// (chapter 6: the learner's), each handed its bucket and a second handle
/// on the bucket's buffer.
#[derive(Clone, Copy)]
pub struct OverlapSteps {
    pub mark_ready: MarkReady,
    pub launch_bucket: LaunchBucket,
    pub finish_bucket: FinishBucket,
}

impl BucketSteps for OverlapSteps {
    fn mark_ready(&self, progress: &mut BucketProgress, param: usize) -> Vec<usize> {
        (self.mark_ready)(progress, param)
    }

    fn launch(&self, (pg, buckets, params): Buckets<'_>, b: usize) -> Result<Work, DistError> {
        (self.launch_bucket)(pg, &buckets.layout()[b], &mut buckets.buffer(b), params)
    }

    fn finish(&self, (pg, buckets, params): Buckets<'_>, b: usize, work: Work) -> Result<(), DistError> {
        (self.finish_bucket)(pg, &buckets.layout()[b], &mut buckets.buffer(b), work, params)
    }
}

/// Chapter 6's door: a [`Reducer`] running the learner's three steps.
pub trait ReducerWithSteps: Sized {
    /// [`Reducer::new`] with other steps (chapter 6: the learner's).
    fn with_steps(
        pg: Group,
        params: &[Named],
        buckets: GradientBuckets,
        steps: OverlapSteps,
    ) -> Result<Self, DistError>;
}

impl ReducerWithSteps for Reducer {
    fn with_steps(
        pg: Group,
        params: &[Named],
        buckets: GradientBuckets,
        steps: OverlapSteps,
    ) -> Result<Self, DistError> {
        Self::hooked(pg, params, buckets, Box::new(steps))
    }
}

/// Chapter 11's door: a [`ShardedAdamW`] running the learner's two functions.
pub trait ZeroWithSteps: Sized {
    /// [`ShardedAdamW::new`] running `steps` instead of the library's
    /// `shard_of` and `step_bucket` (chapter 11: the learner's). What
    /// `shard_of` returns is checked on every bucket.
    fn with_steps(
        params: &[Named],
        pg: Group,
        caps: BucketCaps,
        lr: f64,
        weight_decay: f64,
        steps: ZeroSteps,
    ) -> Result<Self, DistError>;
}

impl ZeroWithSteps for ShardedAdamW {
    fn with_steps(
        params: &[Named],
        pg: Group,
        caps: BucketCaps,
        lr: f64,
        weight_decay: f64,
        steps: ZeroSteps,
    ) -> Result<Self, DistError> {
        Self::built_with(params, pg, caps, lr, weight_decay, steps)
    }
}

/// Chapter 13's door: a [`ShardGradOp`](super::ShardGradOp) running the
/// learner's functions.
pub trait GradOpWithSteps<M: Module>: Sized {
    /// [`ShardGradOp::new`](super::ShardGradOp::new) running `steps`
    /// instead of the library's `reduce_scatter_bucket` and `keep_shard`
    /// (chapter 13: the learner's). What they return is checked on every
    /// bucket.
    fn with_steps(
        module: M,
        vs: &nn::VarStore,
        pg: Group,
        caps: BucketCaps,
        lr: f64,
        weight_decay: f64,
        steps: GradOpSteps,
    ) -> Result<Self, DistError>;
}

impl<M: Module> GradOpWithSteps<M> for super::ShardGradOp<M> {
    fn with_steps(
        module: M,
        vs: &nn::VarStore,
        pg: Group,
        caps: BucketCaps,
        lr: f64,
        weight_decay: f64,
        steps: GradOpSteps,
    ) -> Result<Self, DistError> {
        Self::built_with(module, vs, pg, caps, lr, weight_decay, steps)
    }
}

/// Chapter 14's door: a [`FullyShard`] whose decisions (the rows each rank
/// keeps; what to gather, prefetch, free and reduce-scatter around each
/// unit) are `schedule`'s instead of the library's: chapter 14 passes the
/// learner's. The units, hooks, collectives and memory accounting stay the
/// library's.
pub trait FsdpWithSchedule: Sized {
    /// [`FullyShard::gpt`] running `schedule`.
    fn gpt_with_schedule(
        gpt: &Gpt,
        vs: &nn::VarStore,
        pg: Group,
        options: FsdpOptions,
        schedule: FsdpSchedule,
    ) -> Result<Self, DistError>;

    /// [`FullyShard::mlp`] running `schedule`.
    fn mlp_with_schedule(
        mlp: &Mlp,
        vs: &nn::VarStore,
        pg: Group,
        options: FsdpOptions,
        per_layer: bool,
        schedule: FsdpSchedule,
    ) -> Result<Self, DistError>;
}

impl FsdpWithSchedule for FullyShard {
    fn gpt_with_schedule(
        gpt: &Gpt,
        vs: &nn::VarStore,
        pg: Group,
        options: FsdpOptions,
        schedule: FsdpSchedule,
    ) -> Result<Self, DistError> {
        FullyShard::gpt(gpt, vs, pg, FsdpOptions { schedule, ..options })
    }

    fn mlp_with_schedule(
        mlp: &Mlp,
        vs: &nn::VarStore,
        pg: Group,
        options: FsdpOptions,
        per_layer: bool,
        schedule: FsdpSchedule,
    ) -> Result<Self, DistError> {
        FullyShard::mlp(mlp, vs, pg, FsdpOptions { schedule, ..options }, per_layer)
    }
}
