//! Spoiler: this file holds the library's answer to chapter 6's `mark_ready`
//! (`src/ch06_overlap/exercise.rs`). Working through the book? Write yours
//! first; the book shows the parts of this file you need, and the answer at
//! the end of the chapter.
//!
//! Buckets that leave during backward (PyTorch's reducer), one gradient's way
//! through them: its hook marks it ready ([`mark_ready`]); once a bucket is
//! complete, and every bucket before it has left, its asynchronous all-reduce
//! starts while backward computes the earlier layers. After backward,
//! [`OverlappedBuckets::finish`] waits, divides, checks with every rank, and
//! after the first step re-plans. Launch and finish are [`GradientBuckets`]'
//! own (chapter 6 runs its steps here through `ddp::seams`; the library never
//! does). What the driver shows its caller is in `overlap_record.rs`.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tch::Tensor;

use super::buckets::{FlatGroups, GradientBuckets};
use super::end_of_backward::EndOfBackward;
use super::layout::{agree_on_order, Bucket};
use super::overlap_record::{Launch, StepRecord};
use crate::autograd::GradReadyHooks;
use crate::dist::{tagged, DistError, Group, ProcessGroup, Work};
use crate::models::Named;

/// What a bucket step is handed: the group, the buckets, the parameters.
pub(crate) type Buckets<'a> = (&'a dyn ProcessGroup, &'a GradientBuckets, &'a [Named]);

/// The three steps of an overlapped sync, as the driver calls them. The
/// library's are the defaults ([`LibrarySteps`]); chapter 6's come through
/// `ddp::seams`.
pub(crate) trait BucketSteps: Send {
    /// A hook said `param`'s gradient is final: the buckets that may leave now.
    fn mark_ready(&self, progress: &mut BucketProgress, param: usize) -> Vec<usize> {
        mark_ready(progress, param)
    }
    /// Starts bucket `b`'s all-reduce (SUM), its gradients in their slots.
    fn launch(&self, (pg, buckets, params): Buckets<'_>, b: usize) -> Result<Work, DistError> {
        buckets.launch_bucket(pg, b, params)
    }
    /// Waits for bucket `b` and leaves the average in its gradients.
    fn finish(&self, (pg, buckets, _): Buckets<'_>, b: usize, work: Work) -> Result<(), DistError> {
        buckets.finish_bucket(pg, b, work)
    }
}

/// The library's steps: the trait's defaults.
struct LibrarySteps;

impl BucketSteps for LibrarySteps {}

// ANCHOR: progress
/// Where one backward pass stands: which gradients are ready, how many each
/// bucket still waits for, and which buckets have been handed out to leave.
#[derive(Clone, Debug)]
pub struct BucketProgress {
    /// For each parameter (registration index), the bucket it belongs to.
    pub bucket_of: Vec<usize>,
    /// For each bucket, how many of its members are not ready yet.
    pub pending: Vec<usize>,
    /// For each parameter, whether its gradient is ready in this pass.
    pub ready: Vec<bool>,
    /// For each bucket, whether `mark_ready` has returned it in this pass.
    pub launched: Vec<bool>,
}
// ANCHOR_END: progress

impl BucketProgress {
    /// Nothing ready yet, for these buckets of `param_count` parameters.
    pub fn new(layout: &[Bucket], param_count: usize) -> BucketProgress {
        let mut bucket_of = vec![0; param_count];
        for (b, bucket) in layout.iter().enumerate() {
            bucket.params.iter().for_each(|&p| bucket_of[p] = b);
        }
        let pending = layout.iter().map(|b| b.params.len()).collect();
        let (ready, launched) = (vec![false; param_count], vec![false; layout.len()]);
        BucketProgress { bucket_of, pending, ready, launched }
    }

    /// Back to nothing ready, for the next pass over the same `layout`
    /// (`bucket_of` stays: it changes only with the layout).
    pub fn reset(&mut self, layout: &[Bucket]) {
        self.pending.iter_mut().zip(layout).for_each(|(pending, b)| *pending = b.params.len());
        self.ready.iter_mut().for_each(|r| *r = false);
        self.launched.iter_mut().for_each(|l| *l = false);
    }

    /// The parameters not marked ready in this pass.
    pub fn not_ready(&self) -> Vec<usize> {
        (0..self.ready.len()).filter(|&i| !self.ready[i]).collect()
    }
}

