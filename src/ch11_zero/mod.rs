//! Chapter 11: sharding the optimizer (ZeRO stage 1). Plain DDP keeps the
//! whole AdamW state on every rank: two moments per parameter, N identical
//! copies. Here each rank owns one shard of every bucket's flat parameters
//! and steps AdamW on that shard only, so it keeps 1/N of the moments.
//!
//! Your code:           `cargo test --test chapter_11`
//! The reference code:  `cargo test --features solutions --test chapter_11`
//! See the measured numbers: add `-- --nocapture`
//!
//! You write two functions in `exercise.rs`:
//! 1. `shard_of`: which part of a flat buffer of `numel` elements a rank
//!    owns, padded so that every rank's part is as long as every other's;
//! 2. `step_bucket`: one ZeRO-1 step of one bucket: `reduce_scatter` of the
//!    gradients instead of DDP's `all_reduce`, AdamW on this rank's shard,
//!    `all_gather` of the updated shards back into every rank's parameters.
//!
//! This file holds the chapter's [`ShardedAdamW`], the optimizer that drives
//! them: it lays the parameters out in the library's buckets
//! (`ddp::plan_buckets`), checks the shard YOUR `shard_of` returns, copies
//! the gradients into the padded buffers before each step and runs YOUR
//! `step_bucket` on every bucket. The model is the library's [`Replicated`]
//! (replicas checked at construction); its backward is plain `loss.backward()`,
//! since the gradients are synced inside the step. The AdamW arithmetic is the
//! training run's ([`AdamWUpdate`], `src/train/optim.rs`). `checkpoint.rs`
//! gathers the shards into one state to save, and cuts them again on load.

use tch::Tensor;

use crate::ddp::{plan_buckets, Named, ParamMeta};
use crate::dist::{torch_error, DistError, Group, ProcessGroup};

pub use crate::ddp::{BucketCaps, Replicated};
pub use crate::train::{AdamW, AdamWUpdate};

mod checkpoint; // gathering the shards into one state, and cutting them again
pub mod exercise; // the file you edit
pub mod solution; // the reference solution

/// `learner::f` is your `exercise.rs`, or `solution.rs` with `--features solutions`.
#[cfg(not(feature = "solutions"))]
pub use exercise as learner;
#[cfg(feature = "solutions")]
pub use solution as learner;

// ANCHOR: shard
/// The part of a flat buffer one rank owns. The buffer is padded with zeros
/// to `padded_numel` elements so that it splits into `world_size` shards of
/// `len` elements each; this rank's is `offset .. offset + len`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    /// The buffer's length after padding: `len * world_size`.
    pub padded_numel: usize,
    /// Where this rank's shard starts in the padded buffer.
    pub offset: usize,
    /// Every rank's shard length.
    pub len: usize,
}

/// One bucket of parameters as a ZeRO-1 rank holds it.
pub struct ShardedBucket {
    /// Its parameters, as indices into the optimizer's list, in buffer order.
    pub members: Vec<usize>,
    /// The members' elements together, before padding.
    pub numel: usize,
    /// This rank's part of the padded buffers.
    pub shard: Shard,
    /// `[padded_numel]`: every member's values back to back, then zeros. The
    /// members ARE views into it: writing here changes the model.
    pub param: Tensor,
    /// `[padded_numel]`: this rank's own gradients, copied in before each
    /// step, then zeros.
    pub grad: Tensor,
    /// `[len]`: the first and second moments of this rank's shard only.
    pub exp_avg: Tensor,
    pub exp_avg_sq: Tensor,
}
// ANCHOR_END: shard

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
    /// Decoupled weight decay, as in [`AdamW`].
    pub weight_decay: f64,
    pg: Group,
    /// Shallow handles on the parameters (they share storage and `.grad()`).
    params: Vec<Named>,
    buckets: Vec<ShardedBucket>,
    step: i64,
    /// Whose `shard_of` and `step_bucket` run: yours, unless built `with_steps`.
    steps: ZeroSteps,
}

impl ShardedAdamW {
    /// Lays `params` out in buckets planned with `caps` (the library's
    /// `plan_buckets`, the same on every rank), each padded to the length
    /// YOUR `learner::shard_of` gives; the parameters become views into the
    /// buckets, their values unchanged. Every rank calls it with the same
    /// parameters and caps. PyTorch's betas and eps; moments start at zero.
    pub fn new(
        params: &[Named],
        pg: Group,
        caps: BucketCaps,
        lr: f64,
        weight_decay: f64,
    ) -> Result<Self, DistError> {
        Self::with_steps(params, pg, caps, lr, weight_decay, ZeroSteps::LEARNER)
    }
}
// ANCHOR_END: optimizer

