//! Chapter 06 reference solution: the three steps of a sync that overlaps
//! with backward, gradients copied in and out as in chapter 5.
//!
//! Run the chapter's tests on it: `cargo test --features solutions --test chapter_06`
//!
//! `mark_ready` is the library's (`src/ddp/overlap_steps.rs`). The library's
//! `launch_bucket` and `finish_bucket` go one step further than these: they
//! make each gradient a view of its slot, so that nothing is copied (the
//! chapter explains it).

use tch::Tensor;

use super::Bucket;
use crate::dist::{torch_error, DistError, ProcessGroup, ReduceOp, Work};

pub use crate::ddp::mark_ready;

// ANCHOR: launch_bucket
/// Starts averaging one bucket while backward goes on: copies each member's
/// gradient into its slot of `buffer` (zeros for a parameter without a
/// gradient), then starts an asynchronous all-reduce (SUM) of `buffer` and
/// returns its handle at once, without waiting for it.
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
        pg.all_reduce_async(buffer, ReduceOp::Sum) // returns before the data has moved
    })
}
// ANCHOR_END: launch_bucket

// ANCHOR: finish_bucket
/// After backward: waits for the bucket's all-reduce (`work`), divides
/// `buffer` by the world size, and copies each slot back into its member's
/// gradient, in the gradient's shape. Gradients that were undefined stay so.
pub fn finish_bucket(
    pg: &dyn ProcessGroup,
    bucket: &Bucket,
    buffer: &mut Tensor,
    work: Work,
    params: &[(String, Tensor)],
) -> Result<(), DistError> {
    work.wait()?; // from here on, `buffer` holds the sum over all ranks
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
