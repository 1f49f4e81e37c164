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
/// Records it in `progress` and returns the buckets to launch now, in the
/// order to launch them. Over one backward pass every bucket is returned
/// exactly once, as early as it may leave, and in the same order on every
/// rank, whichever order the hooks fire in there. A second mark of the same
/// parameter in one pass changes nothing.
#[allow(unused_variables)] // delete this line once you use the arguments
pub fn mark_ready(progress: &mut BucketProgress, param: usize) -> Vec<usize> {
    // TODO: the bookkeeping of one backward pass. `progress` knows, for each
    // parameter, its bucket and whether it is ready; for each bucket, how
    // many members it still waits for, and whether you have returned it.
    // Keep: each bucket returned once per pass; a parameter marked twice
    // counts once; nothing here may depend on anything but `progress` and
    // `param` (every rank runs it on its own hooks, without talking).
    // Yours to decide: when a complete bucket may leave. Collectives pair up
    // across ranks by their order, and the hooks need not fire in the same
    // order on every rank: if one rank completes bucket 2 before bucket 1
    // and its peer the other way round, what would their second all-reduces
    // add together? The tests replay every order of the hooks.
    // Stuck? `cargo workbook hint 06` gives hints one at a time.
    todo!("exercise ch06: mark_ready in src/ch06_overlap/exercise.rs")
}

/// Starts averaging one bucket while backward goes on: each member's
/// gradient (zeros for a parameter without one) goes into its slot of
/// `buffer`, an asynchronous all-reduce of `buffer` starts, and its handle
/// comes back at once, without waiting for the data to move.
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
    // autograd); from the moment the all-reduce starts until its `Work` has
    // been waited on, the buffer is the all-reduce's: what you write into it
    // then may be lost, and what you read may be half done (a test runs an
    // all-reduce that delivers its result only when waited on).
    // Yours to decide, with finish_bucket: where the division by the world
    // size goes (each rank's share before the sum, or the sum after it:
    // chapter 3 weighed the two), and how you find and fill each slot.
    // Available: `buffer` is flat, `[bucket.numel]`. `pg.all_reduce_async(
    // buffer, crate::dist::ReduceOp::Sum)` returns a `Result<Work, _>`;
    // `param.grad()`, `Tensor::narrow`, `f_reshape([-1])` (a gradient,
    // flat), `f_copy_`, `f_zero_` and `f_div_scalar_` (both return a
    // handle: `let _ = ...?;`), `tch::no_grad`, and `crate::dist::torch_error`
    // for the errors of the fallible `f_...` calls.
    todo!("exercise ch06: launch_bucket in src/ch06_overlap/exercise.rs")
}

/// After backward, for a bucket that `launch_bucket` started: once `work`
/// has completed, leaves in each member's gradient its mean over all ranks,
/// in the gradient's shape. Gradients that were undefined stay so.
#[allow(unused_variables)] // delete this line once you use the arguments
pub fn finish_bucket(
    pg: &dyn ProcessGroup,
    bucket: &Bucket,
    buffer: &mut Tensor,
    work: Work,
    params: &[(String, Tensor)],
) -> Result<(), DistError> {
    // TODO: the second half of chapter 5's `sync_bucket`.
    // Keep: the all-reduce's error, if `work` has one, goes back to the
    // caller; the buffer is yours again only once the all-reduce is done;
    // every gradient ends as the mean, whichever function divided; the
    // training tests compare with chapter 5's sync and with one process.
    // Yours to decide, with launch_bucket: where the division goes, and the
    // order of what this function does.
    // Available: `work.wait()`, `pg.world_size()`, `f_div_scalar_` (returns
    // a handle: `let _ = ...?;`), `Tensor::narrow`, `param.grad()`,
    // `f_view_as` (a slot in its gradient's shape), `f_copy_`,
    // `tch::no_grad`, and `crate::dist::torch_error`.
    todo!("exercise ch06: finish_bucket in src/ch06_overlap/exercise.rs")
}
// ANCHOR_END: stub
