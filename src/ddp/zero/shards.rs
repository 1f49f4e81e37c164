//! Spoiler: this file holds the library's answers to chapter 11's
//! `shard_of` and `step_bucket` (`src/ch11_zero/exercise.rs`), and
//! `step_bucket` member by member, one step away from them. Working
//! through the book? Write yours first; the book shows them on the
//! chapter's solution page.
//!
//! What a ZeRO-1 rank holds of one bucket ([`Shard`], [`ShardedBucket`]), and
//! the two decisions the optimizer ([`ShardedAdamW`](super::ShardedAdamW))
//! runs on it: which shard of a bucket a rank owns, and one step of a bucket
//! (reduce-scatter the gradients, AdamW on this rank's shard, all-gather the
//! parameters). Chapter 11's reference (`src/ch11_zero/solution.rs`)
//! re-exports them.

use tch::Tensor;

use crate::ddp::adamw_update::AdamWUpdate;
use crate::dist::{torch_error, DistError, ProcessGroup, ReduceOp};

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

// ANCHOR: shard_of
/// The shard rank `rank` of `world_size` owns of a flat buffer of `numel`
/// elements, padded with zeros at its end. Every rank gets the same `len`
/// and `padded_numel`; the padded buffer is `world_size` shards of `len`
/// elements (what `reduce_scatter` cuts it into), and rank `rank`'s shard is
/// the one `reduce_scatter` leaves on rank `rank`; the padded buffer holds
/// all `numel` elements, with fewer zeros of padding than there are ranks.
/// An empty buffer has empty shards.
pub fn shard_of(numel: usize, world_size: usize, rank: usize) -> Shard {
    let len = numel.div_ceil(world_size); // the last shard holds the padding
    Shard { padded_numel: len * world_size, offset: rank * len, len }
}
// ANCHOR_END: shard_of

// ANCHOR: step_bucket
/// One ZeRO-1 step of one bucket, on every rank: this rank's shard of the
/// gradients, averaged over all ranks as plain DDP averages them (summed,
/// then the sum divided by the world size), steps this rank's shard of the
/// parameters with AdamW and the shard's moments in the bucket, and every
/// rank ends with every rank's updated shard written into `bucket.param`:
/// the parameters plain DDP with AdamW would have, bit for bit.
pub fn step_bucket(
    pg: &dyn ProcessGroup,
    bucket: &mut ShardedBucket,
    adamw: &AdamWUpdate,
) -> Result<(), DistError> {
    let Shard { offset, len, .. } = bucket.shard;
    // Sum, then divide, as DDP's all-reduce does: the same bits per element.
    let mut grad = pg.reduce_scatter(&bucket.grad, ReduceOp::Sum)?; // [len], this rank's shard
    let _ = grad
        .f_div_scalar_(pg.world_size() as f64)
        .map_err(torch_error(pg, "dividing the gradient shard by the world size"))?;
    let mut param = bucket.param.narrow(0, offset as i64, len as i64); // a view: the update lands in the bucket
    adamw
        .apply(&mut param, &grad, &mut bucket.exp_avg, &mut bucket.exp_avg_sq)
        .map_err(torch_error(pg, "AdamW on this rank's shard"))?;
    let shards = pg.all_gather(&param)?; // world_size x [len], in rank order
    tch::no_grad(|| bucket.param.f_copy_(&Tensor::cat(&shards, 0)))
        .map_err(torch_error(pg, "copying the gathered shards into the bucket"))
}
// ANCHOR_END: step_bucket

/// [`step_bucket`] for a bucket whose members do not all take the same
/// step: `counts[k]` is member `k`'s step count for this update, `None` if
/// it is not stepped (its part of the shard, parameter and moments, is left
/// as it is). The same collectives as `step_bucket`, and per member the
/// same arithmetic on its part of this rank's shard, with its own bias
/// correction. `numels[k]` is member `k`'s size; `settings` gives the rest.
pub(super) fn step_bucket_per_parameter(
    pg: &dyn ProcessGroup,
    bucket: &mut ShardedBucket,
    numels: &[i64],
    counts: &[Option<i64>],
    settings: &AdamWUpdate,
) -> Result<(), DistError> {
    let (offset, len) = (bucket.shard.offset as i64, bucket.shard.len as i64);
    let mut grad = pg.reduce_scatter(&bucket.grad, ReduceOp::Sum)?; // [len], this rank's shard
    let _ = grad
        .f_div_scalar_(pg.world_size() as f64)
        .map_err(torch_error(pg, "dividing the gradient shard by the world size"))?;
    let mut start = 0;
    for (&numel, &count) in numels.iter().zip(counts) {
        // The member's elements that fall in this rank's shard, in bucket coordinates.
        let (from, to) = (start.max(offset), (start + numel).min(offset + len));
        start += numel;
        let Some(step) = count.filter(|_| from < to) else { continue };
        let (at, n) = (from - offset, to - from);
        let update = AdamWUpdate { step, ..*settings };
        update
            .apply(
                &mut bucket.param.narrow(0, from, n),
                &grad.narrow(0, at, n),
                &mut bucket.exp_avg.narrow(0, at, n),
                &mut bucket.exp_avg_sq.narrow(0, at, n),
            )
            .map_err(torch_error(pg, "AdamW on a parameter's part of this rank's shard"))?;
    }
    let mine = bucket.param.narrow(0, offset, len);
    let shards = pg.all_gather(&mine)?; // world_size x [len], in rank order
    tch::no_grad(|| bucket.param.f_copy_(&Tensor::cat(&shards, 0)))
        .map_err(torch_error(pg, "copying the gathered shards into the bucket"))
}
