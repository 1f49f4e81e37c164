//! ZeRO stage 1 in the finished library: [`ShardedAdamW`], AdamW sharded
//! over the ranks (PyTorch's `ZeroRedundancyOptimizer`). Plain DDP keeps the
//! whole AdamW state on every rank, N identical copies; here each rank owns
//! one shard of every bucket's flat parameters and steps AdamW on that shard
//! only, so it keeps 1/N of the moments. This file lays the buckets out,
//! runs the step and gathers the state for a checkpoint; the two functions
//! chapter 11 asks the learner for, [`shard_of`] and [`step_bucket`], are in
//! `shards.rs` (the spoilers live there), and the optimizer runs them, or
//! the learner's through `ddp::seams`.
//!
//! With the wrapper, keep every backward of a step inside `no_sync`: the
//! gradients are reduce-scattered by [`ShardedAdamW::step`], not all-reduced
//! by the wrapper (the training run's `--zero 1` does).
//!
//! No rank holds the whole AdamW state, so saving it is a collective
//! ([`ShardedAdamW::gathered_state`]): every rank all-gathers every bucket's
//! moments and cuts them back into per-parameter tensors, named as the
//! training run's `AdamW::state` names them. Loading cuts each rank's shard
//! out of such a state, whatever world size saved it, so a run can resume
//! on another number of ranks (or with plain AdamW).
//!
//! ZeRO stage 2 ([`ShardGradOp`], `grad_op.rs`) shards the gradients too:
//! each bucket is reduce-scattered during backward and only this rank's
//! shard is kept; the two per-bucket decisions chapter 13 asks for are in
//! `grad_shards.rs`.

mod grad_op;
mod grad_shards;
mod shards;

use tch::{TchError, Tensor};

pub use grad_op::{GradOpSteps, KeepShard, ReduceScatterBucket, ShardGradOp, BUCKETS_IN_FLIGHT};
pub use grad_shards::{keep_shard, reduce_scatter_bucket, InFlight};
use shards::step_bucket_per_parameter;
pub use shards::{shard_of, step_bucket, Shard, ShardedBucket};

use crate::ddp::adamw_update::{param_steps, AdamWUpdate};
use crate::ddp::reducer::{plan_buckets, BucketCaps, ParamMeta};
use crate::ddp::wrapper::{StepOptimizer, UnusedParameters};
use crate::dist::{torch_error, DistError, Group, ProcessGroup, ReduceOp};
use crate::models::Named;

/// The two functions a [`ShardedAdamW`] runs: the library's ([`shard_of`],
/// [`step_bucket`]) unless chapter 11 plugs in the learner's (`ddp::seams`).
#[derive(Clone, Copy)]
pub struct ZeroSteps {
    pub shard_of: fn(usize, usize, usize) -> Shard,
    pub step_bucket: fn(&dyn ProcessGroup, &mut ShardedBucket, &AdamWUpdate) -> Result<(), DistError>,
}

// ANCHOR: optimizer
/// AdamW sharded over the ranks of a process group (ZeRO stage 1; PyTorch's
/// `ZeroRedundancyOptimizer`, with a reduce-scatter where it all-reduces).
/// Every rank holds all the parameters and computes all the gradients; each
/// keeps and updates the moments of its own shard of every bucket.
pub struct ShardedAdamW {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    /// Decoupled weight decay, as in the training run's `AdamW`.
    pub weight_decay: f64,
    pg: Group,
    /// Shallow handles on the parameters (they share storage and `.grad()`).
    params: Vec<Named>,
    buckets: Vec<ShardedBucket>,
    step: i64,
    /// Per parameter, the steps that updated it (PyTorch's `state["step"]`,
    /// which its bias correction reads): behind `step` for a parameter that
    /// got no gradient in some steps.
    param_steps: Vec<i64>,
    /// What the DDP wrapper said about the next step's unused parameters.
    unused: Option<UnusedParameters>,
    /// Whose `shard_of` and `step_bucket` run: the library's, or chapter 11's.
    steps: ZeroSteps,
}

// ANCHOR_END: optimizer

impl ShardedAdamW {
    // ANCHOR: new
    /// Lays `params` out in buckets planned with `caps` (the library's
    /// `plan_buckets`, the same on every rank), each padded to a length that
    /// splits into one equal shard per rank; the parameters become views
    /// into the buckets, their values unchanged. Every rank calls it with
    /// the same parameters and caps. PyTorch's betas and eps; moments start at zero.
    pub fn new(
        params: &[Named],
        pg: Group,
        caps: BucketCaps,
        lr: f64,
        weight_decay: f64,
    ) -> Result<Self, DistError> {
        let steps = ZeroSteps { shard_of, step_bucket };
        Self::built_with(params, pg, caps, lr, weight_decay, steps)
    }
    // ANCHOR_END: new

