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
    // TODO: for each tensor of `named`, in order, find out whether any rank
    // holds other bits than rank 0, and if one does, stop every rank with the
    // same error. A rank sees only its own tensor, so rank 0's values have to
    // reach it first; and no rank may decide alone: a rank that returns an
    // error while its peers go on to the next tensor leaves them waiting in a
    // collective it will never join.
    // Keep: every tensor of `named` unchanged; the bits decide (-0.0 is not
    // +0.0, and a NaN equals an identical NaN), while the error reports the
    // largest absolute difference; every rank makes the same collective calls
    // in the same order and returns the same `InitError::ReplicaMismatch`, at
    // the same tensor, naming every rank that differs.
    // Yours to decide: which collective lets every rank take that same
    // decision, and what each rank contributes to it.
    // Available: `pg.broadcast`, `pg.all_gather`, `pg.all_reduce`,
    // `crate::check::same_bits`, `crate::check::max_abs_diff`.
    // Stuck? `cargo workbook hint 02` gives hints one at a time.
    todo!("exercise ch02: verify_replicas in src/ch02_replicas/exercise.rs")
}
// ANCHOR_END: stub
