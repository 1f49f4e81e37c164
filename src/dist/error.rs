//! The error every process-group call returns: it always says which rank saw
//! it, which call it was, and what to do about it.

use std::time::Duration;

use crate::error_text::cause_in_words;

/// Why a process-group call failed.
#[derive(Debug, thiserror::Error)]
pub enum DistError {
    /// A peer did not join the call in time.
    #[error(
        "rank {rank}: {op} timed out after {waited:?} waiting for rank(s) {missing:?}; {}",
        timeout_hint(op, missing)
    )]
    Timeout { rank: usize, op: String, missing: Vec<usize>, waited: Duration },

    /// A peer this call needs panicked, returned an error, or finished.
    #[error("rank {rank}: {op} cannot complete because rank {peer} {reason}")]
    PeerGone { rank: usize, op: String, peer: usize, reason: String },

    /// The ranks made different calls at the same point of the program.
    #[error("rank {rank}: ranks disagree on {op}: {detail}")]
    Mismatch { rank: usize, op: String, detail: String },

    /// The process's communicator failed (a missed deadline, an error
    /// inside the communication library) and can carry nothing more; the
    /// job must end. Only backends whose calls cannot be taken back (MPI,
    /// NCCL) return it; `cause` is the failure that broke it.
    #[error("rank {rank}: {op}: this process's communicator is broken, the job must end: {cause}")]
    Broken { rank: usize, op: String, cause: String },

    /// The call itself was malformed (a bad rank, an indivisible tensor...).
    #[error("rank {rank}: invalid {op}: {detail}")]
    Invalid { rank: usize, op: String, detail: String },

    /// libtorch rejected an operation inside the call. The message gives
    /// libtorch's cause in one line; `cause` keeps the whole error (with its
    /// C++ stack) for a debugger. It is not the error's `source`, so that
    /// `{:#}` does not print it a second time.
    #[error("rank {rank}: {op} failed in libtorch: {}", cause_in_words(&.cause.to_string()))]
    Torch { rank: usize, op: String, cause: tch::TchError },
}

/// What to check when a call times out: a `recv` waits for one sender, a
/// collective for every rank.
fn timeout_hint(op: &str, missing: &[usize]) -> String {
    match missing {
        [peer] if op.starts_with("recv") => {
            format!("is rank {peer} sending to this rank? (every recv needs a matching send)")
        }
        _ => "every rank must make the same calls in the same order (is one rank skipping this \
              call, or stuck before it?)"
            .to_string(),
    }
}

/// Turns a libtorch error met while doing `op` into a [`DistError`] that
/// names this rank: `tensor.f_div_scalar_(2.0).map_err(torch_error(pg, "halving"))?`.
pub fn torch_error(
    pg: &dyn super::ProcessGroup,
    op: impl Into<String>,
) -> impl FnOnce(tch::TchError) -> DistError {
    let (rank, op) = (pg.rank(), op.into());
    move |cause| DistError::Torch { rank, op, cause }
}
