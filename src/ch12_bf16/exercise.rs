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
    // The contract (the tests check each): one all-reduce per bucket, of a
    // bf16 tensor of the bucket's length (they count the bytes); none of it
    // part of the model (no autograd); bitwise the same result on every
    // rank; no rounding to bf16 that the wire does not need (they compare
    // the bits with the orders that have none).
    // Timing: the wrapper calls you during backward and waits on your Work
    // after it, so `buffer` must keep its values until that wait, and hold
    // the mean after it. The all-reduce's tensor has no defined value until
    // ITS Work has been waited on (a real backend may still be sending it),
    // and must not be written before: the tests run your hook under a group
    // that fills it with NaN until then.
    // Yours to decide:
    // - what to cast: which tensor travels, and what becomes of `buffer`
    //   meanwhile;
    // - when to divide by the world size, and in which dtype (every
    //   operation done in bf16 is one more rounding to 8 significant bits);
    // - what to wait on, and where: what must have happened before the
    //   mean is in `buffer`, when this function has already returned (the
    //   Work you return runs code of yours at the wrapper's wait; the
    //   chapter's "When the hook may touch what" shows how it owns what
    //   it needs).
    // Stuck? `cargo workbook hint 12` gives hints one at a time.
    todo!("exercise ch12: bf16_compress_hook in src/ch12_bf16/exercise.rs")
}
// ANCHOR_END: stub
