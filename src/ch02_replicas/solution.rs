//! Chapter 02 reference solution: check that every rank holds the same
//! tensors as rank 0, and make every rank fail together if not.
//!
//! Run the chapter's tests on it: `cargo test --features solutions --test chapter_02`

use tch::Tensor;

use super::InitError;
use crate::check::max_abs_diff;
use crate::dist::ProcessGroup;

// ANCHOR: verify_replicas
/// Compares each tensor of `named` with rank 0's copy. Returns
/// [`InitError::ReplicaMismatch`] on every rank, at the first tensor where any
/// rank differs; leaves every tensor unchanged.
pub fn verify_replicas(pg: &dyn ProcessGroup, named: &[(String, Tensor)]) -> Result<(), InitError> {
    for (name, tensor) in named {
        // Receive rank 0's values into a copy: overwriting our own tensor
        // first would make every comparison pass (and change the model).
        let mut rank0_copy = tensor.detach().copy();
        pg.broadcast(&mut rank0_copy, 0)?;
        let my_diff = max_abs_diff(tensor, &rank0_copy);

        // One rank alone must not decide: if rank 1 returned an error while
        // rank 2 went on to the next tensor, rank 2 would wait for a peer
        // that never comes. So every rank learns every rank's difference and
        // all of them take the same decision.
        let diffs = pg.all_gather(&Tensor::from(my_diff))?; // world_size x []
        let diffs: Vec<f64> = diffs.iter().map(|d| d.double_value(&[])).collect();
        let differing_ranks: Vec<usize> = (0..diffs.len()).filter(|&r| diffs[r] != 0.0).collect();
        if !differing_ranks.is_empty() {
            // The largest difference; NaN (a NaN weight) wins so that it shows.
            let largest =
                diffs
                    .iter()
                    .fold(0.0_f64, |a, &d| if a.is_nan() || d.is_nan() { f64::NAN } else { a.max(d) });
            return Err(InitError::ReplicaMismatch {
                parameter: name.clone(),
                max_abs_diff: largest,
                differing_ranks,
            });
        }
    }
    Ok(())
}
// ANCHOR_END: verify_replicas
