//! Chapter 06 reference solution: the three steps of a sync that overlaps
//! with backward, gradients copied in and out as in chapter 5.
//!
//! Run the chapter's tests on it: `cargo test --features solutions --test chapter_06`
//!
//! This reference divides after the wait, as chapter 5 did; dividing before
//! the all-reduce starts is just as right (the chapter weighs both). The
//! library's launch and finish (`GradientBuckets` in `src/ddp/reducer/buckets.rs`)
//! go one step further: they keep each gradient in its slot, so that
//! nothing is copied back (the chapter explains it).

use tch::Tensor;

use super::{Bucket, BucketProgress};
use crate::dist::{torch_error, DistError, ProcessGroup, ReduceOp, Work};

// ANCHOR: mark_ready
/// A gradient-ready hook says that parameter `param`'s gradient is final.
/// Records it in `progress` and returns the buckets to launch now, in the
/// order to launch them. Over one backward pass every bucket is returned
/// exactly once, as early as it may leave, and in the same order on every
/// rank, whichever order the hooks fire in there. A second mark of the same
/// parameter in one pass changes nothing.
pub fn mark_ready(progress: &mut BucketProgress, param: usize) -> Vec<usize> {
    if progress.ready[param] {
        return vec![]; // marked already in this pass: it counts once
    }
    progress.ready[param] = true;
    progress.pending[progress.bucket_of[param]] -= 1;
    // Bucket order, not the order buckets complete in: the k-th all-reduce
    // of every rank must be bucket k, and the hooks may complete bucket 2
    // before bucket 1 on one rank and after it on another. So a complete
    // bucket waits until every bucket before it has left, and then leaves
    // at once, with it. The buckets launched so far are always the first
    // ones: the next to leave is the first not launched.
    let mut next = progress.launched.iter().take_while(|&&launched| launched).count();
    let mut leaving = vec![];
    while next < progress.pending.len() && progress.pending[next] == 0 {
        progress.launched[next] = true;
        leaving.push(next);
        next += 1;
    }
    leaving
}
// ANCHOR_END: mark_ready

// ANCHOR: launch_bucket
/// Starts averaging one bucket while backward goes on: each member's
/// gradient (zeros for a parameter without one) goes into its slot of
/// `buffer`, an asynchronous all-reduce of `buffer` starts, and its handle
/// comes back at once, without waiting for the data to move.
pub fn launch_bucket(
    pg: &dyn ProcessGroup,
    bucket: &Bucket,
    buffer: &mut Tensor,
    params: &[(String, Tensor)],
) -> Result<Work, DistError> {
    tch::no_grad(|| {
        let mut offset = 0;
        for &index in &bucket.params {
            let (name, param) = &params[index];
            let numel = param.numel() as i64;
            let mut slot = buffer.narrow(0, offset, numel); // [numel], a view into the buffer
            let grad = param.grad();
            let filled = if grad.defined() {
                grad.f_reshape([-1]).and_then(|flat| slot.f_copy_(&flat))
            } else {
                slot.f_zero_().map(|_| ()) // adds nothing to the others' sum
            };
            filled.map_err(torch_error(pg, format!("copying the gradient of `{name}` into its bucket")))?;
            offset += numel;
        }
        // From here until `work.wait()` the buffer is the all-reduce's: this
        // function touches it no more (the division waits for finish_bucket).
        pg.all_reduce_async(buffer, ReduceOp::Sum) // returns before the data has moved
    })
}
// ANCHOR_END: launch_bucket

// ANCHOR: finish_bucket
/// After backward, for a bucket that `launch_bucket` started: once `work`
/// has completed, leaves in each member's gradient its mean over all ranks,
/// in the gradient's shape. Gradients that were undefined stay so.
pub fn finish_bucket(
    pg: &dyn ProcessGroup,
    bucket: &Bucket,
    buffer: &mut Tensor,
    work: Work,
    params: &[(String, Tensor)],
) -> Result<(), DistError> {
    work.wait()?; // only from here on does `buffer` hold the sum over all ranks
    tch::no_grad(|| {
        let _ = buffer.f_div_scalar_(pg.world_size() as f64).map_err(torch_error(pg, "dividing a bucket"))?;
        let mut offset = 0;
        for &index in &bucket.params {
            let (name, param) = &params[index];
            let numel = param.numel() as i64;
            let mut grad = param.grad();
            if grad.defined() {
                let slot = buffer.narrow(0, offset, numel); // [numel]
                slot.f_view_as(&grad).and_then(|averaged| grad.f_copy_(&averaged)).map_err(torch_error(
                    pg,
                    format!("copying the bucket back into the gradient of `{name}`"),
                ))?;
            }
            offset += numel;
        }
        Ok(())
    })
}
// ANCHOR_END: finish_bucket
