//! ZeRO stage 2 in the finished library: [`ShardGradOp`], a replicated
//! model whose gradients and AdamW state are sharded over the ranks
//! (PyTorch FSDP's `ShardingStrategy.SHARD_GRAD_OP`, FSDP2's
//! `fully_shard(reshard_after_forward=False)`, DeepSpeed's stage 2).
//!
//! Every rank holds all the parameters and runs the whole forward and
//! backward. During backward the gradient-ready hooks (chapter 6's, the
//! Reducer's `GradReadyHooks` and `mark_ready`) tell when a bucket is
//! complete; its gradients leave at once in one reduce-scatter (SUM), run on
//! the communication thread while backward computes the earlier layers, and
//! the members' full gradients are dropped. When a reduce-scatter is waited
//! on, this rank keeps its chunk divided by the world size (DDP's average,
//! bit for bit) and the full buffer goes. At most [`BUCKETS_IN_FLIGHT`]
//! buckets are in flight: launching one more first waits for the oldest, so
//! the full gradient never exists at once. `step` runs AdamW
//! ([`AdamWUpdate`], per-parameter step counts as ZeRO-1) on this rank's
//! shard of each bucket and all-gathers the parameters.
//!
//! Gradient accumulation: inside [`no_sync`](ShardGradOp::no_sync) nothing
//! is sent and autograd keeps adding into each parameter's full gradient,
//! between micro-batches: that is what FSDP must keep too (a sharded
//! gradient cannot take the next micro-batch's additions without a
//! reduce-scatter per micro-batch). The last micro-batch's backward,
//! outside `no_sync`, reduce-scatters the sum.
//!
//! Every allocation and free of parameters, gradients (full gradients,
//! flat buckets in flight, shards) and moments is told to a
//! [`MemoryLedger`] ([`ShardGradOp::ledger`]).

use std::collections::VecDeque;
use std::ops::Deref;
use std::sync::{Arc, Mutex, MutexGuard};

use tch::nn::{self, Module};
use tch::{Kind, Tensor};

use super::flat_state::{self, check_shard, lay_out, Moments};
use super::grad_shards::{keep_shard, reduce_scatter_bucket, InFlight};
use super::shards::{shard_of, Shard};
use crate::autograd::{clear_grad, GradReadyHooks};
use crate::ddp::adamw_update::AdamWUpdate;
use crate::ddp::memory::{tensor_bytes, Holding, MemoryLedger};
use crate::ddp::reducer::{mark_ready, plan_buckets, Bucket, BucketCaps, BucketProgress, ParamMeta};
use crate::ddp::replicated::Replicated;
use crate::ddp::wrapper::no_sync::{NoSyncGuard, SyncSwitch};
use crate::dist::{tagged, torch_error, DistError, Group, ProcessGroup, ReduceOp};
use crate::models::Named;

/// How many buckets' reduce-scatters may be in flight at once: the one just
/// launched and the one before (PyTorch's FSDP2 likewise waits for the last
/// reduce-scatter before it frees its input).
pub const BUCKETS_IN_FLIGHT: usize = 2;

/// Starts one bucket's reduce-scatter (see [`reduce_scatter_bucket`]).
pub type ReduceScatterBucket = fn(&dyn ProcessGroup, &[Named], Shard) -> Result<InFlight, DistError>;
/// Waits for one and returns this rank's averaged shard (see [`keep_shard`]).
pub type KeepShard = fn(&dyn ProcessGroup, InFlight) -> Result<Tensor, DistError>;

/// The three functions a [`ShardGradOp`] runs: the library's unless
/// chapter 13 plugs in the learner's (`ddp::seams`).
#[derive(Clone, Copy)]
pub struct GradOpSteps {
    pub shard_of: fn(usize, usize, usize) -> Shard,
    pub reduce_scatter_bucket: ReduceScatterBucket,
    pub keep_shard: KeepShard,
}

impl Default for GradOpSteps {
    fn default() -> Self {
        GradOpSteps { shard_of, reduce_scatter_bucket, keep_shard }
    }
}

