//! Chapter 06: overlapping communication with backward. Chapter 5's buckets
//! left after backward had finished; here each bucket's all-reduce starts the
//! moment backward has produced its last gradient, while backward goes on
//! computing the earlier layers. You write the three steps, in `exercise.rs`:
//!
//! 1. `mark_ready`: a hook says a gradient is final; which buckets may leave?
//! 2. `launch_bucket`: fill a bucket and start its asynchronous all-reduce;
//! 3. `finish_bucket`: after backward, wait for it and leave the mean in
//!    every gradient (where the division goes is yours to decide).
//!
//! Your code:           `cargo test --test chapter_06`
//! The reference code:  `cargo test --features solutions --test chapter_06`
//! The benchmark:       `cargo run --release --example bench_overlap`
//!
//! This file holds the chapter's [`SimpleDistributedDataParallelism`]:
//! chapter 5's (the library's [`Replicated`] core, bucket layout and
//! `no_sync` switch, so you can start here), whose buckets now go through the
//! library's [`Reducer`], which hooks every parameter and runs
//! YOUR three functions: `mark_ready` on the backward thread, from the
//! hooks; `launch_bucket` for each bucket it returns; `finish_bucket` for
//! every bucket after backward.

use std::ops::Deref;

use tch::nn::{self, Module};
use tch::Tensor;

use crate::ddp::{GradientBuckets, SyncSwitch};
use crate::dist::{DistError, Group};

use crate::ddp::seams::ReducerWithSteps;
pub use crate::ddp::seams::{LocalBackward, OverlapSteps};
pub use crate::ddp::{
    Bucket, BucketCaps, BucketProgress, BucketingError, Launch, NoSyncGuard, Reducer, Replicated, StepRecord,
};

pub mod exercise; // the file you edit
pub mod solution; // the reference solution

/// `learner::f` is your `exercise.rs`, or `solution.rs` with `--features solutions`.
#[cfg(not(feature = "solutions"))]
pub use exercise as learner;
#[cfg(feature = "solutions")]
pub use solution as learner;

/// YOUR three functions, as the library's driver calls them.
pub fn learner_steps() -> OverlapSteps {
    OverlapSteps {
        mark_ready: learner::mark_ready,
        launch_bucket: learner::launch_bucket,
        finish_bucket: learner::finish_bucket,
    }
}

// ANCHOR: wrapper
/// The DDP wrapper as this chapter leaves it: chapter 5's (replicas that
/// start equal, gradients averaged in buckets, `no_sync`), whose buckets now
/// leave during backward. The core's accessors come through `Deref`.
pub struct SimpleDistributedDataParallelism<M: Module> {
    replicated: Replicated<M>,
    /// The library's Reducer: the hooks, the buckets and their progress;
    /// runs YOUR steps.
    reducer: Reducer,
    switch: SyncSwitch,
    find_unused: bool,
}

impl<M: Module> SimpleDistributedDataParallelism<M> {
    /// Wraps `module` after the replica check, plans its buckets with these
    /// caps (the library's planner: chapter 5's reference) and hooks every
    /// parameter. Every rank must call it with the same caps.
    pub fn with_bucket_caps(
        module: M,
        vs: &nn::VarStore,
        pg: Group,
        caps: BucketCaps,
    ) -> Result<Self, BucketingError> {
        let replicated = Replicated::new(module, vs, pg.clone())?;
        let planned = GradientBuckets::plan(pg.as_ref(), replicated.parameters(), caps)?;
        let reducer = Reducer::with_steps(pg, replicated.parameters(), planned, learner_steps())
            .map_err(BucketingError::Dist)?;
        Ok(SimpleDistributedDataParallelism {
            replicated,
            reducer,
            switch: SyncSwitch::new(),
            find_unused: false,
        })
    }

    /// Runs `loss.backward()`. Unless a `no_sync` scope is open, the hooks
    /// launch each bucket as its gradients become ready, and after backward
    /// every bucket is finished: the gradients hold the averages.
    pub fn backward(&self, loss: &Tensor) -> Result<(), DistError> {
        if !self.switch.is_on() {
            return self.backward_local(loss); // hooks stay quiet: gradients accumulate here
        }
        self.reducer.arm("overlapped sync".into());
        let backward = self.backward_local(loss);
        // A failed backward anywhere fails every rank.
        self.reducer.finish(self.find_unused, backward)
    }
}
// ANCHOR_END: wrapper

impl<M: Module> SimpleDistributedDataParallelism<M> {
    /// Opens a scope in which `backward` only accumulates (chapter 4).
    pub fn no_sync(&self) -> NoSyncGuard<'_> {
        self.switch.no_sync()
    }

    /// PyTorch's `find_unused_parameters=True`: a parameter without a
    /// gradient in a step is expected (see the library's wrapper).
    pub fn find_unused_parameters(mut self, on: bool) -> Self {
        self.find_unused = on;
        self
    }

    /// Keeps the first layout instead of re-planning it from the order the
    /// gradients became ready in the first step.
    pub fn keep_layout(self) -> Self {
        self.reducer.keep_layout();
        self
    }

    /// The bucket layout, in the order the buckets leave.
    pub fn buckets(&self) -> Vec<Bucket> {
        self.reducer.layout()
    }

    /// The names of each bucket's parameters, in buffer order.
    pub fn bucket_names(&self) -> Vec<Vec<String>> {
        self.reducer.names()
    }

    /// The last synced backward: the buckets in launch order, with when each
    /// left, and the parameters in the order their gradients became ready.
    pub fn last_step(&self) -> StepRecord {
        self.reducer.last_step()
    }
}

impl<M: Module> Deref for SimpleDistributedDataParallelism<M> {
    type Target = Replicated<M>;

    fn deref(&self) -> &Replicated<M> {
        &self.replicated
    }
}
