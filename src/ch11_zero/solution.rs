//! Chapter 11 reference solution: which shard a rank owns, and one ZeRO-1
//! step of a bucket (reduce-scatter, AdamW on the shard, all-gather).
//!
//! Run the chapter's tests on it: `cargo test --features solutions --test chapter_11`

use tch::Tensor;

use super::{AdamWUpdate, Shard, ShardedBucket};
use crate::dist::{torch_error, DistError, ProcessGroup, ReduceOp};

// ANCHOR: shard_of
/// The shard rank `rank` of `world_size` owns of a flat buffer of `numel`
/// elements: the buffer is padded with zeros to the next multiple of
/// `world_size`, and cut into `world_size` equal shards in rank order.
pub fn shard_of(numel: usize, world_size: usize, rank: usize) -> Shard {
    let len = numel.div_ceil(world_size); // the last shard holds the padding
    Shard { padded_numel: len * world_size, offset: rank * len, len }
}
// ANCHOR_END: shard_of

// ANCHOR: step_bucket
/// One ZeRO-1 step of one bucket, on every rank: this rank's shard of the
/// gradients, averaged over all ranks, steps this rank's shard of the
/// parameters with AdamW (moments of the shard only), and every rank ends
/// with every rank's updated shard in `bucket.param`: the parameters plain
/// DDP with AdamW would have.
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
