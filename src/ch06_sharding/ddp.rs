//! Chapter 06, already solved: the whole `SimpleDistributedDataParallelism`,
//! assembled from the reference code of chapters 2 to 5, plus a clock on the
//! gradient sync. This is the wrapper that a real training run uses
//! (`examples/train.rs`).
//!
//! Its tests: `cargo test --features solutions --test chapter_06`
//!
//! What comes from where:
//! - construction: chapter 2's structure check and `verify_replicas`;
//! - the layout and the sync: chapter 5's `plan_buckets` and `sync_bucket`,
//!   one all-reduce per bucket;
//! - `backward` and `no_sync`: chapter 4's switch and its `NoSyncGuard`,
//!   opened with chapter 4's reference `begin_no_sync`.

use std::cell::Cell;
use std::time::{Duration, Instant};

use tch::nn::{self, Module};
use tch::Tensor;

use crate::ch02_replicas::verified_tensors;
use crate::ch04_accumulation::NoSyncGuard;
use crate::ch05_bucketing::layout::{self, Bucket, ParamMeta};
use crate::ch05_bucketing::solution::{plan_buckets, sync_bucket};
use crate::ch05_bucketing::{
    check_missing_gradients, check_same_layout, BucketingError, DEFAULT_BUCKET_CAP_BYTES,
    DEFAULT_FIRST_BUCKET_CAP_BYTES,
};
use crate::dist::{CommStats, DistError, Group, ReduceOp};

// ANCHOR: wrapper
/// A model replicated on every rank of a process group, with everything the
/// chapters built: replicas checked at construction, gradients averaged in
/// buckets (one all-reduce per bucket) by [`backward`](Self::backward),
/// except inside a [`no_sync`](Self::no_sync) scope, and a clock on the
/// time spent doing so.
pub struct SimpleDistributedDataParallelism<M: Module> {
    module: M,
    /// Trainable tensors, in registration order (shallow handles: they share
    /// storage, and `.grad()`, with the model).
    parameters: Vec<(String, Tensor)>,
    /// Non-trainable tensors (buffers), sorted by name.
    buffers: Vec<(String, Tensor)>,
    process_group: Group,
    /// The layout, planned once; the same on every rank.
    buckets: Vec<Bucket>,
    /// One flat buffer per bucket, `[bucket.numel]`, allocated once.
    bucket_buffers: Vec<Tensor>,
    /// Whether `backward` averages the gradients (chapter 4's switch).
    require_backward_grad_sync: Cell<bool>,
    /// Wall time spent in gradient syncs, and how many there were.
    sync_time: Cell<Duration>,
    syncs: Cell<u64>,
}
// ANCHOR_END: wrapper

impl<M: Module> SimpleDistributedDataParallelism<M> {
    /// Wraps `module` with PyTorch's default caps: 1 MiB for the first bucket
    /// of each dtype and device, 25 MiB for the others.
    pub fn new(module: M, vs: &nn::VarStore, pg: Group) -> Result<Self, BucketingError> {
        Self::with_bucket_caps(module, vs, pg, DEFAULT_BUCKET_CAP_BYTES, DEFAULT_FIRST_BUCKET_CAP_BYTES)
    }

    /// Wraps `module`, whose variables live in `vs`, after checking that every
    /// rank of `pg` holds bitwise the same parameters and buffers, and plans
    /// its buckets with these caps, in bytes. Every rank must call it, with
    /// the same caps; on a problem every rank gets the same error.
    pub fn with_bucket_caps(
        module: M,
        vs: &nn::VarStore,
        pg: Group,
        cap_bytes: usize,
        first_cap_bytes: usize,
    ) -> Result<Self, BucketingError> {
        if cap_bytes == 0 || first_cap_bytes == 0 {
            let what = if cap_bytes == 0 { "the bucket cap" } else { "the first bucket's cap" };
            return Err(BucketingError::InvalidCap { what, bytes: 0 });
        }
        let (parameters, buffers) = verified_tensors(vs, pg.as_ref())?;

        let metas = ParamMeta::of(&parameters);
        let buckets = plan_buckets(&metas, cap_bytes, first_cap_bytes);
        layout::check_plan(&metas, &buckets).map_err(BucketingError::BadPlan)?;
        check_same_layout(pg.as_ref(), cap_bytes, first_cap_bytes, &buckets)?;
        let bucket_buffers =
            buckets.iter().map(|b| Tensor::zeros([b.numel as i64], (b.kind, b.device))).collect(); // [numel] each

        Ok(SimpleDistributedDataParallelism {
            module,
            parameters,
            buffers,
            process_group: pg,
            buckets,
            bucket_buffers,
            require_backward_grad_sync: Cell::new(true),
            sync_time: Cell::new(Duration::ZERO),
            syncs: Cell::new(0),
        })
    }

