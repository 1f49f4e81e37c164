//! Chapter 03 reference solution: average every gradient over all ranks.
//!
//! Run the chapter's tests on it: `cargo test --features solutions --test chapter_03`
//!
//! It divides before the sum, as PyTorch's default DDP communication hook
//! does. The library's `ddp::naive::sync_gradients` (the benchmark's
//! baseline) sums first and divides after, which is exact in f32 and f64
//! but overflows in f16 where this one does not (the chapter weighs both).

use tch::Tensor;

use crate::dist::{tagged, torch_error, DistError, ProcessGroup, ReduceOp};

// ANCHOR: sync_gradients
/// Replaces each parameter's gradient, on every rank, by the mean of that
/// gradient over all ranks, in the gradient's own dtype, half precision
/// included. Parameters without a gradient are skipped.
pub fn sync_gradients(pg: &dyn ProcessGroup, params: &[(String, Tensor)]) -> Result<(), DistError> {
    let world_size = pg.world_size() as f64;
    for (name, param) in params {
        // A handle on the gradient itself (same storage), not a copy: the
        // division and the all-reduce below write straight into it.
        let mut grad = param.grad();
        // No gradient: the parameter took no part in this loss. The model and
        // the loss are the same on every rank, so every rank skips the same
        // parameters and the calls stay paired.
        if !grad.defined() {
            continue;
        }
        // Divide FIRST, then sum: every partial sum of the shares g_r / N
        // stays within the largest |g_r|, so the mean comes out wherever the
        // gradients themselves fit. Summing first would pass through N times
        // that: in f16 (largest value 65504) two gradients of 40000 make an
        // inf. The price: tiny gradients divided by N may round to zero in
        // f16, and in f64 the bits differ from sum-then-divide in the last
        // place (a rounding, far below the tests' tolerance).
        let _ = tch::no_grad(|| grad.f_div_scalar_(world_size))
            .map_err(torch_error(pg, format!("dividing the gradient of `{name}` by the world size")))?;
        // The tag names the call, so that ranks walking their parameters in
        // different orders get an error instead of sums of unrelated gradients.
        tagged(format!("gradient of `{name}`"), || pg.all_reduce(&mut grad, ReduceOp::Sum))?;
    }
    Ok(())
}
// ANCHOR_END: sync_gradients