/// AdamW's settings (PyTorch's betas and eps).
struct Settings {
    lr: f64,
    weight_decay: f64,
}

/// One bucket as a ZeRO-2 rank holds it between steps.
struct GradOpBucket {
    members: Vec<usize>,
    numel: usize,
    shard: Shard,
    /// `[padded_numel]`: every member's values, then zeros; the members ARE
    /// views into it (every rank holds every parameter: stage 2).
    param: Tensor,
    /// `[len]`: the moments of this rank's shard.
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
}

// ANCHOR: wrapper
/// A model replicated on every rank whose gradients and AdamW moments are
/// sharded (ZeRO stage 2; FSDP's `SHARD_GRAD_OP`). Drive it as DDP with its
/// optimizer inside: `backward` (under `no_sync` for all micro-batches but
/// the last), then `step`.
pub struct ShardGradOp<M: Module> {
    replicated: Replicated<M>,
    state: Arc<Mutex<Backward>>,
    hooks: GradReadyHooks,
    switch: SyncSwitch,
    find_unused: bool,
    backwards_since_sync: std::cell::Cell<u64>,
    buckets: Vec<GradOpBucket>,
    settings: Settings,
    step: i64,
    /// Per parameter, the steps that updated it (PyTorch's `state["step"]`).
    param_steps: Vec<i64>,
}
// ANCHOR_END: wrapper

/// What the hooks (on the backward thread) and the caller share.
struct Backward {
    pg: Group,
    params: Vec<Named>,
    layout: Vec<Bucket>,
    shards: Vec<Shard>,
    progress: BucketProgress,
    armed: bool,
    tag: String,
    in_flight: VecDeque<(usize, InFlight)>,
    launched: usize,
    /// Per bucket, this rank's averaged gradient shard, once reduced.
    grad_shards: Vec<Option<Tensor>>,
    /// Per parameter: whether its full gradient is alive (for the ledger).
    holds_grad: Vec<bool>,
    /// Per parameter: whether its hook fired since the last sync.
    used: Vec<bool>,
    /// Per parameter: whether some rank gave it a gradient in a sync since
    /// the last step.
    used_anywhere: Vec<bool>,
    error: Option<DistError>,
    ledger: MemoryLedger,
    steps: GradOpSteps,
}

impl<M: Module> ShardGradOp<M> {
    /// Wraps `module` (variables in `vs`): rank 0's values on every rank (as
    /// DDP), the parameters laid out in buckets planned with `caps`, each
    /// padded to split into one equal shard per rank, and the members made
    /// views into them. AdamW with `lr` and `weight_decay`, PyTorch's betas
    /// and eps. Every rank calls it with the same model and caps.
    pub fn new(
        module: M,
        vs: &nn::VarStore,
        pg: Group,
        caps: BucketCaps,
        lr: f64,
        weight_decay: f64,
    ) -> Result<Self, DistError> {
        Self::built_with(module, vs, pg, caps, lr, weight_decay, GradOpSteps::default())
    }

