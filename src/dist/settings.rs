//! What the environment asks of every backend: `DDP_TIMEOUT_SECS`, how long
//! a call waits for its peers, and `DDP_DEBUG`, whether the ranks compare
//! each call's signature before it runs. Read the same way by the
//! in-process, MPI and NCCL backends, and checked before anything starts:
//! a typo must not silently mean the default.

use std::time::Duration;

use super::DEFAULT_TIMEOUT;

/// Whether `DDP_DEBUG` asks for the signature exchange before each call:
/// "detail" turns it on, "off" off, and unset or empty gives the backend's
/// default (on for MPI, where it is cheap; off for NCCL, where it would
/// make the host wait for the GPU at every call).
#[cfg(any(feature = "mpi", feature = "nccl"))]
pub(crate) fn signatures_from_env(on_by_default: bool) -> Result<bool, String> {
    match std::env::var("DDP_DEBUG").as_deref() {
        Err(_) | Ok("") => Ok(on_by_default),
        Ok("detail") | Ok("DETAIL") => Ok(true),
        Ok("off") | Ok("OFF") => Ok(false),
        Ok(other) => {
            let default = if on_by_default { "detail" } else { "off" };
            Err(format!(
                "DDP_DEBUG={other:?} is not one of \"detail\" or \"off\" (here the default is {default})"
            ))
        }
    }
}

/// The timeout `DDP_TIMEOUT_SECS` asks for, or [`DEFAULT_TIMEOUT`] when it is
/// unset or empty; an error that says how to fix a bad value.
pub fn timeout_from_env() -> Result<Duration, String> {
    match std::env::var("DDP_TIMEOUT_SECS") {
        Err(std::env::VarError::NotPresent) => Ok(DEFAULT_TIMEOUT),
        Ok(text) if text.trim().is_empty() => Ok(DEFAULT_TIMEOUT),
        Ok(text) => parse_timeout_secs(&text)
            .map_err(|problem| format!("DDP_TIMEOUT_SECS={text:?}: {problem}; fix it or unset it")),
        Err(std::env::VarError::NotUnicode(text)) => {
            Err(format!("DDP_TIMEOUT_SECS={text:?} is not text; set it to a number of seconds or unset it"))
        }
    }
}

/// Reads a timeout written in seconds, as `DDP_TIMEOUT_SECS` holds it:
/// `"120"` or `" 0.5 "` give a [`Duration`]; `"0"`, `"-3"`, `"inf"`, `"5m"` or
/// an absurdly large number give an error that says what is wrong.
pub fn parse_timeout_secs(text: &str) -> Result<Duration, String> {
    let secs: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds (write it like 120 or 0.5)"))?;
    if !secs.is_finite() || secs <= 0.0 {
        return Err(format!("a timeout must be a positive, finite number of seconds, got {text:?}"));
    }
    Duration::try_from_secs_f64(secs).map_err(|_| format!("{text:?} seconds is too long for a timeout"))
}
