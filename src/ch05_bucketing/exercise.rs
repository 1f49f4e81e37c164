//! Chapter 05 exercise: plan the buckets, then average one bucket of gradients
//! with a single all-reduce. This is the file you edit.
//!
//! Check your work: `cargo test --test chapter_05`
//!
//! `BucketedDdp::with_bucket_caps` in `mod.rs` calls `plan_buckets` once, at
//! construction, and the library checks what it returns; `sync_gradients`
//! calls `sync_bucket` once per bucket, in bucket order, with a buffer of
//! `bucket.numel` elements of the bucket's dtype, allocated once.

use tch::Tensor;

use super::{Bucket, ParamMeta};
use crate::dist::{DistError, ProcessGroup};

// ANCHOR: stub
/// Groups the parameters into buckets, walking them from the LAST registered
/// to the first (the order in which backward produces their gradients). Each
/// dtype and device gets its own buckets; the first bucket of each holds at
/// most `first_cap_bytes`, the others at most `cap_bytes`, except that a
/// parameter larger than the cap gets a bucket of its own. Buckets come out
/// in the order backward starts filling them: the last layer's first.
#[allow(unused_variables)] // delete this line once you use the arguments
pub fn plan_buckets(params: &[ParamMeta], cap_bytes: usize, first_cap_bytes: usize) -> Vec<Bucket> {
    // TODO: keep a list of closed buckets and, per (kind, device), at most one
    // open bucket being filled. For each index from params.len() - 1 down to 0:
    //   - its limit: `first_cap_bytes` while no bucket of its (kind, device)
    //     has been closed yet, `cap_bytes` after that;
    //   - if the open bucket of its (kind, device) would grow past the limit
    //     with this parameter (`bucket.bytes() + meta.bytes() > limit`),
    //     close that bucket as it is;
    //   - push the index into the open bucket of its (kind, device) (open a
    //     new one with `Bucket::new(kind, device)` if there is none) and add
    //     its `numel` to the bucket's `numel`;
    //   - if that bucket now holds `>= limit` bytes (full, or a single
    //     parameter at least as large as the cap), close it.
    // At the end close the open buckets too, then sort all of them by their
    // first member, largest index first: `sort_by_key(|b| Reverse(b.params[0]))`
    // (`use std::cmp::Reverse;`): the order in which backward starts filling
    // them (with mixed dtypes, not the order in which you closed them).
    todo!("exercise ch05: plan_buckets in src/ch05_bucketing/exercise.rs")
}

/// Averages the gradients of one bucket's parameters over all ranks with a
/// single all-reduce: copy each gradient into its slot of `buffer` (zeros for
/// a parameter without a gradient), all-reduce `buffer` with SUM, divide it
/// by the world size, and copy each slot back into its gradient. On return
/// `buffer` holds the averaged bucket; gradients that were undefined stay so.
#[allow(unused_variables)] // delete this line once you use the arguments
pub fn sync_bucket(
    pg: &dyn ProcessGroup,
    bucket: &Bucket,
    buffer: &mut Tensor,
    params: &[(String, Tensor)],
) -> Result<(), DistError> {
    // TODO: inside `tch::no_grad(|| { ... })`:
    //   1. copy in: walk `bucket.params` with a running `offset` (in elements).
    //      Parameter `params[index].1` owns the slot
    //      `let mut slot = buffer.narrow(0, offset, numel);` (a view: writing
    //      to it writes the buffer). Copy its gradient there, flattened with
    //      `grad.f_reshape([-1])`, by `slot.f_copy_(&flat)`. A parameter whose
    //      `grad()` is not `defined()` gets zeros: `slot.f_zero_()`. So every
    //      rank sends a buffer of the same size, whatever it computed.
    //   2. `pg.all_reduce(buffer, ReduceOp::Sum)?` (`use crate::dist::ReduceOp;`),
    //      then divide `buffer` in place by `pg.world_size()` (`f_div_scalar_`).
    //   3. copy out: walk the slots again; for each parameter whose gradient is
    //      defined (`let mut grad = param.grad();` shares its storage), copy
    //      the slot, shaped like the gradient, into it:
    //      `grad.f_copy_(&slot.f_view_as(&grad)...)`. Leave undefined
    //      gradients undefined.
    // The `f_...` calls return `Result<_, TchError>`; turn their errors into a
    // DistError with `.map_err(crate::dist::torch_error(pg, "what you were doing"))?`.
    todo!("exercise ch05: sync_bucket in src/ch05_bucketing/exercise.rs")
}
// ANCHOR_END: stub