    /// [`new`](Self::new), running `steps` (chapter 11's door, `ddp::seams`).
    pub(crate) fn built_with(
        params: &[Named],
        pg: Group,
        caps: BucketCaps,
        lr: f64,
        weight_decay: f64,
        steps: ZeroSteps,
    ) -> Result<Self, DistError> {
        let mut params: Vec<Named> = params.iter().map(|(n, p)| (n.clone(), p.shallow_clone())).collect();
        let layout = plan_buckets(&ParamMeta::of(&params), caps.cap_bytes, caps.first_cap_bytes);
        let (rank, world_size) = (pg.rank(), pg.world_size());
        let mut buckets = vec![];
        for bucket in layout {
            let shard = (steps.shard_of)(bucket.numel, world_size, rank);
            check_shard(pg.as_ref(), bucket.numel, shard)?;
            buckets.push(lay_out(pg.as_ref(), &mut params, bucket.params, bucket.numel, shard)?);
        }
        let (beta1, beta2, eps) = (0.9, 0.999, 1e-8);
        let param_steps = vec![0; params.len()];
        Ok(ShardedAdamW {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
            pg,
            params,
            buckets,
            step: 0,
            param_steps,
            unused: None,
            steps,
        })
    }

    // ANCHOR: step
    /// One step on every rank: each bucket's gradients go into its padded
    /// buffer, then `step_bucket` reduce-scatters them, steps this rank's
    /// shard and all-gathers the parameters. Every parameter must have a
    /// gradient, unless the DDP wrapper (with `find_unused_parameters`) said
    /// which got none: those no rank gave one are not stepped, as in
    /// PyTorch's `ZeroRedundancyOptimizer`.
    pub fn step(&mut self) -> Result<(), DistError> {
        let told = self.unused.is_some();
        let stepped = self.stepped_this_step()?;
        let pg = self.pg.as_ref();
        for bucket in &mut self.buckets {
            let mut offset = 0;
            for &i in &bucket.members {
                let (name, param) = &self.params[i];
                let (grad, numel) = (param.grad(), param.numel() as i64);
                let mut slot = bucket.grad.narrow(0, offset, numel);
                offset += numel;
                if !grad.defined() && told {
                    // No gradient here: zeros in the sum (another rank may have one).
                    let _ = tch::no_grad(|| slot.f_zero_())
                        .map_err(torch_error(pg, "zeroing a missing gradient"))?;
                    continue;
                }
                if !grad.defined() {
                    let detail = format!(
                        "parameter `{name}` has no gradient; every parameter must take part in the \
                         loss (call backward first), or leave it out of the optimizer, or step through \
                         a DDP wrapper with find_unused_parameters"
                    );
                    return Err(DistError::Invalid {
                        rank: pg.rank(),
                        op: "ShardedAdamW::step".into(),
                        detail,
                    });
                }
                tch::no_grad(|| slot.f_copy_(&grad.reshape([-1])))
                    .map_err(torch_error(pg, format!("copying the gradient of `{name}` into its bucket")))?;
            }
        }
        self.step += 1;
        let settings = self.update(0);
        for bucket in &mut self.buckets {
            let counts: Vec<Option<i64>> =
                bucket.members.iter().map(|&i| stepped[i].then(|| self.param_steps[i] + 1)).collect();
            match counts[0] {
                Some(count) if counts.iter().all(|&c| c == Some(count)) => {
                    (self.steps.step_bucket)(pg, bucket, &AdamWUpdate { step: count, ..settings })?;
                }
                _ => {
                    // A member without a gradient, or with fewer steps than
                    // the others: PyTorch steps each parameter on its own count.
                    let numels: Vec<i64> =
                        bucket.members.iter().map(|&i| self.params[i].1.numel() as i64).collect();
                    step_bucket_per_parameter(pg, bucket, &numels, &counts, &settings)?;
                }
            }
        }
        for (count, &stepped) in self.param_steps.iter_mut().zip(&stepped) {
            *count += stepped as i64;
        }
        Ok(())
    }
    // ANCHOR_END: step

