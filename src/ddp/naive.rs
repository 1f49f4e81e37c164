//! Spoiler: this file holds a reference answer to chapter 3's exercise,
//! `sync_gradients` (`src/ch03_averaging/exercise.rs`), in the order sum,
//! then divide. Working through the book? Write yours first; the book shows
//! the parts of this file you need, and the answer on the solution page.
//!
//! The naive gradient sync: one all-reduce per parameter, SUM then divide by
//! the world size. Chapter 3 of the book builds it. The finished wrapper
//! sends buckets instead (the Reducer, `reducer/`); this one stays as the baseline the
//! benchmark compares against (`cargo run --release --example bench_sync`).

use tch::Tensor;

use crate::dist::{tagged, torch_error, DistError, ProcessGroup, ReduceOp};

// ANCHOR: sync_gradients
/// Replaces each parameter's gradient, on every rank, by the mean of that
/// gradient over all ranks. Parameters without a gradient are skipped.
pub fn sync_gradients(pg: &dyn ProcessGroup, params: &[(String, Tensor)]) -> Result<(), DistError> {
    let world_size = pg.world_size() as f64;
    for (name, param) in params {
        // A handle on the gradient itself (same storage), not a copy: the
        // all-reduce below writes the result straight into it.
        let mut grad = param.grad();
        // No gradient: the parameter took no part in this loss. The model and
        // the loss are the same on every rank, so every rank skips the same
        // parameters and the calls stay paired. (A parameter used on some
        // ranks only would break that pairing: chapter 5 deals with it.)
        if !grad.defined() {
            continue;
        }
        // SUM, then divide: the sum over ranks is the gradient of the sum of
        // the per-rank losses; dividing by N turns it into the gradient of
        // their mean. ReduceOp::Avg would do both in one call and give the
        // same numbers; we keep the two steps visible, and SUM is the
        // reduction every backend offers (torch.distributed has AVG only on
        // NCCL).
        // The tag names the call, so that ranks walking their parameters in
        // different orders get an error instead of sums of unrelated gradients.
        tagged(format!("gradient of `{name}`"), || pg.all_reduce(&mut grad, ReduceOp::Sum))?;
        // In place; the returned handle on `grad` is not needed.
        let _ = tch::no_grad(|| grad.f_div_scalar_(world_size))
            .map_err(torch_error(pg, format!("dividing the gradient of `{name}` by the world size")))?;
    }
    Ok(())
}
// ANCHOR_END: sync_gradients
