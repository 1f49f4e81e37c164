//! Chapter 02 exercise: check that every rank holds the same tensors as
//! rank 0, and make every rank fail together if not. This is the file you edit.
//!
//! Check your work: `cargo test --test chapter_02`
//!
//! `replicate` in `mod.rs` wraps a model with your function: it runs it twice,
//! on the model's parameters and on its buffers, after the library has
//! checked that every rank has the same names, shapes and dtypes in the same
//! order.

use tch::Tensor;

use super::InitError;
use crate::dist::ProcessGroup;

// ANCHOR: stub
/// Compares each tensor of `named` with rank 0's copy. Returns
/// [`InitError::ReplicaMismatch`] on every rank, at the first tensor where any
/// rank differs; leaves every tensor unchanged.
#[allow(unused_variables)] // delete this line once you use the arguments
pub fn verify_replicas(pg: &dyn ProcessGroup, named: &[(String, Tensor)]) -> Result<(), InitError> {
    // TODO: for each (name, tensor) in `named`, in order:
    //   1. make a copy, `tensor.detach().copy()`, and broadcast rank 0's values
    //      into it (`pg.broadcast(&mut copy, 0)?`). Do not broadcast into
    //      `tensor` itself: you would overwrite what you want to compare.
    //   2. this rank's verdict: the bits decide, `crate::check::same_bits(tensor, &copy)`
    //      (-0.0 is not +0.0, and a NaN equals an identical NaN), and the
    //      message shows the largest difference, `crate::check::max_abs_diff(tensor, &copy)`.
    //   3. share both: `pg.all_gather(&Tensor::from_slice(&[differs, diff]))?` gives
    //      every rank every rank's pair (read one with `.double_value(&[i])`).
    //   4. if any rank differs, return
    //      `Err(InitError::ReplicaMismatch { parameter, max_abs_diff, differing_ranks })`
    //      with the tensor's name, the largest difference and the ranks that differ.
    // Every rank takes the same decision from the same gathered numbers, so
    // all ranks fail at the same tensor and none waits for a peer that left.
    todo!("exercise ch02: verify_replicas in src/ch02_replicas/exercise.rs")
}
// ANCHOR_END: stub
