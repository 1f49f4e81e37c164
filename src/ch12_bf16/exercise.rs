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
    // Keep (the tests check each): one all-reduce per bucket, of a bf16
    // tensor of the bucket's length (they count the bytes); none of it part
    // of the model (no autograd). Timing: the wrapper calls you during
    // backward and waits on your Work after it, so `buffer` must keep its
    // values until that wait, and hold the mean after it. The all-reduce's
    // tensor has no defined value until ITS Work has been waited on (a
    // real backend may still be sending it), and must not be written
    // before: the tests run your hook under a group that fills it with NaN
    // until then.
    // Yours to decide: where the division by the world size goes, and in
    // which dtype it happens (bf16 keeps 8 significant bits: every operation
    // done in bf16 is one more rounding); which tensor the all-reduce fills,
    // and how its result gets back into `buffer` once it has arrived.
    // Tools: `pg.all_reduce_async` with `crate::dist::ReduceOp`,
    // `pg.world_size()`, `Tensor::f_to_kind` with `tch::Kind::BFloat16`,
    // `Tensor::f_div_scalar`, `Tensor::f_copy_` (converts dtypes),
    // `tch::no_grad`, and:
    // - `Work::new(move || { ...; Ok(()) })`: a Work that runs your closure
    //   when it is waited on, after this function has returned. So the
    //   closure cannot borrow `buffer` or `pg`; what it uses moves into it.
    //   Inside, `other_work.wait()?` works as it is (it returns DistError).
    // - `buffer.shallow_clone()`: a second handle on the bucket's storage,
    //   no copy, which a closure can own: writing through it writes the
    //   bucket. (`buffer.copy()` is new memory: writing it leaves the
    //   bucket as it was.)
    // - `crate::dist::torch_error(pg, "what was being done")`: a converter
    //   from tch's error to `DistError` that carries the rank and your
    //   words; `.map_err(torch_error(pg, "..."))` on an `f_...` call gives a
    //   `DistError` for `?`. It owns what it needs, so a converter made
    //   before the closure can move into it, where `pg` cannot. One
    //   converter per `map_err` (it is used up).
    // Stuck? `cargo workbook hint 12` gives hints one at a time.
    todo!("exercise ch12: bf16_compress_hook in src/ch12_bf16/exercise.rs")
}
// ANCHOR_END: stub