// ANCHOR: mark_ready
/// A gradient-ready hook says that parameter `param`'s gradient is final.
/// Marks it ready in `progress` and returns the buckets that may leave now,
/// in bucket order: after the last bucket launched, each bucket with no
/// member pending, up to the first that still has one. A second mark of the
/// same parameter in one pass changes nothing.
pub fn mark_ready(progress: &mut BucketProgress, param: usize) -> Vec<usize> {
    if progress.ready[param] {
        return vec![];
    }
    progress.ready[param] = true;
    progress.pending[progress.bucket_of[param]] -= 1;
    let mut bucket = progress.launched.iter().take_while(|&&launched| launched).count();
    let mut launch = vec![];
    while bucket < progress.pending.len() && progress.pending[bucket] == 0 {
        progress.launched[bucket] = true;
        launch.push(bucket);
        bucket += 1;
    }
    launch
}
// ANCHOR_END: mark_ready

/// Where the sync stands, shared by the hooks (on the backward thread) and
/// the caller: the buckets, which have left, and what the last step did.
pub(super) struct SyncState {
    pg: Group,
    pub(super) buckets: GradientBuckets,
    pub(super) params: Vec<Named>,
    /// How buckets are marked, launched and finished: [`LibrarySteps`].
    steps: Box<dyn BucketSteps>,
    /// Which gradients are ready and which bucket leaves next (chapter 6).
    progress: BucketProgress,
    /// The launched buckets' handles, in launch order.
    works: Vec<(usize, Work)>,
    /// Off outside a synced backward (under `no_sync`): the hooks then only
    /// let gradients accumulate.
    armed: bool,
    /// Names this step's all-reduces (the backward thread may not be the
    /// caller's, so the caller's `tagged` scope does not reach it).
    tag: String,
    /// The last synced step as it happened: what tests and benchmarks
    /// look at.
    pub(super) record: StepRecord,
    /// Whether the buckets are still to be re-planned after a first step.
    pub(super) replan_pending: bool,
    /// The first error met during backward; reported by `finish`.
    error: Option<DistError>,
    /// Set while a step runs; still set if it panicked, and then the hooks
    /// stop calling steps until `finish` reports the panic.
    interrupted: bool,
}

impl SyncState {
    /// Marks `index` ready and launches what `mark_ready` says may leave.
    pub(super) fn mark(&mut self, index: usize) {
        if self.error.is_some() || self.interrupted {
            return;
        }
        if !self.progress.ready[index] {
            self.record.ready_order.push(index);
        }
        self.interrupted = true;
        for b in self.steps.mark_ready(&mut self.progress, index) {
            if let Err(error) = self.launch(b) {
                self.error = Some(error);
                break;
            }
        }
        self.interrupted = false;
    }

    /// Starts bucket `b`'s all-reduce, after checking that it is the next to
    /// leave: launched out of order, buckets would pair up with the wrong
    /// buckets of other ranks.
    fn launch(&mut self, b: usize) -> Result<(), DistError> {
        let expected = self.works.len();
        if b != expected {
            let detail = format!(
                "mark_ready returned bucket {b}, but the next bucket to leave is bucket {expected}: \
                 buckets must leave one at a time, in bucket order, each once"
            );
            return Err(DistError::Invalid { rank: self.pg.rank(), op: "launching a bucket".into(), detail });
        }
        let (pg, buckets, params) = (self.pg.as_ref(), &self.buckets, &self.params);
        let work =
            tagged(format!("{}, bucket {b}", self.tag), || self.steps.launch((pg, buckets, params), b))?;
        self.works.push((b, work));
        let gradients_ready = self.record.ready_order.len();
        self.record.launches.push(Launch { bucket: b, at: Instant::now(), gradients_ready });
        Ok(())
    }
}

/// Gradient buckets whose all-reduces overlap with backward.
pub struct OverlappedBuckets {
    shared: Arc<Mutex<SyncState>>,
    hooks: GradReadyHooks,
}

impl OverlappedBuckets {
    /// Hooks every parameter of `params` (planned into `buckets`), with the
    /// library's steps.
    pub fn new(pg: Group, params: &[Named], buckets: GradientBuckets) -> Result<Self, DistError> {
        Self::hooked(pg, params, buckets, Box::new(LibrarySteps))
    }

    /// From the next backward on, runs `steps` instead of the current ones
    /// (a communication hook's, `comm_hook.rs`).
    pub(super) fn set_steps(&self, steps: Box<dyn BucketSteps>) {
        self.lock().steps = steps;
    }

