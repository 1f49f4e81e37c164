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
/// elements, padded with zeros at its end. Every rank gets the same `len`
/// and `padded_numel`; the padded buffer is `world_size` shards of `len`
/// elements (what `reduce_scatter` cuts it into), and rank `rank`'s shard is
/// the one `reduce_scatter` leaves on rank `rank`; the padded buffer holds
/// all `numel` elements, with fewer zeros of padding than there are ranks.
/// An empty buffer has empty shards.
#[allow(unused_variables)] // delete this line once you use the arguments
pub fn shard_of(numel: usize, world_size: usize, rank: usize) -> Shard {
    // TODO: decide how long each shard is, how much padding that takes, and
    // where this rank's shard starts. Start from what reduce_scatter does
    // with a buffer (the chapter's notebook shows it): it needs a length
    // that divides by the world size, cuts the buffer into that many equal
    // chunks and leaves one on each rank.
    // Keep: every element of the buffer in exactly one shard; the padding as
    // small as it can be (less than `world_size` elements); the result
    // depends only on the arguments, so that every rank agrees; 0 elements
    // and more ranks than elements work too.
    // Stuck? `cargo workbook hint 11` gives hints one at a time.
    todo!("exercise ch11: shard_of in src/ch11_zero/exercise.rs")
}

/// One ZeRO-1 step of one bucket, on every rank: this rank's shard of the
/// gradients, averaged over all ranks as plain DDP averages them (summed,
/// then the sum divided by the world size), steps this rank's shard of the
/// parameters with AdamW and the shard's moments in the bucket, and every
/// rank ends with every rank's updated shard written into `bucket.param`:
/// the parameters plain DDP with AdamW would have, bit for bit.
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
    // The average is DDP's, bit for bit: each element of your shard's
    // gradient must be the very float plain DDP's all-reduce and division
    // leave in that element (ways to average that are equal on paper round
    // differently, and the tests compare bits and name the way you used).
    // Yours to decide: which reduction and which division give those
    // bits; how to update a part of `bucket.param` and of the
    // moments in place; how the gathered shards get back into it.
    // Available: `pg.reduce_scatter`, `pg.all_gather`,
    // `crate::dist::ReduceOp`, `pg.world_size()`,
    // `adamw.apply(param, grad, exp_avg, exp_avg_sq)` (the training run's
    // AdamW arithmetic), `Tensor::narrow`, `tch::Tensor::cat`, `tch::no_grad`,
    // and `crate::dist::torch_error` for the errors of the `f_...` tensor calls.
    todo!("exercise ch11: step_bucket in src/ch11_zero/exercise.rs")
}
// ANCHOR_END: stub