    /// [`new`](Self::new), running `steps` (chapter 13's door, `ddp::seams`).
    pub(crate) fn built_with(
        module: M,
        vs: &nn::VarStore,
        pg: Group,
        caps: BucketCaps,
        lr: f64,
        weight_decay: f64,
        steps: GradOpSteps,
    ) -> Result<Self, DistError> {
        let (rank, world_size) = (pg.rank(), pg.world_size());
        let invalid = |op: &str, detail: String| DistError::Invalid { rank, op: op.into(), detail };
        let replicated = Replicated::new(module, vs, pg.clone())
            .map_err(|e| invalid("ShardGradOp::new", e.to_string()))?;
        let params: Vec<Named> =
            replicated.parameters().iter().map(|(n, p)| (n.clone(), p.shallow_clone())).collect();
        let layout = plan_buckets(&ParamMeta::of(&params), caps.cap_bytes, caps.first_cap_bytes);
        let ledger = MemoryLedger::default();
        let (mut buckets, mut shards) = (vec![], vec![]);
        for (b, bucket) in layout.iter().enumerate() {
            let shard = (steps.shard_of)(bucket.numel, world_size, rank);
            check_shard("ShardGradOp::new", pg.as_ref(), bucket.numel, shard)?;
            let param = lay_out(pg.as_ref(), &params, &bucket.params, bucket.numel, shard)?;
            let zeros = |n: usize| Tensor::zeros([n as i64], (bucket.kind, bucket.device));
            let (members, numel, exp_avg, exp_avg_sq) =
                (bucket.params.clone(), bucket.numel, zeros(shard.len), zeros(shard.len));
            let laid = GradOpBucket { members, numel, shard, param, exp_avg, exp_avg_sq };
            ledger.alloc(Holding::Parameters, tensor_bytes(&laid.param), &format!("bucket {b}'s parameters"));
            let moments = tensor_bytes(&laid.exp_avg) + tensor_bytes(&laid.exp_avg_sq);
            ledger.alloc(
                Holding::OptimizerState,
                moments,
                &format!("bucket {b}'s moments, this rank's shard"),
            );
            buckets.push(laid);
            shards.push(shard);
        }
        let n = params.len();
        let state = Arc::new(Mutex::new(Backward {
            pg: pg.clone(),
            progress: BucketProgress::new(&layout, n),
            params: params.iter().map(|(n, p)| (n.clone(), p.shallow_clone())).collect(),
            layout,
            shards,
            armed: false,
            tag: String::new(),
            in_flight: VecDeque::new(),
            launched: 0,
            grad_shards: buckets.iter().map(|_| None).collect(),
            holds_grad: vec![false; n],
            used: vec![false; n],
            used_anywhere: vec![false; n],
            error: None,
            ledger,
            steps,
        }));
        let for_hooks = state.clone();
        let tensors: Vec<Tensor> = params.iter().map(|(_, p)| p.shallow_clone()).collect();
        let hooks = GradReadyHooks::register(&tensors, move |i| {
            let mut state = for_hooks.lock().unwrap_or_else(|p| p.into_inner());
            state.gradient_ready(i);
        })
        .map_err(|e| invalid("hooking the parameters", e.to_string()))?;
        Ok(ShardGradOp {
            replicated,
            state,
            hooks,
            switch: SyncSwitch::new(),
            find_unused: false,
            backwards_since_sync: std::cell::Cell::new(0),
            buckets,
            settings: Settings { lr, weight_decay },
            step: 0,
            param_steps: vec![0; n],
        })
    }

    fn lock(&self) -> MutexGuard<'_, Backward> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    // ANCHOR: backward
    /// Runs `loss.backward()`. Outside `no_sync`, each bucket is
    /// reduce-scattered as soon as its gradients are final, and this waits
    /// for the last ones: afterwards this rank holds its averaged shard of
    /// every bucket and no full gradient. Inside `no_sync` it only adds to
    /// the full gradients.
    pub fn backward(&self, loss: &Tensor) -> Result<(), DistError> {
        self.backwards_since_sync.set(self.backwards_since_sync.get() + 1);
        if !self.switch.is_on() {
            return self.replicated.local_backward(loss); // accumulate here, send nothing
        }
        let passes = self.backwards_since_sync.replace(0);
        {
            let mut state = self.lock();
            state.armed = true;
            state.tag = format!("ZeRO-2 gradient sync after {passes} backward pass(es)");
        }
        let backward = self.replicated.local_backward(loss);
        self.finish(backward)
    }
    // ANCHOR_END: backward

