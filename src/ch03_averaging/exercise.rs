//! Chapter 03 exercise: average every gradient over all ranks. This is the
//! file you edit.
//!
//! Check your work: `cargo test --test chapter_03`
//!
//! `NaiveDdp::sync_gradients` in `mod.rs` calls your
//! function with the model's parameters, on every rank, after
//! `loss.backward()` and before `optimizer.step()`.

use tch::Tensor;

use crate::dist::{DistError, ProcessGroup};

// ANCHOR: stub
/// Replaces each parameter's gradient, on every rank, by the mean of that
/// gradient over all ranks. Parameters without a gradient are skipped.
#[allow(unused_variables)] // delete this line once you use the arguments
pub fn sync_gradients(pg: &dyn ProcessGroup, params: &[(String, Tensor)]) -> Result<(), DistError> {
    // TODO: for each (name, param) in `params`, in order:
    //   1. take a handle on its gradient: `let mut grad = param.grad();`
    //      (it shares storage with the gradient, so writing to it updates it);
    //   2. if `!grad.defined()`, the parameter has no gradient: skip it;
    //   3. sum it over all ranks: `pg.all_reduce(&mut grad, ReduceOp::Sum)?`
    //      (`use crate::dist::ReduceOp;`);
    //   4. divide it by `pg.world_size()` in place, under `tch::no_grad(|| ...)`:
    //      `let _ = grad.f_div_scalar_(n).map_err(torch_error(pg, "dividing"))?;`
    //      (`use crate::dist::torch_error;` turns libtorch's error into a DistError).
    todo!("exercise ch03: sync_gradients in src/ch03_averaging/exercise.rs")
}
// ANCHOR_END: stub
