//! Chapter 06 exercise: the three steps of a sync that overlaps with
//! backward. This is the file you edit.
//!
//! Check your work: `cargo test --test chapter_06`
//!
//! `SimpleDistributedDataParallelism::backward` in `mod.rs` arms the library's driver, whose
//! hooks call `mark_ready` on the backward thread each time a gradient is
//! final, and `launch_bucket` for each bucket it returns. After backward the
//! driver marks the parameters that got no gradient (so their buckets leave
//! too, with zeros in their slots), then calls `finish_bucket` for every
//! launched bucket, in launch order. Buffers hold `bucket.numel` elements of
//! the bucket's dtype, allocated once; chapter 5 explained the layout.

use tch::Tensor;

use super::{Bucket, BucketProgress};
use crate::dist::{DistError, ProcessGroup, Work};

// ANCHOR: stub
/// A gradient-ready hook says that parameter `param`'s gradient is final.
/// Marks it ready in `progress` and returns the buckets that may leave now,
/// in order: from `progress.next_bucket` on, each bucket with no member
/// pending, up to the first that still has one; `next_bucket` moves past
/// them. A second mark of the same parameter in one pass changes nothing.
#[allow(unused_variables)] // delete this line once you use the arguments
pub fn mark_ready(progress: &mut BucketProgress, param: usize) -> Vec<usize> {
    // TODO: the bookkeeping of one backward pass. `progress` knows, for each
    // parameter, its bucket and whether it is ready; for each bucket, how
    // many members it still waits for; and the next bucket to leave.
    // Keep: buckets leave in bucket order on every rank, whatever order the
    // hooks fire in (collectives pair up by their order), so a complete
    // bucket waits while an earlier one is incomplete; each bucket is
    // returned once; a parameter marked twice counts once.
    // Yours to decide: nothing much; this one is short.
    // Stuck? `cargo workbook hint 06` gives hints one at a time.
    todo!("exercise ch06: mark_ready in src/ch06_overlap/exercise.rs")
}

/// Starts averaging one bucket while backward goes on: copies each member's
/// gradient into its slot of `buffer` (zeros for a parameter without a
/// gradient), then starts an asynchronous all-reduce (SUM) of `buffer` and
/// returns its handle at once, without waiting for it.
#[allow(unused_variables)] // delete this line once you use the arguments
pub fn launch_bucket(
    pg: &dyn ProcessGroup,
    bucket: &Bucket,
    buffer: &mut Tensor,
    params: &[(String, Tensor)],
) -> Result<Work, DistError> {
    // TODO: the first half of chapter 5's `sync_bucket`, with a collective
    // that returns before the data has moved.
    // Keep: the slots follow `bucket.params`, back to back; every rank sends
    // a buffer of the same length; none of it is part of the model (no
    // autograd); do not touch `buffer` after the all-reduce has started.
    // Yours to decide: how you find each slot and fill it.
    // Available: `buffer` is flat, `[bucket.numel]`. `pg.all_reduce_async(
    // buffer, crate::dist::ReduceOp::Sum)` returns a `Result<Work, _>`;
    // `param.grad()`, `Tensor::narrow`, `f_reshape([-1])` (a gradient,
    // flat), `f_copy_`, `f_zero_` (returns a handle: `let _ = ...?;`),
    // `tch::no_grad`, and `crate::dist::torch_error` for the errors of the
    // fallible `f_...` calls.
    todo!("exercise ch06: launch_bucket in src/ch06_overlap/exercise.rs")
}

/// After backward: waits for the bucket's all-reduce (`work`), divides
/// `buffer` by the world size, and copies each slot back into its member's
/// gradient, in the gradient's shape. Gradients that were undefined stay so.
#[allow(unused_variables)] // delete this line once you use the arguments
pub fn finish_bucket(
    pg: &dyn ProcessGroup,
    bucket: &Bucket,
    buffer: &mut Tensor,
    work: Work,
    params: &[(String, Tensor)],
) -> Result<(), DistError> {
    // TODO: the second half of chapter 5's `sync_bucket`.
    // Keep: read `buffer` only once `work.wait()` has returned Ok (an error
    // goes back to the caller); sum first, divide after, as chapter 5 did,
    // so that the result equals its sync bitwise.
    // Available: `work.wait()`, `pg.world_size()`, `f_div_scalar_` (returns
    // a handle: `let _ = ...?;`), `Tensor::narrow`, `param.grad()`,
    // `f_view_as` (a slot in its gradient's shape), `f_copy_`,
    // `tch::no_grad`, and `crate::dist::torch_error`.
    todo!("exercise ch06: finish_bucket in src/ch06_overlap/exercise.rs")
}
// ANCHOR_END: stub