    /// Per parameter, whether the step updates it: every one, unless the
    /// wrapper named unused ones. Named on this rank only (no sync ran),
    /// the ranks agree first (a MAX all-reduce of "used here").
    fn stepped_this_step(&mut self) -> Result<Vec<bool>, DistError> {
        let pg = self.pg.as_ref();
        let not_named = |names: &[String]| -> Vec<bool> {
            self.params.iter().map(|(name, _)| !names.contains(name)).collect()
        };
        match self.unused.take() {
            None => Ok(vec![true; self.params.len()]),
            Some(UnusedParameters::OnEveryRank(names)) => Ok(not_named(&names)),
            Some(UnusedParameters::OnThisRank(names)) => {
                let used: Vec<i32> = not_named(&names).into_iter().map(i32::from).collect();
                let device = self.buckets.first().map_or(tch::Device::Cpu, |b| b.param.device());
                let mut flags = Tensor::from_slice(&used).to_device(device);
                pg.all_reduce(&mut flags, ReduceOp::Max)?;
                let flags = Vec::<i32>::try_from(flags.to_device(tch::Device::Cpu))
                    .map_err(torch_error(pg, "reading which parameters some rank used"))?;
                Ok(flags.into_iter().map(|f| f != 0).collect())
            }
        }
    }

    /// Forgets every gradient: the next backward starts from nothing.
    pub fn zero_grad(&mut self) {
        for (_, param) in &mut self.params {
            param.zero_grad();
        }
    }

    /// The settings, for a parameter's `step`-th update, as [`AdamWUpdate`] takes them.
    fn update(&self, step: i64) -> AdamWUpdate {
        let (lr, beta1, beta2, eps, weight_decay) =
            (self.lr, self.beta1, self.beta2, self.eps, self.weight_decay);
        AdamWUpdate { lr, beta1, beta2, eps, weight_decay, step }
    }

    /// The buckets, in the order they are stepped.
    pub fn buckets(&self) -> &[ShardedBucket] {
        &self.buckets
    }

    /// Bytes of optimizer state (both moments) this rank holds, measured on
    /// its tensors.
    pub fn moment_bytes(&self) -> usize {
        let bytes = |t: &Tensor| t.numel() * t.kind().elt_size_in_bytes();
        self.buckets.iter().map(|b| bytes(&b.exp_avg) + bytes(&b.exp_avg_sq)).sum()
    }

    /// How many steps this optimizer has taken.
    pub fn steps_taken(&self) -> i64 {
        self.step
    }

    // ANCHOR: gather
    /// The whole optimizer state, on every rank: `step`, and `exp_avg.<name>`,
    /// `exp_avg_sq.<name>` (in the parameter's shape) and `step.<name>` for
    /// every parameter (what `AdamW::state` returns). A collective: every
    /// rank must call it.
    pub fn gathered_state(&self) -> Result<Vec<Named>, DistError> {
        let pg = self.pg.as_ref();
        let mut state = vec![("step".to_string(), Tensor::from_slice(&[self.step]))];
        for ((name, _), count) in self.params.iter().zip(&self.param_steps) {
            state.push((format!("step.{name}"), Tensor::from_slice(&[*count])));
        }
        for bucket in &self.buckets {
            for (prefix, shard) in [("exp_avg", &bucket.exp_avg), ("exp_avg_sq", &bucket.exp_avg_sq)] {
                let shards = pg.all_gather(shard)?; // world_size x [len], in rank order
                let whole =
                    Tensor::f_cat(&shards, 0).map_err(torch_error(pg, "joining the gathered moments"))?;
                let mut offset = 0;
                for &i in &bucket.members {
                    let (name, param) = &self.params[i];
                    let numel = param.numel() as i64;
                    state.push((
                        format!("{prefix}.{name}"),
                        whole.narrow(0, offset, numel).reshape(param.size()),
                    ));
                    offset += numel;
                }
            }
        }
        Ok(state)
    }
    // ANCHOR_END: gather

    /// Restores a state that [`gathered_state`](Self::gathered_state) or
    /// `AdamW::state` returned, on any world size: each rank keeps its own
    /// shard of it. Fails, naming the entry, if one is missing or has the
    /// wrong shape or dtype. Needs no communication.
    pub fn load_state(&mut self, state: &[Named]) -> Result<(), DistError> {
        let rank = self.pg.rank();
        let invalid =
            |detail: String| DistError::Invalid { rank, op: "ShardedAdamW::load_state".into(), detail };
        let find = |key: &str| {
            let entry = state.iter().find(|(name, _)| name == key).map(|(_, t)| t);
            entry.ok_or_else(|| invalid(format!("no optimizer entry `{key}`")))
        };
        let step =
            Vec::<i64>::try_from(find("step")?).ok().and_then(|s| s.first().copied()).filter(|&s| s >= 0);
        let step = step.ok_or_else(|| invalid("the optimizer entry `step` is not a step count".into()))?;
        for bucket in &mut self.buckets {
            let (offset, len) = (bucket.shard.offset as i64, bucket.shard.len as i64);
            for prefix in ["exp_avg", "exp_avg_sq"] {
                let mut flats = vec![];
                for &i in &bucket.members {
                    let (name, param) = &self.params[i];
                    let (key, saved) = (format!("{prefix}.{name}"), find(&format!("{prefix}.{name}"))?);
                    if saved.size() != param.size() || saved.kind() != param.kind() {
                        let (kind, size) = (param.kind(), param.size());
                        let found = format!("{:?} {:?}", saved.kind(), saved.size());
                        return Err(invalid(format!(
                            "optimizer entry `{key}` is {found}, the model needs {kind:?} {size:?}"
                        )));
                    }
                    flats.push(saved.reshape([-1]));
                }
                let padding = bucket.shard.padded_numel - bucket.numel;
                flats.push(Tensor::zeros([padding as i64], (bucket.param.kind(), bucket.param.device())));
                let whole = Tensor::cat(&flats, 0); // [padded_numel]
                let mine = if prefix == "exp_avg" { &mut bucket.exp_avg } else { &mut bucket.exp_avg_sq };
                mine.copy_(&whole.narrow(0, offset, len));
            }
        }
        let names: Vec<String> = self.params.iter().map(|(name, _)| name.clone()).collect();
        self.param_steps = param_steps(state, &names, step).map_err(invalid)?;
        self.step = step;
        Ok(())
    }
}