    /// [`new`](Self::new), running `steps` (chapter 6's, through `ddp::seams`).
    pub(crate) fn hooked(
        pg: Group,
        params: &[Named],
        buckets: GradientBuckets,
        steps: Box<dyn BucketSteps>,
    ) -> Result<Self, DistError> {
        let shared = Arc::new(Mutex::new(SyncState {
            pg: pg.clone(),
            progress: BucketProgress::new(buckets.layout(), params.len()),
            buckets,
            params: params.iter().map(|(n, p)| (n.clone(), p.shallow_clone())).collect(),
            steps,
            works: vec![],
            armed: false,
            tag: String::new(),
            record: StepRecord::default(),
            replan_pending: true,
            error: None,
            interrupted: false,
        }));
        let for_hooks = shared.clone();
        let tensors: Vec<Tensor> = params.iter().map(|(_, p)| p.shallow_clone()).collect();
        let hooks = GradReadyHooks::register(&tensors, move |i| {
            let mut state = for_hooks.lock().unwrap_or_else(|p| p.into_inner());
            if state.armed {
                state.mark(i);
            }
        })
        .map_err(|e| DistError::Invalid {
            rank: pg.rank(),
            op: "hooking the parameters".into(),
            detail: e.to_string(),
        })?;
        Ok(OverlappedBuckets { shared, hooks })
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, SyncState> {
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Before a backward pass whose gradients are to be synced: its hooks
    /// will launch buckets, their all-reduces named by `tag`.
    pub fn arm(&self, tag: String) {
        let mut p = self.lock();
        p.armed = true;
        p.tag = tag;
        p.record = StepRecord::default();
    }

    /// After the armed backward pass, whose result is `backward`: launches
    /// what has not left (buckets with a parameter that got no gradient, its
    /// slot zero), waits for every all-reduce, divides by the world size,
    /// and checks with every rank that each backward succeeded and computed
    /// the same parameters' gradients. A failed backward on any rank fails
    /// the step on every rank (this rank returns its own backward error);
    /// parameters that got no gradient are named unless
    /// `find_unused_parameters`. After the first successful call, re-plans
    /// the buckets from the observed order, and if that changed the layout,
    /// returns its flat groups: once, for whoever laid something out on the
    /// old buffers (an optimizer reading the gradients in place).
    pub fn finish(
        &self,
        find_unused_parameters: bool,
        backward: Result<(), DistError>,
    ) -> Result<Option<FlatGroups>, DistError> {
        if let Some(message) = self.hooks.take_panic() {
            let mut p = self.lock();
            p.armed = false;
            p.works.clear();
            let SyncState { progress, buckets, .. } = &mut *p;
            progress.reset(buckets.layout());
            p.interrupted = false;
            panic!("{message} (in a gradient-ready hook during backward)");
        }
        let mut p = self.lock();
        p.armed = false;
        p.record.backward_ended = Some(Instant::now());
        let unused = p.progress.not_ready();
        unused.iter().for_each(|&i| p.mark(i)); // their slots are zeros
        let mut result = p.error.take().map_or(Ok(()), Err);
        let (launched, count) = (p.works.len(), p.buckets.layout().len());
        if result.is_ok() && launched < count {
            let detail = format!(
                "every parameter is marked ready, but only {launched} of {count} buckets left: \
                 mark_ready must return each bucket once its last member is ready"
            );
            result = Err(DistError::Invalid { rank: p.pg.rank(), op: "finishing the sync".into(), detail });
        }
        let works: Vec<(usize, Work)> = p.works.drain(..).collect();
        let pg = p.pg.clone();
        for (b, work) in works {
            // Every one is finished, even after an error: the peers wait for it.
            let finished = p.steps.finish((pg.as_ref(), &p.buckets, &p.params), b, work);
            result = result.and(finished);
        }
        let SyncState { progress, buckets, .. } = &mut *p;
        progress.reset(buckets.layout());
        result?;
        let this_rank = EndOfBackward {
            unused: &unused,
            backward_failed: backward.is_err(),
            find_unused_parameters,
            tag: &p.tag,
        };
        let checked = p.buckets.end_of_backward_check(pg.as_ref(), &p.params, this_rank);
        backward?; // this rank's own error says more than the check's
        checked?;
        if !std::mem::replace(&mut p.replan_pending, false) {
            return Ok(None);
        }
        let order = agree_on_order(pg.as_ref(), &p.record.ready_order, p.params.len())?;
        let SyncState { buckets, params, .. } = &mut *p;
        let new_layout = buckets.replan_in_order(pg.as_ref(), params, &order)?;
        if new_layout.is_some() {
            p.progress = BucketProgress::new(p.buckets.layout(), p.params.len());
        }
        Ok(new_layout)
    }
}