    /// After the armed backward: launches what has not left (a bucket with
    /// a member that got no gradient: zeros in its place), waits for every
    /// reduce-scatter, and checks with every rank (DDP's end-of-backward
    /// check: one MAX all-reduce) that every backward succeeded and which
    /// parameters some rank used.
    fn finish(&self, backward: Result<(), DistError>) -> Result<(), DistError> {
        if let Some(message) = self.hooks.take_panic() {
            // Leave the wrapper as before this backward (nothing armed, no
            // bucket in flight or half-counted), then report the panic.
            let mut state = self.lock();
            state.armed = false;
            let ledger = state.ledger.clone();
            for (b, in_flight) in state.in_flight.drain(..) {
                let label = format!("bucket {b}'s buffers, given up after a panic");
                ledger.free(
                    Holding::Gradients,
                    tensor_bytes(&in_flight.flat) + tensor_bytes(&in_flight.chunk),
                    &label,
                );
            }
            state.launched = 0;
            let Backward { progress, layout, .. } = &mut *state;
            progress.reset(layout);
            drop(state);
            panic!("{message} (in a gradient-ready hook during backward)");
        }
        let mut state = self.lock();
        state.armed = false;
        let not_ready = state.progress.not_ready();
        not_ready.iter().for_each(|&i| state.mark(i));
        let mut result = state.error.take().map_or(Ok(()), Err);
        while !state.in_flight.is_empty() {
            // Every one is waited for, even after an error: the peers wait for it.
            result = result.and(state.finish_oldest());
        }
        let (launched, count) = (state.launched, state.layout.len());
        if result.is_ok() && launched < count {
            let detail = format!(
                "only {launched} of {count} buckets left during backward, though every parameter was \
                 marked ready: the wrapper's bookkeeping is wrong, not your model; please report it"
            );
            result = Err(DistError::Invalid { rank: state.pg.rank(), op: "ZeRO-2 backward".into(), detail });
        }
        state.launched = 0;
        let Backward { progress, layout, .. } = &mut *state;
        progress.reset(layout);
        result?;
        let n = state.params.len();
        let used = std::mem::replace(&mut state.used, vec![false; n]);
        let checked = state.end_of_backward_check(&used, backward.is_err(), self.find_unused);
        backward?;
        checked
    }

