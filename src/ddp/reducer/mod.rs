//! The Reducer (PyTorch's name, from `reducer.cpp`): it owns a model's
//! gradient buckets, the hooks that fire as each gradient becomes final, and
//! the check at the end of backward. One gradient's way through it: its hook
//! marks it ready (`progress.rs`); once a bucket is complete, and every
//! bucket before it has left, the bucket's asynchronous all-reduce starts
//! while backward computes the earlier layers (`buckets.rs`). After
//! backward, [`Reducer::finish`] waits, divides, checks with every rank that
//! each backward succeeded and used the same parameters, and after the first
//! step re-plans the buckets in the order the gradients arrived
//! (`layout.rs`). A communication hook (`comm_hook.rs`) replaces how a
//! bucket is averaged; chapter 6 runs the learner's steps through
//! `ddp::seams` (`steps.rs`).
//!
//! | file | what |
//! | --- | --- |
//! | this one | [`Reducer`], [`StepRecord`] (what the last step did), the end-of-backward check |
//! | `buckets.rs` | [`GradientBuckets`]: planned, allocated, gradients installed in their slots, launched, finished |
//! | `layout.rs` | the bucket layout: [`plan_buckets`], [`BucketCaps`], the re-plan |
//! | `progress.rs` | [`BucketProgress`], [`mark_ready`]: which bucket may leave |
//! | `steps.rs` | the three steps the reducer takes per bucket, which hooks and chapters replace |
//! | `comm_hook.rs` | [`CommHook`] and how a hook takes a bucket's place |
//! | `bf16_hooks.rs` | [`bf16_compress_hook`], [`bf16_compress_hook_pytorch_order`] |

mod bf16_hooks;
mod buckets;
mod comm_hook;
mod layout;
mod progress;
pub(crate) mod steps;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tch::Tensor;

pub use bf16_hooks::{bf16_compress_hook, bf16_compress_hook_pytorch_order};
pub use buckets::{sync_bucket, BucketingError, GradientBuckets, PlanBuckets};
pub use comm_hook::CommHook;
use comm_hook::HookSteps;
pub use layout::{
    agree_on_order, check_plan, layout_fingerprint, plan_buckets, replanned, Bucket, BucketCaps, ParamMeta,
    DEFAULT_BUCKET_CAP_BYTES, DEFAULT_FIRST_BUCKET_CAP_BYTES, MIB,
};
pub use progress::{mark_ready, BucketProgress};
use steps::{BucketSteps, LibrarySteps};

use crate::autograd::GradReadyHooks;
use crate::dist::{tagged, torch_error, DistError, Group, ProcessGroup, ReduceOp, Work};
use crate::models::Named;

/// One bucket's launch in a synced backward.
#[derive(Clone, Debug)]
pub struct Launch {
    pub bucket: usize,
    pub at: Instant,
    /// How many gradients were ready when it left.
    pub gradients_ready: usize,
}

/// What happened in the last synced backward.
#[derive(Clone, Debug, Default)]
pub struct StepRecord {
    /// The buckets, in the order they left.
    pub launches: Vec<Launch>,
    /// The parameters, in the order their gradients became ready.
    pub ready_order: Vec<usize>,
    /// When backward had returned and the sync's end began.
    pub backward_ended: Option<Instant>,
    /// With `find_unused_parameters`: the parameters that got no gradient
    /// on any rank in any backward since the sync before (PyTorch leaves
    /// their `.grad` as it was, `None` after its `zero_grad`, and its
    /// optimizers skip them). Every rank has the same list.
    pub no_gradient: Vec<usize>,
}

/// A model's gradient buckets, whose all-reduces leave during backward as
/// the hooks report gradients ready (PyTorch's `Reducer`).
pub struct Reducer {
    shared: Arc<Mutex<SyncState>>,
    hooks: GradReadyHooks,
}

impl Reducer {
    /// Hooks every parameter of `params` (planned into `buckets`), with the
    /// library's steps.
    pub fn new(pg: Group, params: &[Named], buckets: GradientBuckets) -> Result<Self, DistError> {
        Self::hooked(pg, params, buckets, Box::new(LibrarySteps))
    }

