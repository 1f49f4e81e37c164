//! Chapter 12 exercise: average one bucket over the ranks with an
//! all-reduce that carries bfloat16. This is the file you edit.
//!
//! Check your work: `cargo test --test chapter_12`
//!
//! `with_bf16_gradients` in `mod.rs` registers your hook on the library's
//! wrapper: during backward, as soon as a bucket is complete, the wrapper
//! calls it with the bucket's flat buffer and keeps the `Work` it returns;
//! after backward it waits on each, and the optimizer then reads the
//! gradients where they lie, in that buffer. The library does not divide
//! after a hook: the average is yours.

use tch::Tensor;

use crate::dist::{DistError, ProcessGroup, Work};

// ANCHOR: stub
/// Starts averaging one bucket over the ranks with an all-reduce that
/// carries bfloat16, half the bytes of float32. `buffer` is the bucket's
/// flat gradients in their own dtype (f32 or f64). When the returned
/// [`Work`] is waited on, `buffer` holds their mean over the ranks, in its
/// own dtype, bitwise the same on every rank, with no more roundings to
/// bf16's 8 significant bits than the all-reduce itself needs: each rank's
/// contribution is rounded once, and the sum's partial sums once each.
#[allow(unused_variables)] // delete this line once you use the arguments
pub fn bf16_compress_hook(pg: &dyn ProcessGroup, buffer: &Tensor) -> Result<Work, DistError> {
    // TODO: the bucket leaves as bf16 and comes back as the mean, in the
    // bucket's own dtype.
    // Keep: one all-reduce per bucket, of a bf16 tensor of the bucket's
    // length (the tests count the bytes); the buffer holds the mean only
    // after the Work you return has been waited on, and its values must not
    // change before (the wrapper calls you during backward); none of it is
    // part of the model (no autograd).
    // Yours to decide: where the division by the world size goes, and in
    // which dtype it happens (bf16 keeps 8 significant bits: every operation
    // done in bf16 is one more rounding); which tensor the all-reduce fills,
    // and how its result gets back into `buffer` once it has arrived.
    // Available: `pg.all_reduce_async` with `crate::dist::ReduceOp`,
    // `pg.world_size()`, `Tensor::f_to_kind` with `tch::Kind::BFloat16`,
    // `Tensor::f_div_scalar`, `Tensor::f_copy_`, `tch::no_grad`,
    // `Work::new(move || { ...; Ok(()) })` (a `Work` that runs your closure
    // when waited on; tch tensors can move into it), and
    // `crate::dist::torch_error` for the errors of the `f_...` calls.
    // Stuck? `cargo workbook hint 12` gives hints one at a time.
    todo!("exercise ch12: bf16_compress_hook in src/ch12_bf16/exercise.rs")
}
// ANCHOR_END: stub
