//! Spoiler: this file holds the library's answers to chapter 13's
//! `reduce_scatter_bucket` and `keep_shard` (`src/ch13_sharded_gradients/exercise.rs`).
//! Working through the book? Write yours first; the book shows them on the
//! chapter's solution page.
//!
//! The two decisions ZeRO-2 ([`ShardGradOp`](super::ShardGradOp)) takes for
//! each bucket during backward: what leaves when the bucket is complete
//! (its members' gradients back to back, padded so that the buffer splits
//! into one equal chunk per rank, and the members' own gradients let go at
//! once), and what this rank keeps once the reduce-scatter is done (its
//! chunk of the sum, divided by the world size as DDP divides; the full
//! buffer goes).

use tch::{Kind, Tensor};

use super::shards::Shard;
use crate::autograd::clear_grad;
use crate::dist::{torch_error, DistError, ProcessGroup, ReduceOp, Work};
use crate::models::Named;

// ANCHOR: in_flight
/// One bucket whose reduce-scatter has left and not yet been waited on.
pub struct InFlight {
    /// `[padded_numel]`: the bucket's full gradient as it left, the members'
    /// gradients back to back, then zeros. The reduce-scatter reads it until
    /// `work` is waited on; after that nothing needs it.
    pub flat: Tensor,
    /// `[len]`: where this rank's chunk of the ranks' sum lands.
    pub chunk: Tensor,
    /// The reduce-scatter's handle.
    pub work: Work,
}
// ANCHOR_END: in_flight

// ANCHOR: reduce_scatter_bucket
/// Starts one bucket's reduce-scatter during backward, once every member's
/// gradient is final: `members` are the bucket's parameters in buffer
/// order, `shard` this rank's part of the padded buffer (`shard_of`'s
/// answer). A member without a gradient (unused in this step on this rank)
/// counts as zeros. Returns the buffer that left, where this rank's chunk
/// will land, and the handle; the members have no gradient afterwards (the
/// buffer holds their values, and ZeRO-2 keeps no full gradient).
pub fn reduce_scatter_bucket(
    pg: &dyn ProcessGroup,
    members: &[Named],
    shard: Shard,
) -> Result<InFlight, DistError> {
    let (kind, device) =
        members.first().map_or((Kind::Float, tch::Device::Cpu), |(_, p)| (p.kind(), p.device()));
    let mut pieces = Vec::with_capacity(members.len() + 1);
    let mut numel = 0;
    for (_, param) in members {
        let grad = param.grad();
        numel += param.numel();
        pieces.push(if grad.defined() {
            grad.reshape([-1])
        } else {
            Tensor::zeros([param.numel() as i64], (kind, device)) // no gradient here: zeros in the sum
        });
    }
    // Padding: reduce_scatter cuts the buffer into world_size equal chunks.
    pieces.push(Tensor::zeros([(shard.padded_numel - numel) as i64], (kind, device)));
    let flat = tch::no_grad(|| Tensor::f_cat(&pieces, 0)).map_err(torch_error(pg, "flattening a bucket"))?;
    drop(pieces);
    // The buffer holds the values now: the full gradients may go.
    for (name, param) in members {
        clear_grad(param).map_err(|e| DistError::Invalid {
            rank: pg.rank(),
            op: format!("letting the gradient of `{name}` go"),
            detail: e.to_string(),
        })?;
    }
    let out =
        Tensor::f_empty([shard.len as i64], (kind, device)).map_err(torch_error(pg, "a gradient shard"))?;
    // Sum, as DDP's all-reduce sums; the division comes after, as in DDP.
    let work = pg.reduce_scatter_async(&flat, ReduceOp::Sum, &out)?;
    Ok(InFlight { flat, chunk: out, work })
}
// ANCHOR_END: reduce_scatter_bucket

// ANCHOR: keep_shard
/// Waits for one bucket's reduce-scatter and returns what this rank keeps:
/// its chunk of DDP's average (`[len]`), bit for bit what DDP's all-reduce
/// and division leave in those elements. The full buffer does not outlive
/// this call.
pub fn keep_shard(pg: &dyn ProcessGroup, in_flight: InFlight) -> Result<Tensor, DistError> {
    let InFlight { flat, mut chunk, work } = in_flight;
    work.wait()?;
    drop(flat); // the reduce-scatter has read it: the full bucket goes
    let _ = tch::no_grad(|| chunk.f_div_scalar_(pg.world_size() as f64))
        .map_err(torch_error(pg, "dividing the gradient shard by the world size"))?;
    Ok(chunk)
}
// ANCHOR_END: keep_shard