/// How `ddp::train_step` drives it. Its step is a collective: with the
/// wrapper, run every backward of the step inside `no_sync` (the step
/// averages the gradients itself), and call it on every rank.
impl StepOptimizer for ShardedAdamW {
    fn zero_grad(&mut self) {
        ShardedAdamW::zero_grad(self);
    }

    fn step(&mut self) -> Result<(), TchError> {
        ShardedAdamW::step(self).map_err(|error| TchError::Torch(error.to_string()))
    }

    fn skip_unused(&mut self, unused: &UnusedParameters) {
        self.unused = Some(unused.clone());
    }
}

/// Fails, saying what is wrong, unless `shard` splits a buffer of `numel`
/// elements into equal parts, one per rank, that cover it, and this rank's
/// part is the one `reduce_scatter` leaves on it: `offset == rank * len`.
/// Any other offset would pass every local test yet make the all-gather,
/// which puts the shards back in rank order, duplicate or permute
/// parameters (every rank at offset 0, or the ranks in reverse).
fn check_shard(pg: &dyn ProcessGroup, numel: usize, shard: Shard) -> Result<(), DistError> {
    let (rank, world_size) = (pg.rank(), pg.world_size());
    let Shard { padded_numel, offset, len } = shard;
    let problem = if padded_numel < numel {
        Some(format!("its padded length {padded_numel} is shorter than the {numel} elements it holds"))
    } else if len * world_size != padded_numel {
        Some(format!("{world_size} shards of {len} elements do not make its padded length {padded_numel}"))
    } else if offset != rank * len {
        Some(format!(
            "rank {rank}'s shard starts at offset {offset}, but the rule is offset == rank * len \
             (= {rank} * {len} = {}): reduce_scatter leaves the rank-th of the {world_size} equal \
             chunks on rank {rank}, and all_gather puts each rank's shard back there; make \
             shard_of return offset rank * len",
            rank * len
        ))
    } else {
        None
    };
    match problem {
        None => Ok(()),
        Some(problem) => {
            let detail = format!("shard_of({numel}, {world_size}, {rank}) returned {shard:?}: {problem}");
            Err(DistError::Invalid { rank, op: "ShardedAdamW::new".into(), detail })
        }
    }
}

/// One padded flat buffer for `members`' values, which become views into
/// it (as `AdamW` lays its groups out), zeroed gradients and moments.
fn lay_out(
    pg: &dyn ProcessGroup,
    params: &mut [Named],
    members: Vec<usize>,
    numel: usize,
    shard: Shard,
) -> Result<ShardedBucket, DistError> {
    let (kind, device) = (params[members[0]].1.kind(), params[members[0]].1.device());
    let padding = Tensor::zeros([(shard.padded_numel - numel) as i64], (kind, device));
    let mut flats: Vec<Tensor> = members.iter().map(|&i| params[i].1.detach().reshape([-1])).collect();
    flats.push(padding);
    let param = Tensor::f_cat(&flats, 0).map_err(torch_error(pg, "laying out a bucket"))?; // [padded_numel]
    let mut offset = 0;
    for &i in &members {
        let (n, shape) = (params[i].1.numel() as i64, params[i].1.size());
        params[i].1.set_data(&param.narrow(0, offset, n).view(shape.as_slice()));
        offset += n;
    }
    let zeros = |n: usize| Tensor::zeros([n as i64], (kind, device));
    let (grad, exp_avg, exp_avg_sq) = (zeros(shard.padded_numel), zeros(shard.len), zeros(shard.len));
    Ok(ShardedBucket { members, numel, shard, param, grad, exp_avg, exp_avg_sq })
}
