//! Chapter 11 exercise: which shard of a flat buffer a rank owns, and one
//! ZeRO-1 step of a bucket. This is the file you edit.
//!
//! Check your work: `cargo test --test chapter_11`
//!
//! `ShardedAdamW::new` in `mod.rs` calls `shard_of` once per bucket, at
//! construction, and checks what it returns; `ShardedAdamW::step` copies
//! this rank's gradients into each bucket's padded `grad` buffer and then
//! calls `step_bucket` once per bucket, in bucket order, on every rank.

use super::{AdamWUpdate, Shard, ShardedBucket};
use crate::dist::{DistError, ProcessGroup};

// ANCHOR: stub
/// The shard rank `rank` of `world_size` owns of a flat buffer of `numel`
/// elements: the buffer is padded with zeros to the next multiple of
/// `world_size`, and cut into `world_size` equal shards in rank order.
#[allow(unused_variables)] // delete this line once you use the arguments
pub fn shard_of(numel: usize, world_size: usize, rank: usize) -> Shard {
    // TODO: a collective that splits a buffer (reduce_scatter) needs a
    // length that divides by the world size, and every rank's part must be
    // as long as every other's. Decide how long each shard is, how much
    // padding that takes, and where this rank's shard starts.
    // Keep: every element of the buffer in exactly one shard; the padding as
    // small as it can be (less than `world_size` elements); the result
    // depends only on the arguments, so that every rank agrees.
    // Stuck? `cargo workbook hint 11` gives hints one at a time.
    todo!("exercise ch11: shard_of in src/ch11_zero/exercise.rs")
}

/// One ZeRO-1 step of one bucket, on every rank: this rank's shard of the
/// gradients, averaged over all ranks, steps this rank's shard of the
/// parameters with AdamW (moments of the shard only), and every rank ends
/// with every rank's updated shard in `bucket.param`: the parameters plain
/// DDP with AdamW would have.
#[allow(unused_variables)] // delete this line once you use the arguments
pub fn step_bucket(
    pg: &dyn ProcessGroup,
    bucket: &mut ShardedBucket,
    adamw: &AdamWUpdate,
) -> Result<(), DistError> {
    // TODO: where DDP all-reduces the whole bucket and every rank steps all
    // of it, each rank here receives only the average of its own shard,
    // steps only that shard, and the ranks then share what they stepped.
    // Keep: `bucket.grad` holds this rank's gradients (padded, length
    // `bucket.shard.padded_numel`); `bucket.exp_avg` and `bucket.exp_avg_sq`
    // are the moments of this rank's shard (length `bucket.shard.len`) and
    // must be updated in place; the new values end in `bucket.param`, whose
    // first `bucket.numel` elements ARE the model's parameters. The tests
    // compare every weight after every step with plain DDP and one process,
    // on 2, 3 and 4 ranks, and count the bytes you hand to collectives.
    // Yours to decide: the reduction and where the division by the world
    // size goes (DDP's sync sums, then divides); how to update a part of
    // `bucket.param` in place; how the gathered shards get back into it.
    // Available: `pg.reduce_scatter`, `pg.all_gather`,
    // `crate::dist::ReduceOp`, `pg.world_size()`,
    // `adamw.apply(param, grad, exp_avg, exp_avg_sq)` (the training run's
    // AdamW arithmetic), `Tensor::narrow`, `tch::Tensor::cat`, `tch::no_grad`,
    // and `crate::dist::torch_error` for the errors of the `f_...` tensor calls.
    todo!("exercise ch11: step_bucket in src/ch11_zero/exercise.rs")
}
// ANCHOR_END: stub