    /// Opens a scope in which `backward` only accumulates this rank's full
    /// gradients (what FSDP must keep between micro-batches) and sends
    /// nothing. Bind it: `let _no_sync = model.no_sync();`.
    pub fn no_sync(&self) -> NoSyncGuard<'_> {
        self.switch.no_sync()
    }

    /// PyTorch's `find_unused_parameters=True`: a parameter that some rank
    /// does not use in a step sends zeros; one that no rank used is not
    /// stepped (no weight decay, no moment update, its step count stays),
    /// as PyTorch's AdamW leaves a parameter whose gradient is `None`.
    pub fn find_unused_parameters(mut self, on: bool) -> Self {
        self.find_unused = on;
        self
    }

    // ANCHOR: step
    /// AdamW on this rank's shard of every bucket, from the averaged
    /// gradient shard the last synced backward left, then an all-gather of
    /// every rank's updated shard into every rank's parameters. The shards
    /// are dropped afterwards. A collective: every rank calls it.
    pub fn step(&mut self) -> Result<(), DistError> {
        let shared = self.state.clone();
        let mut state = shared.lock().unwrap_or_else(|p| p.into_inner());
        let pg = state.pg.clone();
        let rank = pg.rank();
        if let Some(b) = state.grad_shards.iter().position(Option::is_none) {
            let detail = format!(
                "bucket {b} has no gradient shard: run the step's last backward outside no_sync \
                 (it reduce-scatters the gradients) before step()"
            );
            return Err(DistError::Invalid { rank, op: "ShardGradOp::step".into(), detail });
        }
        let stepped = std::mem::replace(&mut state.used_anywhere, vec![false; self.param_steps.len()]);
        self.step += 1;
        let ledger = state.ledger.clone();
        for (b, bucket) in self.buckets.iter_mut().enumerate() {
            let grad = state.grad_shards[b].take().expect("checked above");
            let counts: Vec<Option<i64>> =
                bucket.members.iter().map(|&i| stepped[i].then(|| self.param_steps[i] + 1)).collect();
            let numels: Vec<i64> = bucket.members.iter().map(|&i| state.params[i].1.numel() as i64).collect();
            let settings = AdamWUpdate {
                lr: self.settings.lr,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                weight_decay: self.settings.weight_decay,
                step: 0,
            };
            step_shard(pg.as_ref(), bucket, &grad, &numels, &counts, &settings)?;
            ledger.free(
                Holding::Gradients,
                tensor_bytes(&grad),
                &format!("bucket {b}'s gradient shard, stepped"),
            );
            drop(grad);
            let Shard { offset, len, .. } = bucket.shard;
            let mine = bucket.param.narrow(0, offset as i64, len as i64);
            let gathered = tagged(format!("ZeRO-2 step {}, bucket {b}", self.step), || pg.all_gather(&mine))?;
            let bytes = gathered.iter().map(tensor_bytes).sum();
            ledger.alloc(Holding::Parameters, bytes, &format!("bucket {b}'s gathered shards"));
            tch::no_grad(|| bucket.param.f_copy_(&Tensor::cat(&gathered, 0)))
                .map_err(torch_error(pg.as_ref(), "copying the gathered shards into the bucket"))?;
            drop(gathered);
            ledger.free(Holding::Parameters, bytes, &format!("bucket {b}'s gathered shards, copied in"));
        }
        for (count, &stepped) in self.param_steps.iter_mut().zip(&stepped) {
            *count += stepped as i64;
        }
        Ok(())
    }
    // ANCHOR_END: step

    /// Drops every gradient this rank holds: full gradients kept under
    /// `no_sync` and shards not stepped.
    pub fn zero_grad(&mut self) -> Result<(), DistError> {
        let shared = self.state.clone();
        let mut state = shared.lock().unwrap_or_else(|p| p.into_inner());
        state.drop_full_gradients(None)?;
        let ledger = state.ledger.clone();
        for (b, shard) in state.grad_shards.iter_mut().enumerate() {
            if let Some(shard) = shard.take() {
                ledger.free(
                    Holding::Gradients,
                    tensor_bytes(&shard),
                    &format!("bucket {b}'s gradient shard, zeroed"),
                );
            }
        }
        Ok(())
    }

    /// The account of the bytes this rank holds: parameters, gradients and
    /// moments, every allocation and free as it happened.
    pub fn ledger(&self) -> MemoryLedger {
        self.lock().ledger.clone()
    }

    /// The bucket layout, in the order the buckets leave.
    pub fn layout(&self) -> Vec<Bucket> {
        self.lock().layout.clone()
    }

    /// This rank's shard of each bucket.
    pub fn shards(&self) -> Vec<Shard> {
        self.buckets.iter().map(|b| b.shard).collect()
    }

    /// How many steps have been taken.
    pub fn steps_taken(&self) -> i64 {
        self.step
    }

    /// Per bucket, how many elements it holds before padding.
    pub fn bucket_numels(&self) -> Vec<usize> {
        self.buckets.iter().map(|b| b.numel).collect()
    }

    /// The learning rate of the next step.
    pub fn lr(&self) -> f64 {
        self.settings.lr
    }

    /// Sets the learning rate of the next step (a schedule's warm-up, decay).
    pub fn set_lr(&mut self, lr: f64) {
        self.settings.lr = lr;
    }

    /// The whole AdamW state, on every rank, by `AdamW::state`'s names
    /// (`step`; `exp_avg.<name>`, `exp_avg_sq.<name>` in the parameter's
    /// shape, `step.<name>`), as `ShardedAdamW::gathered_state` returns it,
    /// so that a checkpoint of either resumes the other. A collective.
    pub fn gathered_state(&self) -> Result<Vec<Named>, DistError> {
        let state = self.lock();
        let buckets = self.buckets.iter().map(moments);
        flat_state::gathered_state(state.pg.as_ref(), self.step, &state.params, &self.param_steps, buckets)
    }

    /// Restores a state [`gathered_state`](Self::gathered_state) (or
    /// `AdamW::state`) returned, on any world size: each rank keeps its
    /// shard of it. Fails naming the entry that is missing or misshapen.
    pub fn load_state(&mut self, saved: &[Named]) -> Result<(), DistError> {
        let shared = self.state.clone();
        let state = shared.lock().unwrap_or_else(|p| p.into_inner());
        let (rank, buckets) = (state.pg.rank(), self.buckets.iter().map(moments));
        let op = "ShardGradOp::load_state";
        (self.step, self.param_steps) = flat_state::load_state(op, rank, saved, &state.params, buckets)?;
        Ok(())
    }

    /// Per bucket, this rank's averaged gradient shard (`[len]`, in the
    /// bucket's coordinates from its shard's offset), as the step's synced
    /// backward left it; None before that and after `step` or `zero_grad`.
    /// What FSDP2's sharded `.grad` holds: gather it to see full gradients.
    pub fn gradient_shards(&self) -> Vec<Option<Tensor>> {
        self.lock().grad_shards.iter().map(|s| s.as_ref().map(Tensor::shallow_clone)).collect()
    }

    /// The parameters no rank gave a gradient in any synced backward since
    /// the last step (with `find_unused_parameters`): their shard holds
    /// zeros, and `step` leaves them alone, as PyTorch's AdamW leaves a
    /// parameter whose `.grad` is None.
    pub fn without_gradient(&self) -> Vec<String> {
        let state = self.lock();
        state
            .params
            .iter()
            .zip(&state.used_anywhere)
            .filter(|(_, &u)| !u)
            .map(|((n, _), _)| n.clone())
            .collect()
    }
}

