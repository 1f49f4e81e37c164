//! The finished DDP wrapper: [`SimpleDistributedDataParallelism`], everything
//! the chapters built, as the training run uses it. Replicas are checked at
//! construction, gradients are averaged in buckets by
//! [`backward`](SimpleDistributedDataParallelism::backward), except inside a
//! [`no_sync`](SimpleDistributedDataParallelism::no_sync) scope, and a clock
//! measures the time spent doing so.
//!
//! Tested by `cargo test --test chapter_06` and `cargo test --test train`.

use std::cell::Cell;
use std::ops::Deref;
use std::time::{Duration, Instant};

use tch::nn::{self, Module};
use tch::Tensor;

use super::bucketed::{BucketingError, GradientBuckets};
use super::layout::{Bucket, BucketCaps};
use super::no_sync::{NoSyncGuard, SyncSwitch};
use super::replicated::Replicated;
use crate::dist::{tagged, DistError, Group};

// ANCHOR: wrapper
/// A model replicated on every rank of a process group, with everything the
/// chapters built: the replica check (chapter 2), gradients averaged in
/// buckets (chapters 3 and 5) by `backward` unless a `no_sync` scope is open
/// (chapter 4), and a clock on the time the sync takes. The replicated
/// model's accessors (`parameters`, `module`, `rank`, ...) come through
/// `Deref` from [`Replicated`].
pub struct SimpleDistributedDataParallelism<M: Module> {
    replicated: Replicated<M>,
    buckets: GradientBuckets,
    switch: SyncSwitch,
    /// Backward passes since the last sync. It names each sync, so that a
    /// rank that opened `no_sync` where its peers did not is caught at once.
    backwards_since_sync: Cell<u64>,
    /// Wall time spent in gradient syncs, and how many there were.
    sync_time: Cell<Duration>,
    syncs: Cell<u64>,
}
// ANCHOR_END: wrapper

impl<M: Module> SimpleDistributedDataParallelism<M> {
    /// Wraps `module` with PyTorch's default caps: 1 MiB for the first bucket
    /// of each dtype and device, 25 MiB for the others.
    pub fn new(module: M, vs: &nn::VarStore, pg: Group) -> Result<Self, BucketingError> {
        Self::with_bucket_caps(module, vs, pg, BucketCaps::default())
    }

    /// Wraps `module`, whose variables live in `vs`, after checking that every
    /// rank of `pg` holds bitwise the same parameters and buffers, and plans
    /// its buckets with these caps. Every rank must call it, with the same
    /// caps; on a problem every rank gets the same error.
    pub fn with_bucket_caps(
        module: M,
        vs: &nn::VarStore,
        pg: Group,
        caps: BucketCaps,
    ) -> Result<Self, BucketingError> {
        let replicated = Replicated::new(module, vs, pg)?;
        let buckets =
            GradientBuckets::plan(replicated.process_group().as_ref(), replicated.parameters(), caps)?;
        Ok(SimpleDistributedDataParallelism {
            replicated,
            buckets,
            switch: SyncSwitch::new(),
            backwards_since_sync: Cell::new(0),
            sync_time: Cell::new(Duration::ZERO),
            syncs: Cell::new(0),
        })
    }

    // ANCHOR: backward
    /// Runs `loss.backward()`, which ADDS this loss's gradients to every
    /// parameter's `.grad`; then, unless a `no_sync` scope is open, averages
    /// the gradients over all ranks, bucket by bucket.
    pub fn backward(&self, loss: &Tensor) -> Result<(), DistError> {
        self.backward_local(loss)?; // adds to .grad
        self.backwards_since_sync.set(self.backwards_since_sync.get() + 1);
        self.switch.sync_if_on(|| self.sync_gradients())
    }

    /// Averages every gradient over all ranks, one all-reduce per bucket, and
    /// adds the wall time it took to [`sync_time`](Self::sync_time). Called
    /// by `backward`; call it yourself only if you run `loss.backward()`
    /// yourself.
    pub fn sync_gradients(&self) -> Result<(), DistError> {
        let started = Instant::now();
        // Every rank must have run as many backward passes since its last
        // sync; the tag makes the in-process backend compare the counts.
        let passes = self.backwards_since_sync.replace(0);
        let tag = format!("gradient sync after {passes} backward pass(es)");
        tagged(tag, || self.buckets.sync(self.process_group().as_ref(), self.parameters()))?;
        self.sync_time.set(self.sync_time.get() + started.elapsed());
        self.syncs.set(self.syncs.get() + 1);
        Ok(())
    }
    // ANCHOR_END: backward

    /// Opens a scope in which [`backward`](Self::backward) only accumulates
    /// gradients on this rank and sends nothing; dropping the guard puts the
    /// switch back as it was (also on `?` and on panic). Bind it to a name:
    /// `let _no_sync = ddp.no_sync();` (`let _ = ...` drops it at once).
    pub fn no_sync(&self) -> NoSyncGuard<'_> {
        self.switch.no_sync()
    }

    /// The closure form of [`no_sync`](Self::no_sync).
    pub fn no_sync_scope<R>(&self, body: impl FnOnce() -> R) -> R {
        let _no_sync = self.no_sync();
        body()
    }

    /// Whether the next `backward` will average the gradients.
    pub fn require_backward_grad_sync(&self) -> bool {
        self.switch.is_on()
    }
}

impl<M: Module> SimpleDistributedDataParallelism<M> {
    /// Unwraps the model, e.g. to evaluate it alone after training.
    pub fn into_module(self) -> M {
        self.replicated.into_module()
    }

    /// The bucket layout, in the order the buckets are all-reduced.
    pub fn buckets(&self) -> &[Bucket] {
        self.buckets.layout()
    }

    /// Each bucket's members and its buffer, where their averaged gradients
    /// are after a sync: `AdamW::with_groups` updates them there, flat.
    pub fn flat_groups(&self) -> Vec<(Vec<usize>, Tensor)> {
        self.buckets.flat_groups()
    }

    /// The names of each bucket's parameters, in buffer order.
    pub fn bucket_names(&self) -> Vec<Vec<String>> {
        self.buckets.names(self.parameters())
    }

    /// Wall time spent in gradient syncs since construction (or the last
    /// [`reset_sync_time`](Self::reset_sync_time)). It includes waiting for
    /// the slowest rank to arrive, so it measures communication plus load
    /// imbalance: compare it with the step time to see the share.
    pub fn sync_time(&self) -> Duration {
        self.sync_time.get()
    }

    /// How many gradient syncs (one all-reduce per bucket each) were timed.
    pub fn gradient_syncs(&self) -> u64 {
        self.syncs.get()
    }

    /// Sets [`sync_time`](Self::sync_time) and
    /// [`gradient_syncs`](Self::gradient_syncs) back to zero (e.g. after
    /// warm-up steps that should not count).
    pub fn reset_sync_time(&self) {
        self.sync_time.set(Duration::ZERO);
        self.syncs.set(0);
    }
}

/// The replicated model's accessors: `ddp.parameters()`, `ddp.module()`,
/// `ddp.rank()`, `ddp.mean_over_ranks(loss)`, ...
impl<M: Module> Deref for SimpleDistributedDataParallelism<M> {
    type Target = Replicated<M>;

    fn deref(&self) -> &Replicated<M> {
        &self.replicated
    }
}
