//! Chapter 03 exercise: average every gradient over all ranks. This is the
//! file you edit.
//!
//! Check your work: `cargo test --test chapter_03`
//!
//! `SimpleDistributedDataParallelism::sync_gradients` in `mod.rs` calls your
//! function with the model's parameters, on every rank, after
//! `loss.backward()` and before `optimizer.step()`.

use tch::Tensor;

use crate::dist::{DistError, ProcessGroup};

// ANCHOR: stub
/// Replaces each parameter's gradient, on every rank, by the mean of that
/// gradient over all ranks, in the gradient's own dtype, half precision
/// included. Parameters without a gradient are skipped.
#[allow(unused_variables)] // delete this line once you use the arguments
pub fn sync_gradients(pg: &dyn ProcessGroup, params: &[(String, Tensor)]) -> Result<(), DistError> {
    // TODO: after backward, each rank's gradients are those of its own shard.
    // Replace every one by its mean over all ranks: the optimizer reads
    // `.grad`, so every rank then takes the same step, the one a single
    // process would take on the whole batch (the chapter shows why the mean
    // is exact).
    // Keep: every rank makes the same calls for the same parameters in the
    // same order, one collective per parameter that has a gradient (the tests
    // count them); an f16 gradient averages to its mean even where the sum
    // over the ranks would not fit in f16 (the tests try one).
    // Yours to decide: how the mean is formed (where the division by the
    // world size goes, and in which dtype the adding happens: the chapter
    // weighs the options, and each has a price), how the result gets into
    // the gradient the optimizer reads, and how you recognise a parameter
    // without a gradient.
    // Available: `param.grad()`, `pg.all_reduce` with `crate::dist::ReduceOp`,
    // `pg.world_size()`, `tch::no_grad`, and `crate::dist::torch_error`, which
    // turns a libtorch error into a `DistError` that names the rank.
    // In place: `grad /= n` divides and cannot fail; tch's fallible `f_...`
    // versions return a second handle on the tensor they changed, which Rust
    // asks you to use, so write `let _ = grad.f_div_scalar_(n).map_err(..)?;`.
    // Stuck? `cargo workbook hint 03` gives hints one at a time.
    todo!("exercise ch03: sync_gradients in src/ch03_averaging/exercise.rs")
}
// ANCHOR_END: stub