/// The replicated model's accessors: `forward`, `parameters`, `rank`, ...
impl<M: Module> Deref for ShardGradOp<M> {
    type Target = Replicated<M>;

    fn deref(&self) -> &Replicated<M> {
        &self.replicated
    }
}

impl Backward {
    /// A hook said parameter `i`'s gradient is final.
    fn gradient_ready(&mut self, i: usize) {
        self.used[i] = true; // under no_sync too: the sync after it counts it
        if !self.holds_grad[i] {
            // Autograd has just made this gradient (it had none).
            self.holds_grad[i] = true;
            let (name, param) = &self.params[i];
            self.ledger.alloc(Holding::Gradients, tensor_bytes(param), &format!("full gradient of `{name}`"));
        }
        if self.armed {
            self.mark(i);
        }
    }

    /// Marks `i` ready and launches the buckets that may leave now.
    fn mark(&mut self, i: usize) {
        if self.error.is_some() {
            return;
        }
        for b in mark_ready(&mut self.progress, i) {
            if let Err(error) = self.launch(b) {
                self.error = Some(error);
                return;
            }
        }
    }

    /// Launches bucket `b`'s reduce-scatter, after waiting for the oldest
    /// one in flight if [`BUCKETS_IN_FLIGHT`] are.
    fn launch(&mut self, b: usize) -> Result<(), DistError> {
        while self.in_flight.len() >= BUCKETS_IN_FLIGHT {
            self.finish_oldest()?;
        }
        let (pg, shard) = (self.pg.clone(), self.shards[b]);
        let members: Vec<Named> = self.layout[b]
            .params
            .iter()
            .map(|&i| (self.params[i].0.clone(), self.params[i].1.shallow_clone()))
            .collect();
        let launch = self.steps.reduce_scatter_bucket;
        let in_flight = tagged(format!("{}, bucket {b}", self.tag), || launch(pg.as_ref(), &members, shard))?;
        self.launched += 1;
        let flat_bytes = tensor_bytes(&in_flight.flat);
        self.ledger.alloc(
            Holding::Gradients,
            flat_bytes,
            &format!("bucket {b}'s flat gradient, reduce-scattering"),
        );
        self.drop_full_gradients(Some(b))?;
        let problem = if in_flight.flat.numel() != shard.padded_numel {
            Some(format!(
                "its buffer has {} elements, the padded bucket {}",
                in_flight.flat.numel(),
                shard.padded_numel
            ))
        } else if in_flight.chunk.numel() != shard.len {
            Some(format!(
                "its output has {} elements, this rank's shard {}",
                in_flight.chunk.numel(),
                shard.len
            ))
        } else {
            None
        };
        if let Some(problem) = problem {
            let detail = format!("reduce_scatter_bucket for bucket {b}: {problem}");
            self.in_flight.push_back((b, in_flight)); // still waited for: the peers' calls pair with it
            return Err(DistError::Invalid { rank: pg.rank(), op: "ZeRO-2 backward".into(), detail });
        }
        let shard_bytes = tensor_bytes(&in_flight.chunk);
        self.ledger.alloc(Holding::Gradients, shard_bytes, &format!("bucket {b}'s gradient shard, arriving"));
        self.in_flight.push_back((b, in_flight));
        Ok(())
    }

