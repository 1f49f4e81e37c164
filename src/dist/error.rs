//! The error every process-group call returns: it always says which rank saw
//! it, which call it was, and what to do about it.

use std::time::Duration;

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

/// A panic message in one line of words. tch's panicking methods unwrap a
/// libtorch error, so the message is `called Result::unwrap() on an Err
/// value: Torch("...")` with libtorch's C++ stack escaped inside; keep the
/// cause, drop the rest.
pub fn panic_in_words(message: &str) -> String {
    match message.split_once("Torch(\"") {
        Some((_, inside)) => {
            let inside = inside.replace("\\n", "\n").replace("\\\"", "\"");
            format!("libtorch: {}", cause_in_words(inside.trim_end_matches("\")")))
        }
        None => message.lines().next().unwrap_or(message).to_string(),
    }
}

/// A caught panic's payload as one line of words (see [`panic_in_words`]).
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    let text = if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        return "(a panic without a message)".to_string();
    };
    // One line: libtorch's C++ stack inside a tch panic says nothing to a user.
    panic_in_words(&text)
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

/// A libtorch or safetensors error message as one line of words: libtorch
/// appends its C++ stack ("Exception raised from ... frame #0 ..."), tch
/// prefixes "Internal torch error: ", and safetensors names its error kinds
/// as code (`MetadataIncompleteBuffer`, `IoError(Os { .. })`).
pub fn cause_in_words(message: &str) -> String {
    let first = message.split("\nException raised from").next().unwrap_or(message);
    let first = first.split("\nframe #").next().unwrap_or(first);
    let first = first.lines().next().unwrap_or("").trim();
    let text = first.trim_start_matches("Internal torch error: ").trim();
    if let Some(start) = text.find("message: \"") {
        // An I/O error inside safetensors: keep its own words.
        let rest = &text[start + "message: \"".len()..];
        let words = rest.split('"').next().unwrap_or(rest);
        let prefix = text.split("IoError").next().unwrap_or("").trim_end_matches([' ', ':']);
        return format!("{prefix}: {}", words.to_lowercase()).trim_start_matches(": ").to_string();
    }
    const NOT_COMPLETE: [&str; 9] = [
        "MetadataIncompleteBuffer",
        "InvalidHeader",
        "HeaderTooLarge",
        "HeaderTooSmall",
        "InvalidHeaderLength",
        "ValidationOverflow",
        "InvalidOffset",
        "TensorInvalidInfo",
        "InvalidTensorView",
    ];
    if let Some(kind) = NOT_COMPLETE.iter().find(|kind| text.contains(*kind)) {
        let prefix = text.split(kind).next().unwrap_or("").trim_end_matches([' ', ':']);
        return format!(
            "{prefix}: not a complete safetensors file (cut short, or not written by this program)"
        )
        .trim_start_matches(": ")
        .to_string();
    }
    // libtorch's words for an operation on an undefined tensor name no
    // cause a learner would recognise; the usual one is a missing gradient.
    if text.contains("does not have a device") || text.contains("undefined Tensor") {
        return format!(
            "{text} (the tensor is undefined: a gradient that was never computed? check \
             `.defined()` before using it)"
        );
    }
    text.to_string()
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
