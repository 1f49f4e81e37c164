//! Chapter 05: bucketing. Chapter 3 made one all-reduce per parameter; every
//! call pays a fixed cost, whatever its size. Here the gradients travel in
//! a few large flat buffers, the buckets: one all-reduce per bucket.
//!
//! Your code:           `cargo test --test chapter_05`
//! The reference code:  `cargo test --features solutions --test chapter_05`
//! The benchmark:       `cargo run --release --example bench_sync`
//!
//! You write two functions in `exercise.rs`:
//! 1. `plan_buckets`: the layout, computed once at construction from the
//!    parameters' sizes, dtypes and devices, in reverse registration order;
//! 2. `sync_bucket`: average one bucket's gradients with one all-reduce of
//!    its buffer, bit for bit what one all-reduce per parameter gives.
//!
//! This file holds the chapter's [`SimpleDistributedDataParallelism`]:
//! chapter 4's (replicas checked, gradients averaged, `no_sync`; the
//! library's code of those chapters, so you can start here), whose sync now
//! goes through [`GradientBuckets`], which check your layout (a valid plan,
//! the same on every rank), own the buffers and run your `sync_bucket` on
//! every bucket. The layout types are the library's (`src/ddp/reducer/layout.rs`).

use std::ops::Deref;

use tch::nn::{self, Module};
use tch::Tensor;

use crate::ddp::SyncSwitch;
use crate::dist::{DistError, Group};

use crate::ddp::seams::BucketsWith;
pub use crate::ddp::seams::LocalBackward;
pub use crate::ddp::{
    Bucket, BucketCaps, BucketingError, GradientBuckets, NoSyncGuard, ParamMeta, Replicated,
    DEFAULT_BUCKET_CAP_BYTES, DEFAULT_FIRST_BUCKET_CAP_BYTES, MIB,
};

pub mod exercise; // the file you edit
pub mod solution; // the reference solution

/// `learner::f` is your `exercise.rs`, or `solution.rs` with `--features solutions`.
#[cfg(not(feature = "solutions"))]
pub use exercise as learner;
#[cfg(feature = "solutions")]
pub use solution as learner;

// ANCHOR: wrapper
/// The DDP wrapper as this chapter leaves it: chapter 4's (replicas that
/// start equal, averaged gradients, `no_sync`), whose gradients are now
/// averaged bucket by bucket: one all-reduce per bucket instead of one per
/// parameter. (picotron calls this stage `DataParallelBucket`.) The core's
/// accessors come through `Deref`.
pub struct SimpleDistributedDataParallelism<M: Module> {
    replicated: Replicated<M>,
    /// The layout YOUR `learner::plan_buckets` planned, and one buffer per bucket.
    buckets: GradientBuckets,
    /// Whether `backward` syncs (chapter 4's switch, the library's).
    switch: SyncSwitch,
}

impl<M: Module> SimpleDistributedDataParallelism<M> {
    /// Wraps `module` after the replica check, and plans its buckets with
    /// YOUR `learner::plan_buckets` and these caps (`BucketCaps::default()`
    /// are PyTorch's: 1 MiB for the first bucket, 25 MiB for the others). Every rank must call it
    /// with the same caps: the library checks that all planned the same layout.
    pub fn with_bucket_caps(
        module: M,
        vs: &nn::VarStore,
        pg: Group,
        caps: BucketCaps,
    ) -> Result<Self, BucketingError> {
        let replicated = Replicated::new(module, vs, pg)?;
        let pg = replicated.process_group().as_ref();
        let buckets = GradientBuckets::plan_with(pg, replicated.parameters(), caps, learner::plan_buckets)?;
        Ok(SimpleDistributedDataParallelism { replicated, buckets, switch: SyncSwitch::new() })
    }

    /// Averages every gradient over all ranks, one all-reduce per bucket, in
    /// bucket order, with YOUR `learner::sync_bucket`. Call it on every rank
    /// after `loss.backward()` and before `optimizer.step()`.
    pub fn sync_gradients(&self) -> Result<(), DistError> {
        self.buckets.sync_with(self.process_group().as_ref(), self.parameters(), learner::sync_bucket)
    }
}
// ANCHOR_END: wrapper

impl<M: Module> SimpleDistributedDataParallelism<M> {
    /// Runs `loss.backward()`, then averages the gradients bucket by bucket
    /// unless a [`no_sync`](Self::no_sync) scope is open (chapter 4).
    pub fn backward(&self, loss: &Tensor) -> Result<(), DistError> {
        self.backward_local(loss)?; // adds to .grad
        self.switch.sync_if_on(|| self.sync_gradients())
    }

    /// Opens a scope in which `backward` only accumulates (chapter 4, the
    /// library's switch): `let _guard = ddp.no_sync();`.
    pub fn no_sync(&self) -> NoSyncGuard<'_> {
        self.switch.no_sync()
    }

    /// The bucket layout, in the order the buckets are all-reduced.
    pub fn buckets(&self) -> &[Bucket] {
        self.buckets.layout()
    }

    /// The names of each bucket's parameters, in buffer order: the layout as
    /// a person reads it.
    pub fn bucket_names(&self) -> Vec<Vec<String>> {
        self.buckets.names(self.parameters())
    }
}

impl<M: Module> Deref for SimpleDistributedDataParallelism<M> {
    type Target = Replicated<M>;

    fn deref(&self) -> &Replicated<M> {
        &self.replicated
    }
}