    /// Runs the wrapped model: the forward pass needs no communication.
    pub fn forward(&self, xs: &Tensor) -> Tensor {
        self.module.forward(xs)
    }

    // ANCHOR: backward
    /// Runs `loss.backward()`, which ADDS this loss's gradients to every
    /// parameter's `.grad`; then, unless a `no_sync` scope is open, averages
    /// the gradients over all ranks, bucket by bucket.
    pub fn backward(&self, loss: &Tensor) -> Result<(), DistError> {
        loss.f_backward().map_err(|source| DistError::Torch {
            rank: self.process_group.rank(),
            op: "loss.backward()".to_string(),
            source,
        })?;
        if self.require_backward_grad_sync.get() {
            self.sync_gradients()?;
        }
        Ok(())
    }

    /// Averages every gradient over all ranks, one all-reduce per bucket, and
    /// adds the wall time it took to [`sync_time`](Self::sync_time). Called
    /// by `backward`; call it yourself only if you run `loss.backward()`
    /// yourself.
    pub fn sync_gradients(&self) -> Result<(), DistError> {
        let started = Instant::now();
        let pg = self.process_group.as_ref();
        for (bucket, buffer) in self.buckets.iter().zip(&self.bucket_buffers) {
            // A second handle on the same storage: sync_bucket needs `&mut`,
            // and `&self` is what lets backward run inside a no_sync scope.
            let mut buffer = buffer.shallow_clone();
            sync_bucket(pg, bucket, &mut buffer, &self.parameters)?;
            check_missing_gradients(pg, bucket, &buffer, &self.parameters)?;
        }
        self.sync_time.set(self.sync_time.get() + started.elapsed());
        self.syncs.set(self.syncs.get() + 1);
        Ok(())
    }
    // ANCHOR_END: backward

    // ANCHOR: no_sync
    /// Opens a scope in which [`backward`](Self::backward) only accumulates
    /// gradients on this rank and sends nothing; dropping the guard puts the
    /// switch back as it was (also on `?` and on panic). Bind it to a name:
    /// `let _no_sync = ddp.no_sync();` (`let _ = ...` drops it at once).
    pub fn no_sync(&self) -> NoSyncGuard<'_> {
        NoSyncGuard::open_with_reference(&self.require_backward_grad_sync)
    }
    // ANCHOR_END: no_sync

    /// The closure form of [`no_sync`](Self::no_sync).
    pub fn no_sync_scope<R>(&self, body: impl FnOnce() -> R) -> R {
        let _no_sync = self.no_sync();
        body()
    }

    /// Whether the next `backward` will average the gradients.
    pub fn require_backward_grad_sync(&self) -> bool {
        self.require_backward_grad_sync.get()
    }
}

// ANCHOR: accessors
impl<M: Module> SimpleDistributedDataParallelism<M> {
    /// The wrapped model. Save ITS weights (the `VarStore` you built it
    /// from), on rank 0 only: they are the same on every rank.
    pub fn module(&self) -> &M {
        &self.module
    }

    /// Unwraps the model, e.g. to evaluate it alone after training.
    pub fn into_module(self) -> M {
        self.module
    }

    pub fn process_group(&self) -> &Group {
        &self.process_group
    }

    pub fn rank(&self) -> usize {
        self.process_group.rank()
    }

    pub fn world_size(&self) -> usize {
        self.process_group.world_size()
    }

    /// The trainable tensors, in registration order.
    pub fn parameters(&self) -> &[(String, Tensor)] {
        &self.parameters
    }

    /// The non-trainable tensors, sorted by name.
    pub fn buffers(&self) -> &[(String, Tensor)] {
        &self.buffers
    }

    /// The bucket layout, in the order the buckets are all-reduced.
    pub fn buckets(&self) -> &[Bucket] {
        &self.buckets
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

    /// What this rank has sent through the process group so far (all calls,
    /// including construction's checks and [`mean_over_ranks`](Self::mean_over_ranks)).
    pub fn stats(&self) -> CommStats {
        self.process_group.stats()
    }

    /// The mean of `value` over all ranks, for logging: each rank's loss is
    /// the loss of its own shard; this is the global batch's. Every rank must
    /// call it (one all-reduce); it is not counted in `sync_time`.
    pub fn mean_over_ranks(&self, value: f64) -> Result<f64, DistError> {
        let mut value = Tensor::from(value); // [] f64
        self.process_group.all_reduce(&mut value, ReduceOp::Sum)?;
        Ok(value.double_value(&[]) / self.world_size() as f64)
    }
}
// ANCHOR_END: accessors
