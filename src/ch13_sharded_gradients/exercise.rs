//! Chapter 13 exercise: one bucket's reduce-scatter during backward, and
//! what a rank keeps of it. This is the file you edit.
//!
//! Check your work: `cargo test --test chapter_13`
//!
//! `ShardGradOp` in `mod.rs` calls `reduce_scatter_bucket` from a gradient-ready
//! hook, on the backward thread, the moment a bucket's last gradient is
//! final (buckets leave in bucket order, the same on every rank), and
//! `keep_shard` on the oldest bucket in flight before it launches one
//! more (at most `BUCKETS_IN_FLIGHT`) and on every bucket left at the end
//! of backward. It checks the lengths you return and that no member keeps
//! a gradient after its bucket left.

use super::{InFlight, Named, Shard};
use crate::dist::{DistError, ProcessGroup};
use tch::Tensor;

// ANCHOR: stub
/// Starts one bucket's reduce-scatter during backward, once every member's
/// gradient is final: `members` are the bucket's parameters in buffer
/// order, `shard` this rank's part of the padded buffer (`shard_of`'s
/// answer). A member without a gradient (unused in this step on this rank)
/// counts as zeros. Returns the buffer that left, where this rank's chunk
/// will land, and the handle; the members have no gradient afterwards (the
/// buffer holds their values, and ZeRO-2 keeps no full gradient).
#[allow(unused_variables)] // delete this line once you use the arguments
pub fn reduce_scatter_bucket(
    pg: &dyn ProcessGroup,
    members: &[Named],
    shard: Shard,
) -> Result<InFlight, DistError> {
    // TODO: build the buffer that leaves, let the full gradients go, start
    // the reduce-scatter without waiting for it.
    // Keep: the buffer is `shard.padded_numel` long, the members' gradients
    // flattened in the order of `members`, then zeros; a member without a
    // gradient sends zeros (another rank may have one); every member has no
    // gradient when you return (`crate::autograd::clear_grad`), or the
    // wrapper fails naming it; the output is `shard.len` long, and what
    // lands in it is this rank's chunk of the ranks' sum (`InFlight`), for
    // `keep_shard` to finish (the tests pair yours with the library's).
    // Yours to decide: in which order the steps go, and when each piece of
    // memory may go (the members' gradients are all alive when the hook
    // calls you: a bucket leaves once its last one is final).
    // Available: `param.grad()` (`.defined()` says whether there is one),
    // `Tensor::cat`, `Tensor::zeros`, `Tensor::empty`, `tch::no_grad`,
    // `pg.reduce_scatter_async(&buffer, ReduceOp::..., &output)`,
    // `crate::dist::torch_error` for the `f_...` calls, and
    // `super::autograd_error` for `clear_grad`'s.
    // Stuck? `cargo workbook hint 13` gives hints one at a time.
    todo!("exercise ch13: reduce_scatter_bucket in src/ch13_sharded_gradients/exercise.rs")
}

/// Waits for one bucket's reduce-scatter and returns what this rank keeps:
/// its chunk of DDP's average (`[len]`), bit for bit what DDP's all-reduce
/// and division leave in those elements. The full buffer does not outlive
/// this call.
#[allow(unused_variables)] // delete this line once you use the arguments
pub fn keep_shard(pg: &dyn ProcessGroup, in_flight: InFlight) -> Result<Tensor, DistError> {
    // TODO: wait, let the full buffer go, average this rank's chunk.
    // Keep: the tests compare bits with DDP's all-reduce and division, and
    // read the memory ledger: the full buffer must not outlive this call.
    // Yours to decide: how the chunk of the sum becomes DDP's average bit
    // for bit, and at which point of this call the buffer goes.
    // Available: `in_flight.work.wait()`, `drop`, `pg.world_size()`,
    // `Tensor`'s in-place arithmetic (`f_div_scalar_`, `f_mul_scalar_`, ...).
    todo!("exercise ch13: keep_shard in src/ch13_sharded_gradients/exercise.rs")
}
// ANCHOR_END: stub
