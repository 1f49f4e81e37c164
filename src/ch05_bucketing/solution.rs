//! Chapter 05 reference solution: plan the buckets, then average one bucket of
//! gradients with a single all-reduce.
//!
//! Run the chapter's tests on it: `cargo test --features solutions --test chapter_05`

use std::cmp::Reverse;

use tch::Tensor;

use super::layout::{Bucket, ParamMeta};
use super::torch_error;
use crate::dist::{DistError, ProcessGroup, ReduceOp};

// ANCHOR: plan_buckets
/// Groups the parameters into buckets, walking them from the LAST registered
/// to the first (the order in which backward produces their gradients). Each
/// dtype and device gets its own buckets; the first bucket of each holds at
/// most `first_cap_bytes`, the others at most `cap_bytes`, except that a
/// parameter larger than the cap gets a bucket of its own. Buckets come out
/// in the order backward starts filling them: the last layer's first.
pub fn plan_buckets(params: &[ParamMeta], cap_bytes: usize, first_cap_bytes: usize) -> Vec<Bucket> {
    let mut closed: Vec<Bucket> = Vec::new();
    // At most one bucket being filled per (dtype, device).
    let mut open: Vec<Bucket> = Vec::new();
    for index in (0..params.len()).rev() {
        let meta = &params[index];
        let same_key = |b: &Bucket| b.kind == meta.kind && b.device == meta.device;
        // The first bucket of a key is small, so that it fills, and can be
        // sent, early in backward; once one of that key is closed, the big cap.
        let limit = |closed: &[Bucket]| if closed.iter().any(same_key) { cap_bytes } else { first_cap_bytes };

        // 1. This gradient would overflow the open bucket: close that one as it is.
        if let Some(i) = open.iter().position(same_key) {
            if open[i].bytes() + meta.bytes() > limit(&closed) {
                closed.push(open.swap_remove(i));
            }
        }
        // 2. Put it in the open bucket of its key, opening one if needed.
        let i = match open.iter().position(same_key) {
            Some(i) => i,
            None => {
                open.push(Bucket::new(meta.kind, meta.device));
                open.len() - 1
            }
        };
        open[i].params.push(index);
        open[i].numel += meta.numel;
        // 3. Full, or one parameter at least as large as the cap: close it.
        if open[i].bytes() >= limit(&closed) {
            closed.push(open.swap_remove(i));
        }
    }
    closed.extend(open); // the partly filled last buckets
                         // Closing order is not filling order when dtypes mix (a big f32 tensor
                         // closes its bucket while an f64 bucket opened earlier is still open).
                         // Sort by first member, highest index first: the order backward, going
                         // from high indices to low, starts filling them.
    closed.sort_by_key(|b| Reverse(b.params[0]));
    closed
}
// ANCHOR_END: plan_buckets

// ANCHOR: sync_bucket
/// Averages the gradients of one bucket's parameters over all ranks with a
/// single all-reduce: copy each gradient into its slot of `buffer` (zeros for
/// a parameter without a gradient), all-reduce `buffer` with SUM, divide it
/// by the world size, and copy each slot back into its gradient. On return
/// `buffer` holds the averaged bucket; gradients that were undefined stay so.
pub fn sync_bucket(
    pg: &dyn ProcessGroup,
    bucket: &Bucket,
    buffer: &mut Tensor,
    params: &[(String, Tensor)],
) -> Result<(), DistError> {
    tch::no_grad(|| {
        // 1. Copy in. The slots follow `bucket.params`, back to back.
        let mut offset = 0;
        for &index in &bucket.params {
            let (name, param) = &params[index];
            let numel = param.numel() as i64;
            let mut slot = buffer.narrow(0, offset, numel); // [numel], a view into the buffer
            let grad = param.grad();
            let copied = if grad.defined() {
                grad.f_reshape([-1]).and_then(|flat| slot.f_copy_(&flat)) // [numel]
            } else {
                // No gradient here: send zeros, so that every rank still makes
                // the same call with the same buffer size.
                slot.f_zero_().map(|_| ())
            };
            // (A closure, so that the message is only formatted on an error.)
            let op = || format!("copying the gradient of `{name}` into its bucket");
            copied.map_err(|source| DistError::Torch { rank: pg.rank(), op: op(), source })?;
            offset += numel;
        }

        // 2. One collective for the whole bucket, then the mean.
        pg.all_reduce(buffer, ReduceOp::Sum)?;
        let _ = buffer
            .f_div_scalar_(pg.world_size() as f64)
            .map_err(torch_error(pg, "dividing a bucket by the world size"))?;

        // 3. Copy out, slot by slot, into the gradients that exist.
        let mut offset = 0;
        for &index in &bucket.params {
            let (name, param) = &params[index];
            let numel = param.numel() as i64;
            let mut grad = param.grad(); // a handle sharing the gradient's storage
            if grad.defined() {
                let slot = buffer.narrow(0, offset, numel); // [numel]
                let op = || format!("copying the bucket back into the gradient of `{name}`");
                slot.f_view_as(&grad) // the gradient's shape
                    .and_then(|averaged| grad.f_copy_(&averaged))
                    .map_err(|source| DistError::Torch { rank: pg.rank(), op: op(), source })?;
            }
            offset += numel;
        }
        Ok(())
    })
}
// ANCHOR_END: sync_bucket
