//! The finished DDP wrapper: [`SimpleDistributedDataParallelism`], everything
//! the chapters built, as the training run uses it. At construction every
//! rank gets rank 0's parameters and buffers (as PyTorch's wrapper does;
//! chapter 2's strict check is an option), gradients are averaged in buckets whose all-reduces leave
//! during [`backward`](SimpleDistributedDataParallelism::backward), except
//! inside a [`no_sync`](SimpleDistributedDataParallelism::no_sync) scope,
//! and a clock measures the time spent waiting for them after backward.
//! PyTorch's `DistributedDataParallel`; the buckets and hooks are the
//! [`Reducer`]'s.
//!
//! | file | what |
//! | --- | --- |
//! | this one | [`SimpleDistributedDataParallelism`], and what it asks of an optimizer: [`StepOptimizer`] |
//! | `no_sync.rs` | the switch that `no_sync` turns off, and its guard |
//! | `step.rs` | one optimizer step with gradient accumulation: [`train_step`](step::train_step) |
//! | `accumulation.rs` | the batch arithmetic of accumulation, and its errors |

pub(crate) mod accumulation;
pub(crate) mod no_sync;
pub(crate) mod step;

use std::cell::Cell;
use std::ops::Deref;
use std::time::{Duration, Instant};

use tch::nn::{self, Module};
use tch::{TchError, Tensor};

use crate::ddp::reducer::{
    Bucket, BucketCaps, BucketingError, CommHook, GradientBuckets, Reducer, StepRecord,
};
use crate::ddp::replica_check::InitSync;
use crate::ddp::replicated::Replicated;
use crate::dist::{DistError, Group};
use no_sync::{NoSyncGuard, SyncSwitch};

/// What [`optimizer_step`](SimpleDistributedDataParallelism::optimizer_step),
/// and so [`train_step`](super::train_step), asks of an optimizer.
pub trait StepOptimizer {
    /// Forgets every gradient: backward adds to `.grad`, so each step starts
    /// from nothing.
    fn zero_grad(&mut self);
    /// Updates every parameter that has a gradient.
    fn step(&mut self) -> Result<(), TchError>;
    /// With `find_unused_parameters`, called before each `step` by
    /// [`optimizer_step`](SimpleDistributedDataParallelism::optimizer_step):
    /// the parameters (by name) that got no gradient in this step. PyTorch's
    /// DDP leaves such a parameter's `.grad` as `zero_grad` left it, `None`,
    /// and its optimizers skip it: no momentum, no weight decay, and its
    /// step count (the bias correction's) does not advance. Here gradients
    /// live in the buckets and `zero_grad` zeroes them, so the wrapper says
    /// which. The default ignores it (tch's optimizers cannot skip a
    /// parameter: they step it on a zero gradient).
    fn skip_unused(&mut self, unused: &UnusedParameters) {
        let _ = unused;
    }
}

/// Which parameters got no gradient in a step, by name, as
/// [`StepOptimizer::skip_unused`] hears it.
#[derive(Clone, Debug, PartialEq)]
pub enum UnusedParameters {
    /// No rank gave them a gradient: the ranks agreed at the gradient sync.
    OnEveryRank(Vec<String>),
    /// This rank gave them none; no sync ran since the last step (ZeRO-1,
    /// whose step averages the gradients), so the optimizer must ask the
    /// other ranks before it skips one.
    OnThisRank(Vec<String>),
}

// ANCHOR: wrapper
/// A model replicated on every rank of a process group, with everything the
/// chapters built: equal replicas from the start (chapter 2), gradients averaged in
/// buckets (chapters 3 and 5) that leave during backward (chapter 6) unless
/// a `no_sync` scope is open (chapter 4), and a clock on the time spent
/// waiting for them. The replicated model's accessors (`parameters`,
/// `module`, `rank`, ...) come through `Deref` from [`Replicated`].
pub struct SimpleDistributedDataParallelism<M: Module> {
    replicated: Replicated<M>,
    reducer: Reducer,
    /// PyTorch's `find_unused_parameters`: whether a parameter may get no
    /// gradient in a step (see [`Self::find_unused_parameters`]).
    find_unused: bool,
    switch: SyncSwitch,
    /// Backward passes since the last sync. It names each sync, so that a
    /// rank that opened `no_sync` where its peers did not is caught at once.
    backwards_since_sync: Cell<u64>,
    /// Wall time spent waiting for gradient syncs after backward (the part
    /// of the communication that did not overlap), and how many there were.
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

