//! The training run's proof that DDP did its job, before every checkpoint
//! and after the last step. Every rank fingerprints the state a checkpoint
//! of it would hold (weights, optimizer state, progress, settings), the
//! ranks all-gather the fingerprints, and the run fails on every rank
//! unless all are equal: a DDP that skipped a gradient sync would still
//! learn on rank 0, but its replicas would have drifted apart, and a
//! checkpoint of rank 0's state would let a restart resume every rank from
//! it as if they had agreed.

use tch::Tensor;

use crate::dist::ProcessGroup;

/// The replicas ended in different states. Every rank gets the same error.
#[derive(Debug, thiserror::Error)]
#[error(
    "the replicas differ after step {step}: the fingerprints of their states are {}. DDP keeps \
     every replica bitwise equal when each gradient is averaged over all ranks before every \
     optimizer step: a gradient sync was skipped, or a rank changed its model or optimizer alone. \
     No checkpoint of this state was written; a restart resumes from the last one the replicas \
     agreed on",
    in_hex(.fingerprints)
)]
pub struct ReplicasDiffer {
    pub step: usize,
    /// Rank r's fingerprint at index r.
    pub fingerprints: Vec<i64>,
}

/// `rank 0 0x…, rank 1 0x…`.
fn in_hex(fingerprints: &[i64]) -> String {
    let each = fingerprints.iter().enumerate().map(|(rank, f)| format!("rank {rank} {f:#018x}"));
    each.collect::<Vec<_>>().join(", ")
}

/// Gathers every rank's `fingerprint` (of its state after `step`) and
/// returns it if all ranks hold the same; otherwise [`ReplicasDiffer`],
/// on every rank alike, so no rank goes on alone.
pub fn check_replicas_agree(pg: &dyn ProcessGroup, fingerprint: i64, step: usize) -> anyhow::Result<i64> {
    let gathered = pg.all_gather(&Tensor::from_slice(&[fingerprint]))?;
    let fingerprints: Vec<i64> = gathered.iter().map(|t| t.int64_value(&[0])).collect();
    if fingerprints.iter().all(|&f| f == fingerprints[0]) {
        Ok(fingerprints[0])
    } else {
        Err(ReplicasDiffer { step, fingerprints }.into())
    }
}