impl ShardedAdamW {
    /// [`new`](Self::new), running `steps` instead of YOUR functions: the
    /// notebook shows the reference at work with `ZeroSteps::REFERENCE`.
    pub fn with_steps(
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
        Ok(ShardedAdamW { lr, beta1, beta2, eps, weight_decay, pg, params, buckets, step: 0, steps })
    }
}

// ANCHOR: step
impl ShardedAdamW {
    /// One step on every rank: each bucket's gradients go into its padded
    /// buffer, then YOUR `learner::step_bucket` (or the `ZeroSteps` it was
    /// built with) reduce-scatters them, steps
    /// this rank's shard and all-gathers the parameters. Every parameter
    /// must have a gradient (ZeRO-1 here has no "unused parameter" path).
    pub fn step(&mut self) -> Result<(), DistError> {
        let pg = self.pg.as_ref();
        for bucket in &mut self.buckets {
            let mut offset = 0;
            for &i in &bucket.members {
                let (name, param) = &self.params[i];
                let grad = param.grad();
                if !grad.defined() {
                    let detail = format!(
                        "parameter `{name}` has no gradient; every parameter must take part in the \
                         loss (call backward first), or leave it out of the optimizer"
                    );
                    return Err(DistError::Invalid {
                        rank: pg.rank(),
                        op: "ShardedAdamW::step".into(),
                        detail,
                    });
                }
                let numel = grad.numel() as i64;
                let mut slot = bucket.grad.narrow(0, offset, numel);
                tch::no_grad(|| slot.f_copy_(&grad.reshape([-1])))
                    .map_err(torch_error(pg, format!("copying the gradient of `{name}` into its bucket")))?;
                offset += numel;
            }
        }
        self.step += 1;
        let update = self.update();
        for bucket in &mut self.buckets {
            (self.steps.step_bucket)(pg, bucket, &update)?;
        }
        Ok(())
    }
}
// ANCHOR_END: step

/// The two functions a [`ShardedAdamW`] runs: YOURS ([`ZeroSteps::LEARNER`],
/// what `new` uses) or the reference ([`ZeroSteps::REFERENCE`]).
#[derive(Clone, Copy)]
pub struct ZeroSteps {
    pub shard_of: fn(usize, usize, usize) -> Shard,
    pub step_bucket: fn(&dyn ProcessGroup, &mut ShardedBucket, &AdamWUpdate) -> Result<(), DistError>,
}

impl ZeroSteps {
    /// `learner::shard_of` and `learner::step_bucket`: your code (or the
    /// reference, with `--features solutions`).
    pub const LEARNER: ZeroSteps =
        ZeroSteps { shard_of: learner::shard_of, step_bucket: learner::step_bucket };
    /// `solution::shard_of` and `solution::step_bucket`, whatever the features.
    pub const REFERENCE: ZeroSteps =
        ZeroSteps { shard_of: solution::shard_of, step_bucket: solution::step_bucket };
}

impl ShardedAdamW {
    /// Forgets every gradient: the next backward starts from nothing.
    pub fn zero_grad(&mut self) {
        for (_, param) in &mut self.params {
            param.zero_grad();
        }
    }

    /// The settings of the step just counted, as the library's AdamW takes them.
    fn update(&self) -> AdamWUpdate {
        let (lr, beta1, beta2, eps, weight_decay) =
            (self.lr, self.beta1, self.beta2, self.eps, self.weight_decay);
        AdamWUpdate { lr, beta1, beta2, eps, weight_decay, step: self.step }
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
}

/// Fails, saying what is wrong, unless `shard` splits a buffer of `numel`
/// elements into equal parts, one per rank, that cover it.
fn check_shard(pg: &dyn ProcessGroup, numel: usize, shard: Shard) -> Result<(), DistError> {
    let (rank, world_size) = (pg.rank(), pg.world_size());
    let Shard { padded_numel, offset, len } = shard;
    let problem = if padded_numel < numel {
        Some(format!("its padded length {padded_numel} is shorter than the {numel} elements it holds"))
    } else if len * world_size != padded_numel {
        Some(format!("{world_size} shards of {len} elements do not make its padded length {padded_numel}"))
    } else if offset + len > padded_numel || (len > 0 && offset % len != 0) {
        Some(format!("a shard at offset {offset} is not one of the {world_size} shards of {len} elements"))
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