    /// Wraps `module`, whose variables live in `vs`, as PyTorch's
    /// `DistributedDataParallel(module)` does: after checking that every rank
    /// of `pg` holds the same tensors (names, dtypes, shapes, which require
    /// grad), it copies rank 0's parameters and buffers to every rank
    /// ([`InitSync::Broadcast`]), so that ranks seeded differently, or a
    /// checkpoint loaded on rank 0 only, still start alike. Then it plans
    /// its buckets with these caps. Every rank must call it, with the same
    /// caps; on a problem every rank gets the same error.
    pub fn with_bucket_caps(
        module: M,
        vs: &nn::VarStore,
        pg: Group,
        caps: BucketCaps,
    ) -> Result<Self, BucketingError> {
        Self::with_init_sync(module, vs, pg, caps, InitSync::Broadcast)
    }

    /// [`with_bucket_caps`](Self::with_bucket_caps), making the replicas
    /// equal as `init_sync` says: broadcast rank 0's values, or
    /// ([`InitSync::Verify`]) only check that every rank holds bitwise rank
    /// 0's and refuse the model otherwise, changing nothing (chapter 2).
    ///
    /// Only the parameters that require grad get buckets and hooks: one
    /// frozen before wrapping (`set_requires_grad(false)`) is broadcast (or
    /// checked) with the others and then left alone, as in PyTorch. A tensor
    /// used by two layers (tied weights) is one parameter, averaged once.
    pub fn with_init_sync(
        module: M,
        vs: &nn::VarStore,
        pg: Group,
        caps: BucketCaps,
        init_sync: InitSync,
    ) -> Result<Self, BucketingError> {
        let replicated = Replicated::checked_with(module, vs, pg, init_sync.check())?;
        let pg = replicated.process_group().clone();
        let buckets = GradientBuckets::plan(pg.as_ref(), replicated.parameters(), caps)?;
        let reducer = Reducer::new(pg, replicated.parameters(), buckets).map_err(BucketingError::Dist)?;
        Ok(SimpleDistributedDataParallelism {
            replicated,
            reducer,
            find_unused: false,
            switch: SyncSwitch::new(),
            backwards_since_sync: Cell::new(0),
            sync_time: Cell::new(Duration::ZERO),
            syncs: Cell::new(0),
        })
    }

    // ANCHOR: backward
    /// Runs `loss.backward()`, which ADDS this loss's gradients to every
    /// parameter's `.grad`. Unless a `no_sync` scope is open, each bucket's
    /// all-reduce starts as soon as backward has its gradients, and this
    /// waits for them all and leaves the averages in the gradients.
    pub fn backward(&self, loss: &Tensor) -> Result<(), DistError> {
        self.backwards_since_sync.set(self.backwards_since_sync.get() + 1);
        if !self.switch.is_on() {
            return self.replicated.local_backward(loss); // accumulate here, send nothing
        }
        self.reducer.arm(self.sync_tag());
        let backward = self.replicated.local_backward(loss);
        // What is left to wait for is what did not overlap. Finish even when
        // this rank's backward failed: its peers' buckets wait for its own,
        // and the end-of-backward check fails the step everywhere.
        let started = Instant::now();
        let synced = self.reducer.finish(self.find_unused, backward);
        self.clocked(started, synced)
    }

    /// Averages every gradient over all ranks, one all-reduce per bucket, and
    /// adds the wall time it took to [`sync_time`](Self::sync_time). For a
    /// caller that ran `loss.backward()` itself (nothing overlaps then);
    /// `backward` syncs on its own.
    pub fn sync_gradients(&self) -> Result<(), DistError> {
        let started = Instant::now();
        let synced = self.reducer.sync_now(self.sync_tag(), self.find_unused);
        self.clocked(started, synced)
    }

