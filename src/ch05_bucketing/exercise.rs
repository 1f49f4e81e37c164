//! Chapter 05 exercise: plan the buckets, then average one bucket of gradients
//! with a single all-reduce. This is the file you edit.
//!
//! Check your work: `cargo test --test chapter_05`
//!
//! `SimpleDistributedDataParallelism::with_bucket_caps` in `mod.rs` calls
//! `plan_buckets` once, at construction, and the library checks what it
//! returns; `sync_gradients` calls `sync_bucket` once per bucket, in bucket
//! order, with a buffer of `bucket.numel` elements of the bucket's dtype,
//! allocated once.

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
    // TODO: decide, once and before any gradient exists, which gradients
    // travel together. Walk the parameters in the order backward produces
    // their gradients and pack them into buckets by the rules of the doc
    // comment; the chapter works one model through them, step by step.
    // Keep: every parameter in exactly one bucket, and no empty bucket; a
    // bucket holds one dtype on one device, its `params` in the order you
    // added them (their order in the buffer) and its `numel` the sum of
    // theirs; caps and `bytes()` count bytes, `numel` counts elements; the
    // result depends only on `params` and the caps, so that every rank plans
    // the same layout.
    // Yours to decide: the state you keep while walking (how to find the
    // bucket being filled for a dtype and device, how to tell whether the
    // first cap or the normal one applies), and how to bring the buckets
    // into the order the doc comment asks for (with mixed dtypes, the order
    // in which they closed is not it).
    // Available: `Bucket::new(kind, device)`, `Bucket::bytes()`, `ParamMeta::bytes()`.
    // Stuck? `cargo workbook hint 05` gives hints one at a time.
    todo!("exercise ch05: plan_buckets in src/ch05_bucketing/exercise.rs")
}

/// Averages the gradients of one bucket's parameters over all ranks with a
/// single all-reduce of `buffer`, whose slots are the members' gradients,
/// flattened, back to back in the order of `bucket.params`. On return each
/// member's gradient holds its mean over the ranks, in its own shape and bit
/// for bit what the library's per-parameter sync (`ddp::naive`) leaves; a
/// member without a gradient on this rank counts as zeros in the mean and
/// still has no gradient afterwards.
#[allow(unused_variables)] // delete this line once you use the arguments
pub fn sync_bucket(
    pg: &dyn ProcessGroup,
    bucket: &Bucket,
    buffer: &mut Tensor,
    params: &[(String, Tensor)],
) -> Result<(), DistError> {
    // TODO: one collective for the whole bucket, where chapter 3 made one
    // per parameter, with the same result.
    // Keep: the calls pair up across ranks: every rank all-reduces a buffer
    // of the same length, whatever its loss touched; undefined gradients stay
    // undefined; the averages end in the parameters' own gradients; none of
    // it is part of the model (no autograd). The tests compare every weight
    // with a run of `ddp::naive` on 2, 3 and 4 ranks, bit for bit.
    // Yours to decide: how each member finds its slot; what a member without
    // a gradient puts there; where the division by the world size goes and
    // what it divides, so that every element goes through the same
    // arithmetic as in `ddp::naive` (f64 rounding tells the difference on 3
    // ranks); and how you write into a slot and read out of it without
    // copying the whole bucket.
    // Available: `pg.all_reduce` with `crate::dist::ReduceOp`,
    // `pg.world_size()`, `param.grad()`, `Tensor::narrow`, `tch::no_grad`,
    // and `crate::dist::torch_error` for the errors of the fallible `f_...`
    // tensor calls. `f_copy_` returns `Result<(), _>`; the other in-place
    // `f_..._` calls (`f_zero_`, `f_div_scalar_`) return a second handle on
    // the tensor they changed, which Rust asks you to use: `let _ = ...?;`
    // (or `buffer /= n`, which cannot fail).
    todo!("exercise ch05: sync_bucket in src/ch05_bucketing/exercise.rs")
}
// ANCHOR_END: stub
