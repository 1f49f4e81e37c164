//! The error every process-group call returns: it always says which rank saw
//! it, which call it was, and what to do about it.

use std::time::Duration;

/// Why a process-group call failed.
#[derive(Debug, thiserror::Error)]
pub enum DistError {
    /// A peer did not join the call in time.
    #[error(
        "rank {rank}: {op} timed out after {waited:?} waiting for rank(s) {missing:?}; \
         every rank must make the same calls in the same order (is one rank \
         skipping this call, or stuck before it?)"
    )]
    Timeout { rank: usize, op: String, missing: Vec<usize>, waited: Duration },

    /// A peer this call needs panicked, returned an error, or finished.
    #[error("rank {rank}: {op} cannot complete because rank {peer} {reason}")]
    PeerGone { rank: usize, op: String, peer: usize, reason: String },

    /// The ranks made different calls at the same point of the program.
    #[error("rank {rank}: ranks disagree on {op}: {detail}")]
    Mismatch { rank: usize, op: String, detail: String },

    /// The call itself was malformed (a bad rank, an indivisible tensor...).
    #[error("rank {rank}: invalid {op}: {detail}")]
    Invalid { rank: usize, op: String, detail: String },

    /// libtorch rejected an operation inside the call.
    #[error("rank {rank}: {op} failed in libtorch: {source}")]
    Torch {
        rank: usize,
        op: String,
        #[source]
        source: tch::TchError,
    },
}

/// Turns a libtorch error met while doing `op` into a [`DistError`] that
/// names this rank: `tensor.f_div_scalar_(2.0).map_err(torch_error(pg, "halving"))?`.
pub fn torch_error(
    pg: &dyn super::ProcessGroup,
    op: impl Into<String>,
) -> impl FnOnce(tch::TchError) -> DistError {
    let (rank, op) = (pg.rank(), op.into());
    move |source| DistError::Torch { rank, op, source }
}