    /// Records the full gradients of bucket `b` (or of every bucket) gone;
    /// fails naming one the launch kept alive. With `None`, drops them too.
    fn drop_full_gradients(&mut self, bucket: Option<usize>) -> Result<(), DistError> {
        let members: Vec<usize> = match bucket {
            Some(b) => self.layout[b].params.clone(),
            None => (0..self.params.len()).collect(),
        };
        for i in members {
            let (name, param) = &self.params[i];
            if bucket.is_none() {
                clear_grad(param).map_err(|e| DistError::Invalid {
                    rank: self.pg.rank(),
                    op: format!("dropping the gradient of `{name}`"),
                    detail: e.to_string(),
                })?;
            } else if param.grad().defined() {
                let detail = format!(
                    "`{name}` still has its full gradient after its bucket left: once the buffer \
                     holds its values, let it go (clear_grad), or ZeRO-2 keeps the full gradients DDP keeps"
                );
                return Err(DistError::Invalid {
                    rank: self.pg.rank(),
                    op: "ZeRO-2 backward".into(),
                    detail,
                });
            }
            if std::mem::replace(&mut self.holds_grad[i], false) {
                self.ledger.free(
                    Holding::Gradients,
                    tensor_bytes(param),
                    &format!("full gradient of `{name}` goes"),
                );
            }
        }
        Ok(())
    }

    /// Waits for the oldest bucket in flight; keeps its averaged shard
    /// (adding to one an earlier sync of this step left).
    fn finish_oldest(&mut self) -> Result<(), DistError> {
        let Some((b, in_flight)) = self.in_flight.pop_front() else { return Ok(()) };
        let (flat_bytes, out_bytes) = (tensor_bytes(&in_flight.flat), tensor_bytes(&in_flight.chunk));
        let pg = self.pg.clone();
        let finished = (self.steps.keep_shard)(pg.as_ref(), in_flight);
        self.ledger.free(Holding::Gradients, flat_bytes, &format!("bucket {b}'s flat gradient goes"));
        let shard = match finished {
            Ok(shard) => shard,
            Err(error) => {
                self.ledger.free(Holding::Gradients, out_bytes, &format!("bucket {b}'s failed shard"));
                return Err(error);
            }
        };
        let len = self.shards[b].len;
        if shard.numel() != len || shard.kind() != self.layout[b].kind {
            self.ledger.free(Holding::Gradients, out_bytes, &format!("bucket {b}'s wrong shard"));
            let detail = format!(
                "keep_shard for bucket {b} returned {:?}{:?}; this rank keeps its shard: {len} elements of {:?}",
                shard.kind(),
                shard.size(),
                self.layout[b].kind
            );
            return Err(DistError::Invalid { rank: pg.rank(), op: "ZeRO-2 backward".into(), detail });
        }
        match &mut self.grad_shards[b] {
            slot @ None => *slot = Some(shard),
            Some(kept) => {
                let _ = tch::no_grad(|| kept.f_add_(&shard))
                    .map_err(torch_error(pg.as_ref(), "adding a gradient shard"))?;
                self.ledger.free(Holding::Gradients, out_bytes, &format!("bucket {b}'s shard, added in"));
            }
        }
        Ok(())
    }

