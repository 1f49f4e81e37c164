//! ZeRO stage 1 in the finished library: [`ShardedAdamW`], AdamW sharded
//! over the ranks (PyTorch's `ZeroRedundancyOptimizer`). Plain DDP keeps the
//! whole AdamW state on every rank, N identical copies; here each rank owns
//! one shard of every bucket's flat parameters and steps AdamW on that shard
//! only, so it keeps 1/N of the moments. This file builds the buckets and
//! runs the step; laying a bucket out and gathering or restoring the state
//! for a checkpoint, which ZeRO-2 does the same way, are in `flat_state.rs`.
//! The two functions chapter 11 asks the learner for, [`shard_of`] and
//! [`step_bucket`], are in `shards.rs` (the spoilers live there), and the
//! optimizer runs them, or the learner's through `ddp::seams`.
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

mod flat_state;
mod grad_op;
mod grad_shards;
mod shards;
#[cfg(test)]
mod tests;

use tch::{TchError, Tensor};

use flat_state::{check_shard, lay_out, Moments};
pub use grad_op::{GradOpSteps, KeepShard, ReduceScatterBucket, ShardGradOp, BUCKETS_IN_FLIGHT};
pub use grad_shards::{keep_shard, reduce_scatter_bucket, InFlight};
use shards::step_bucket_per_parameter;
pub use shards::{shard_of, step_bucket, Shard, ShardedBucket};

use crate::ddp::adamw_update::AdamWUpdate;
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
        let params: Vec<Named> = params.iter().map(|(n, p)| (n.clone(), p.shallow_clone())).collect();
        let layout = plan_buckets(&ParamMeta::of(&params), caps.cap_bytes, caps.first_cap_bytes);
        let (rank, world_size) = (pg.rank(), pg.world_size());
        let mut buckets = vec![];
        for bucket in layout {
            let shard = (steps.shard_of)(bucket.numel, world_size, rank);
            check_shard("ShardedAdamW::new", pg.as_ref(), bucket.numel, shard)?;
            let param = lay_out(pg.as_ref(), &params, &bucket.params, bucket.numel, shard)?;
            let zeros = |n: usize| Tensor::zeros([n as i64], (param.kind(), param.device()));
            let (grad, exp_avg, exp_avg_sq) = (zeros(shard.padded_numel), zeros(shard.len), zeros(shard.len));
            let (members, numel) = (bucket.params, bucket.numel);
            buckets.push(ShardedBucket { members, numel, shard, param, grad, exp_avg, exp_avg_sq });
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

    /// The whole optimizer state, on every rank: `step`, and `exp_avg.<name>`,
    /// `exp_avg_sq.<name>` (in the parameter's shape) and `step.<name>` for
    /// every parameter (what `AdamW::state` returns). A collective: every
    /// rank must call it.
    pub fn gathered_state(&self) -> Result<Vec<Named>, DistError> {
        let buckets = self.buckets.iter().map(moments);
        flat_state::gathered_state(self.pg.as_ref(), self.step, &self.params, &self.param_steps, buckets)
    }

    /// Restores a state that [`gathered_state`](Self::gathered_state) or
    /// `AdamW::state` returned, on any world size: each rank keeps its own
    /// shard of it. Fails, naming the entry, if one is missing or has the
    /// wrong shape or dtype. Needs no communication.
    pub fn load_state(&mut self, state: &[Named]) -> Result<(), DistError> {
        let (rank, buckets) = (self.pg.rank(), self.buckets.iter().map(moments));
        let op = "ShardedAdamW::load_state";
        (self.step, self.param_steps) = flat_state::load_state(op, rank, state, &self.params, buckets)?;
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

/// What [`flat_state`] reads and writes of a bucket.
fn moments(bucket: &ShardedBucket) -> Moments<'_> {
    let ShardedBucket { members, numel, shard, exp_avg, exp_avg_sq, .. } = bucket;
    Moments { members, numel: *numel, shard: *shard, exp_avg, exp_avg_sq }
}
