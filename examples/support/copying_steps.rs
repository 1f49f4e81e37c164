//! An overlapped sync's launch and finish
//! that copy each gradient into its bucket and back, as chapter 6's exercise
//! does, for bench_overlap.rs to set against the library's, which keep the
//! gradients in their buckets. It plugs into the library's driver through
//! `ddp::seams`, the chapters' door, which the `layering` check lets this
//! benchmark use (and no other example); it never imports a chapter
//! (docs/architecture.md). Included by
//! bench_overlap.rs with `#[path = "support/copying_steps.rs"] mod copying_steps;`.

use ddp_workbook::ddp::seams::{OverlapSteps, ReducerWithSteps};
use ddp_workbook::ddp::{self, Bucket, GradientBuckets, Named, Reducer};
use ddp_workbook::dist::{torch_error, DistError, Group, ProcessGroup, ReduceOp, Work};
use ddp_workbook::tch::{self, Tensor};

/// A [`Reducer`] that runs the library's readiness rule with the copying
/// launch and finish below.
pub fn copying_reducer(pg: Group, params: &[Named], buckets: GradientBuckets) -> Result<Reducer, DistError> {
    let steps = OverlapSteps { mark_ready: ddp::mark_ready, launch_bucket, finish_bucket };
    Reducer::with_steps(pg, params, buckets, steps)
}

/// The bucket's members' slots in `buffer`: views, back to back.
fn slots(
    pg: &dyn ProcessGroup,
    bucket: &Bucket,
    buffer: &Tensor,
    params: &[Named],
) -> Result<Vec<Tensor>, DistError> {
    let sizes: Vec<i64> = bucket.params.iter().map(|&index| params[index].1.numel() as i64).collect();
    buffer.f_split_with_sizes(sizes.as_slice(), 0).map_err(torch_error(pg, "cutting a bucket into slots"))
}

/// Copies each gradient into its slot (zeros for a missing one) and starts
/// the bucket's SUM.
fn launch_bucket(
    pg: &dyn ProcessGroup,
    bucket: &Bucket,
    buffer: &mut Tensor,
    params: &[Named],
) -> Result<Work, DistError> {
    tch::no_grad(|| {
        for (&index, slot) in bucket.params.iter().zip(slots(pg, bucket, buffer, params)?) {
            let (mut slot, grad) = (slot, params[index].1.grad());
            let copied =
                if grad.defined() { slot.f_copy_(&grad.reshape([-1])) } else { slot.f_zero_().map(|_| ()) };
            copied.map_err(torch_error(pg, "copying a gradient into its bucket"))?;
        }
        pg.all_reduce_async(buffer, ReduceOp::Sum)
    })
}

/// Waits, divides by the world size, and copies each slot back into its
/// gradient.
fn finish_bucket(
    pg: &dyn ProcessGroup,
    bucket: &Bucket,
    buffer: &mut Tensor,
    work: Work,
    params: &[Named],
) -> Result<(), DistError> {
    work.wait()?;
    tch::no_grad(|| {
        let _ = buffer.f_div_scalar_(pg.world_size() as f64).map_err(torch_error(pg, "dividing a bucket"))?;
        for (&index, slot) in bucket.params.iter().zip(slots(pg, bucket, buffer, params)?) {
            let mut grad = params[index].1.grad();
            if grad.defined() {
                grad.f_copy_(&slot.view_as(&grad)).map_err(torch_error(pg, "copying a bucket back"))?;
            }
        }
        Ok(())
    })
}