    /// Names a sync by the backward passes since the last one: every rank
    /// must have run as many, and the tag makes the backends compare them.
    fn sync_tag(&self) -> String {
        let passes = self.backwards_since_sync.replace(0);
        format!("gradient sync after {passes} backward pass(es)")
    }

    /// Counts a sync that began at `started`.
    fn clocked(&self, started: Instant, synced: Result<(), DistError>) -> Result<(), DistError> {
        self.sync_time.set(self.sync_time.get() + started.elapsed());
        self.syncs.set(self.syncs.get() + 1);
        synced
    }

    /// `optimizer.step()` on the averaged gradients, after the last
    /// micro-batch's backward, with a libtorch error named as this rank's.
    /// [`train_step`](step::train_step) calls it.
    /// With `find_unused_parameters`, it first tells the optimizer which
    /// parameters got no gradient ([`StepOptimizer::skip_unused`]).
    pub fn optimizer_step<O: StepOptimizer>(&self, optimizer: &mut O) -> Result<(), DistError> {
        if self.find_unused {
            let names = |indices: Vec<usize>| -> Vec<String> {
                indices.into_iter().map(|i| self.parameters()[i].0.clone()).collect()
            };
            let unused_here = names(self.reducer.take_unused_here());
            let unused_everywhere = names(self.reducer.take_no_gradient());
            let unused = if self.backwards_since_sync.get() == 0 {
                // The last backward synced: the ranks agreed on the list.
                UnusedParameters::OnEveryRank(unused_everywhere)
            } else {
                UnusedParameters::OnThisRank(unused_here)
            };
            optimizer.skip_unused(&unused);
        }
        let op = "optimizer.step()".to_string();
        optimizer.step().map_err(|cause| DistError::Torch { rank: self.rank(), op, cause })
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

    /// PyTorch's `find_unused_parameters=True`: a parameter that gets no
    /// gradient in a step (on some rank, or on all) is not an error; its
    /// bucket leaves with zeros in its slot at the end of backward, a rank
    /// that did not use it gets the others' average. A parameter no rank
    /// used keeps a zero gradient here (gradients live in the buckets), but
    /// [`optimizer_step`](Self::optimizer_step) names it to the optimizer
    /// ([`StepOptimizer::skip_unused`]): the workbook's AdamW and
    /// `ShardedAdamW` then leave it as PyTorch's AdamW leaves a parameter
    /// whose gradient is `None` (tch's optimizers cannot, and step it on
    /// zeros). Off by default, as in PyTorch: then such a parameter fails
    /// the step on every rank, by name. Set it the same on every rank.
    pub fn find_unused_parameters(mut self, on: bool) -> Self {
        self.find_unused = on;
        self
    }

    /// PyTorch's `register_comm_hook`: from the next backward on, each
    /// bucket is averaged by `hook` instead of the library's all-reduce and
    /// division (`ddp::bf16_compress_hook` sends bfloat16, half the bytes).
    /// Register the same hook on every rank, between steps.
    pub fn register_comm_hook(&self, hook: CommHook) {
        self.reducer.register_comm_hook(hook);
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

    /// The bucket layout, in the order the buckets are all-reduced. After
    /// the first synced step it follows the order in which the gradients
    /// became ready (the reducer re-plans it once).
    pub fn buckets(&self) -> Vec<Bucket> {
        self.reducer.layout()
    }

    /// The last synced backward as it happened: when each bucket left, and
    /// in which order the gradients became ready.
    pub fn last_step(&self) -> StepRecord {
        self.reducer.last_step()
    }

    /// The names of each bucket's parameters, in buffer order.
    pub fn bucket_names(&self) -> Vec<Vec<String>> {
        self.reducer.names()
    }

    /// Wall time spent waiting for gradient syncs after backward since
    /// construction (or the last [`reset_sync_time`](Self::reset_sync_time)):
    /// the communication that backward did not hide, plus waiting for the
    /// slowest rank to arrive. Compare it with the step time to see the share.
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