    /// PyTorch's `register_comm_hook`: from the next backward on, each
    /// bucket is averaged by `hook` instead of the all-reduce and division.
    pub fn register_comm_hook(&self, hook: CommHook) {
        self.lock().steps = Box::new(HookSteps(hook));
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
            used: vec![false; params.len()],
            unused_in_every_sync: None,
            error: None,
            interrupted: false,
        }));
        let for_hooks = shared.clone();
        let tensors: Vec<Tensor> = params.iter().map(|(_, p)| p.shallow_clone()).collect();
        let hooks = GradReadyHooks::register(&tensors, move |i| {
            let mut state = for_hooks.lock().unwrap_or_else(|p| p.into_inner());
            state.used[i] = true; // under no_sync too: the sync after it counts it
            if state.armed {
                state.mark(i);
            }
        })
        .map_err(|e| DistError::Invalid {
            rank: pg.rank(),
            op: "hooking the parameters".into(),
            detail: e.to_string(),
        })?;
        Ok(Reducer { shared, hooks })
    }

    fn lock(&self) -> MutexGuard<'_, SyncState> {
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
    /// the buckets from the observed order.
    pub fn finish(
        &self,
        find_unused_parameters: bool,
        backward: Result<(), DistError>,
    ) -> Result<(), DistError> {
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
        let n = p.params.len();
        let used = std::mem::replace(&mut p.used, vec![false; n]);
        let this_rank = EndOfBackward {
            unused: &unused,
            used: &used,
            backward_failed: backward.is_err(),
            find_unused_parameters,
            tag: &p.tag,
        };
        let checked = end_of_backward_check(&p.buckets, pg.as_ref(), &p.params, this_rank);
        backward?; // this rank's own error says more than the check's
        p.record.no_gradient = checked?;
        let n = p.params.len();
        let no_gradient = p.record.no_gradient.clone();
        let every = p.unused_in_every_sync.get_or_insert_with(|| vec![true; n]);
        for (i, unused) in every.iter_mut().enumerate() {
            *unused = *unused && no_gradient.contains(&i);
        }
        if !std::mem::replace(&mut p.replan_pending, false) {
            return Ok(());
        }
        let order = agree_on_order(pg.as_ref(), &p.record.ready_order, p.params.len())?;
        let SyncState { buckets, params, .. } = &mut *p;
        if buckets.replan_in_order(pg.as_ref(), params, &order)? {
            p.progress = BucketProgress::new(p.buckets.layout(), p.params.len());
        }
        Ok(())
    }

    /// Syncs after a backward pass that ran unarmed: every gradient present
    /// counts as ready, the buckets leave now, and [`finish`](Self::finish)
    /// waits for them. For callers that ran `loss.backward()` themselves.
    pub fn sync_now(&self, tag: String, find_unused_parameters: bool) -> Result<(), DistError> {
        self.arm(tag);
        {
            let mut p = self.lock();
            let present: Vec<usize> =
                (0..p.params.len()).filter(|&i| p.params[i].1.grad().defined()).collect();
            present.into_iter().for_each(|i| p.mark(i));
        }
        self.finish(find_unused_parameters, Ok(()))
    }

    /// The parameters whose gradient-ready hook has not fired on this
    /// rank since the last synced backward (under `no_sync`, the ones this
    /// rank has given no gradient so far), and forgets what it saw: the
    /// next call counts from here.
    pub fn take_unused_here(&self) -> Vec<usize> {
        let mut p = self.lock();
        let n = p.params.len();
        let used = std::mem::replace(&mut p.used, vec![false; n]);
        (0..used.len()).filter(|&i| !used[i]).collect()
    }

    /// The parameters that no rank gave a gradient in any synced backward
    /// since the last call (with several syncs in a step, a parameter used
    /// in one of them has a gradient for the step, as in PyTorch), and
    /// starts counting again. Empty if no sync ran since the last call.
    pub fn take_no_gradient(&self) -> Vec<usize> {
        let every = self.lock().unused_in_every_sync.take().unwrap_or_default();
        (0..every.len()).filter(|&i| every[i]).collect()
    }

    /// The last synced backward, as it happened.
    pub fn last_step(&self) -> StepRecord {
        self.lock().record.clone()
    }

    /// Keeps the first layout: no re-plan after the first step.
    pub fn keep_layout(&self) {
        self.lock().replan_pending = false;
    }

    /// The current layout, in the order the buckets leave.
    pub fn layout(&self) -> Vec<Bucket> {
        self.lock().buckets.layout().to_vec()
    }

    /// The names of each bucket's parameters, in buffer order.
    pub fn names(&self) -> Vec<Vec<String>> {
        let p = self.lock();
        p.buckets.names(&p.params)
    }
}

/// Where the sync stands, shared by the hooks (on the backward thread) and
/// the caller: the buckets, which have left, and what the last step did.
struct SyncState {
    pg: Group,
    buckets: GradientBuckets,
    params: Vec<Named>,
    /// How buckets are marked, launched and finished: the library's steps,
    /// a communication hook's, or chapter 6's.
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
    record: StepRecord,
    /// Whether the buckets are still to be re-planned after a first step.
    replan_pending: bool,
    /// Per parameter: whether its hook fired since the last synced
    /// backward, in a `no_sync` backward or the synced one.
    used: Vec<bool>,
    /// Per parameter: whether every sync since the last
    /// [`take_no_gradient`](Reducer::take_no_gradient) found it without a
    /// gradient on every rank; `None` if no sync ran since.
    unused_in_every_sync: Option<Vec<bool>>,
    /// The first error met during backward; reported by `finish`.
    error: Option<DistError>,
    /// Set while a step runs; still set if it panicked, and then the hooks
    /// stop calling steps until `finish` reports the panic.
    interrupted: bool,
}