    /// DDP's end-of-backward check: one MAX all-reduce of `[unused here (n)
    /// | used here (n) | backward failed, per rank]`, so that every rank
    /// reaches the same verdict.
    fn end_of_backward_check(
        &mut self,
        used: &[bool],
        failed: bool,
        find_unused: bool,
    ) -> Result<(), DistError> {
        let pg = self.pg.clone();
        let (n, world) = (self.params.len() as i64, pg.world_size() as i64);
        let mut flags = vec![0i32; (2 * n + world) as usize];
        for i in 0..n as usize {
            flags[i] = (!used[i]) as i32;
            flags[n as usize + i] = used[i] as i32;
        }
        if failed {
            flags[(2 * n) as usize + pg.rank()] = 1;
        }
        let device = self.params.first().map_or(tch::Device::Cpu, |(_, p)| p.device());
        let mut flags_t = Tensor::from_slice(&flags).to_device(device);
        let tag = format!("{}, end-of-backward check", self.tag);
        tagged(tag, || pg.all_reduce(&mut flags_t, ReduceOp::Max))?;
        let flags: Vec<i32> = Vec::try_from(flags_t.to_kind(Kind::Int).to_device(tch::Device::Cpu))
            .map_err(torch_error(pg.as_ref(), "reading the end-of-backward flags"))?;
        if let Some(peer) = flags[(2 * n) as usize..].iter().position(|&f| f != 0) {
            return Err(DistError::PeerGone {
                rank: pg.rank(),
                op: "the ZeRO-2 gradient sync at the end of backward".into(),
                peer,
                reason: "returned an error from loss.backward() in this step; every rank fails it".into(),
            });
        }
        let unused: Vec<&str> =
            (0..n as usize).filter(|&i| flags[i] != 0).map(|i| self.params[i].0.as_str()).collect();
        if !unused.is_empty() && !find_unused {
            let detail = format!(
                "parameter(s) {unused:?} got no gradient in this step on at least one rank: a model \
                 that skips parameters must say so (find_unused_parameters(true)), or use every \
                 parameter in the loss"
            );
            return Err(DistError::Invalid { rank: pg.rank(), op: "ZeRO-2 backward".into(), detail });
        }
        for i in 0..n as usize {
            self.used_anywhere[i] |= flags[n as usize + i] != 0;
        }
        Ok(())
    }
}

/// AdamW on this rank's shard of `bucket` from its averaged gradient shard
/// `grad`: the whole shard at once when every member takes the same step,
/// else member by member on its own count (`None`: not stepped), as
/// ZeRO-1's optimizer does. Elementwise, so both give the same bits.
fn step_shard(
    pg: &dyn ProcessGroup,
    bucket: &mut GradOpBucket,
    grad: &Tensor,
    numels: &[i64],
    counts: &[Option<i64>],
    settings: &AdamWUpdate,
) -> Result<(), DistError> {
    let (offset, len) = (bucket.shard.offset as i64, bucket.shard.len as i64);
    let error = |e| torch_error(pg, "AdamW on this rank's gradient shard")(e);
    if let Some(step) = counts[0].filter(|&c| counts.iter().all(|&d| d == Some(c))) {
        let mut param = bucket.param.narrow(0, offset, len);
        let update = AdamWUpdate { step, ..*settings };
        return update.apply(&mut param, grad, &mut bucket.exp_avg, &mut bucket.exp_avg_sq).map_err(error);
    }
    let mut start = 0;
    for (&numel, &count) in numels.iter().zip(counts) {
        // The member's elements that fall in this rank's shard, in bucket coordinates.
        let (from, to) = (start.max(offset), (start + numel).min(offset + len));
        start += numel;
        let Some(step) = count.filter(|_| from < to) else { continue };
        let (at, n) = (from - offset, to - from);
        AdamWUpdate { step, ..*settings }
            .apply(
                &mut bucket.param.narrow(0, from, n),
                &grad.narrow(0, at, n),
                &mut bucket.exp_avg.narrow(0, at, n),
                &mut bucket.exp_avg_sq.narrow(0, at, n),
            )
            .map_err(error)?;
    }
    Ok(())
}

/// What [`flat_state`] reads and writes of a bucket.
fn moments(bucket: &GradOpBucket) -> Moments<'_> {
    let GradOpBucket { members, numel, shard, exp_avg, exp_avg_sq, .. } = bucket;
    Moments { members, numel: *numel, shard: *shard, exp_avg, exp_avg_sq }
}