impl SyncState {
    /// Marks `index` ready and launches what `mark_ready` says may leave.
    fn mark(&mut self, index: usize) {
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

/// What this rank brings to the end-of-backward check.
struct EndOfBackward<'a> {
    /// The parameters whose gradient-ready hook did not fire here.
    unused: &'a [usize],
    /// Per parameter: whether its hook fired here since the last sync
    /// (also in a `no_sync` backward).
    used: &'a [bool],
    /// Whether this rank's `loss.backward()` returned an error.
    backward_failed: bool,
    find_unused_parameters: bool,
    /// The sync's name, for the all-reduce's tag.
    tag: &'a str,
}

/// The check at the end of an overlapped backward, on what went into the
/// buckets' slots.
///
/// A rank whose backward failed, or a parameter without a gradient, still
/// sent its buckets (zeros in the missing slots), so that no rank hangs.
/// Then every rank learns which ranks' backward failed, which parameters
/// got no gradient on some rank, and which got one on some rank: one
/// all-reduce (MAX) of `[unused here (n) | used here (n) | backward failed,
/// per rank]`. Every rank reaches the same verdict: a failed backward anywhere
/// fails the step everywhere (the failing rank gets `PeerGone` naming
/// itself here; its caller reports its own backward error instead); so
/// does a parameter without a gradient unless unused parameters were
/// expected. When they were, a parameter that this rank did not use but
/// another did gets the averaged gradient here too, so that every replica
/// takes the same step. Returns the parameters that no rank gave a
/// gradient since the last sync ([`StepRecord::no_gradient`]).
fn end_of_backward_check(
    buckets: &GradientBuckets,
    pg: &dyn ProcessGroup,
    params: &[Named],
    this_rank: EndOfBackward<'_>,
) -> Result<Vec<usize>, DistError> {
    let (n, world) = (params.len() as i64, pg.world_size() as i64);
    // On the parameters' device: a GPU backend moves GPU tensors only.
    let device = params.first().map_or(tch::Device::Cpu, |(_, p)| p.device());
    let mut flags = Tensor::zeros([2 * n + world], (tch::Kind::Int, device));
    let _ = flags.narrow(0, n, n).fill_(1); // used here, unless marked unused below
    for &i in this_rank.unused {
        let _ = flags.get(i as i64).fill_(1);
        if !this_rank.used[i] {
            // Not in this backward, nor in a no_sync one since the last sync.
            let _ = flags.get(n + i as i64).fill_(0);
        }
    }
    if this_rank.backward_failed {
        let _ = flags.get(2 * n + pg.rank() as i64).fill_(1);
    }
    tagged(format!("{}, end-of-backward check", this_rank.tag), || pg.all_reduce(&mut flags, ReduceOp::Max))?;
    let flags: Vec<i32> = Vec::try_from(flags.to_device(tch::Device::Cpu))
        .map_err(torch_error(pg, "reading the end-of-backward flags"))?;
    let (unused_somewhere, used_somewhere, failed) =
        (&flags[..n as usize], &flags[n as usize..2 * n as usize], &flags[2 * n as usize..]);

    if let Some(peer) = failed.iter().position(|&f| f != 0) {
        let reason = "returned an error from loss.backward() in this step (its own error says why); \
                      every rank fails the step, since the averages would mix in its missing gradients";
        return Err(DistError::PeerGone {
            rank: pg.rank(),
            op: format!("the gradient sync at the end of backward ({})", this_rank.tag),
            peer,
            reason: reason.into(),
        });
    }
    let unused_anywhere: Vec<usize> = (0..params.len()).filter(|&i| unused_somewhere[i] != 0).collect();
    if unused_anywhere.is_empty() {
        return Ok(vec![]);
    }
    if !this_rank.find_unused_parameters {
        let names: Vec<&str> = unused_anywhere.iter().map(|&i| params[i].0.as_str()).collect();
        let detail = format!(
            "parameter(s) {names:?} got no gradient in this backward pass on at least one rank. Their \
             buckets were sent with zeros in their place, so every rank still agrees; but a model \
             that skips parameters must say so: pass `find_unused_parameters: true` (PyTorch's \
             find_unused_parameters=True), or use every parameter in the loss"
        );
        return Err(DistError::Invalid {
            rank: pg.rank(),
            op: "gradient sync at the end of backward".into(),
            detail,
        });
    }
    for &i in this_rank.unused {
        if used_somewhere[i] != 0 {
            buckets.install(pg, i, params)?; // its slot holds the others' average
        }
    }
    Ok((0..params.len()).filter(|&i| used_somewhere[i] == 0).collect())
}
