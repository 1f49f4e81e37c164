//! How a notebook run that went wrong is reported: the [`RanksFailed`] error
//! that `on_ranks` and `on_some_ranks` return, and the text printed under the
//! cell (each rank's output under its heading, then the failures). Part of
//! `src/notebook.rs`; tested by `cargo test --lib notebook` (its private
//! parts) and `cargo test --test notebook`.

use std::fmt;

use crate::dist::RankFailure;

/// Why [`on_ranks`](super::on_ranks) or [`on_some_ranks`](super::on_some_ranks)
/// did not return every rank's value.
#[derive(Debug)]
pub enum RanksFailed {
    /// The call itself was wrong (no ranks, a rank number out of range...).
    Invalid(String),
    /// Some ranks panicked or returned an error.
    Ranks {
        /// Every rank that failed, in the order they failed: the first is
        /// usually the cause, the others its consequences.
        failures: Vec<(usize, RankFailure)>,
        /// Where each failed rank panicked (`file:line:column`), if it did.
        panic_locations: Vec<(usize, String)>,
        /// The ranks that skipped the closure
        /// ([`on_some_ranks`](super::on_some_ranks)).
        skipped: Vec<usize>,
    },
}

impl RanksFailed {
    /// The rank that failed first: usually the cause.
    pub fn first_failed_rank(&self) -> Option<usize> {
        match self {
            RanksFailed::Invalid(_) => None,
            RanksFailed::Ranks { failures, .. } => failures.first().map(|(rank, _)| *rank),
        }
    }

    /// How `rank` failed, if it did.
    pub fn failure_of(&self, rank: usize) -> Option<&RankFailure> {
        match self {
            RanksFailed::Invalid(_) => None,
            RanksFailed::Ranks { failures, .. } => {
                failures.iter().find(|(r, _)| *r == rank).map(|(_, failure)| failure)
            }
        }
    }

    /// The error `rank` returned, for `downcast_ref::<InitError>()` and the
    /// like; `None` if it did not fail or panicked instead.
    pub fn error_of(&self, rank: usize) -> Option<&anyhow::Error> {
        match self.failure_of(rank)? {
            RankFailure::Error(error) => Some(error),
            RankFailure::Panicked(_) => None,
        }
    }
}

impl fmt::Display for RanksFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (failures, panic_locations, skipped) = match self {
            RanksFailed::Invalid(problem) => return write!(f, "{problem}"),
            RanksFailed::Ranks { failures, panic_locations, skipped } => (failures, panic_locations, skipped),
        };
        let count = failures.len();
        write!(
            f,
            "{count} rank(s) failed; the first to fail is usually the cause, the others its consequences:"
        )?;
        // Ranks often fail with the very same message (every rank of a failed
        // check, or a todo! that every rank reaches): print it once.
        let mut shown: Vec<(usize, String)> = Vec::new();
        for (i, (rank, failure)) in failures.iter().enumerate() {
            let order = if i == 0 { "first" } else { "then" };
            let what = match failure {
                RankFailure::Panicked(message) => match panic_locations.iter().find(|(r, _)| r == rank) {
                    Some((_, place)) => format!("panicked: {message} (in {place})"),
                    None => format!("panicked: {message}"),
                },
                RankFailure::Error(error) => format!("returned an error: {error:#}"),
            };
            match shown.iter().find(|(_, text)| *text == what) {
                Some((same_as, _)) => {
                    write!(f, "\n  {order}: rank {rank} failed the same way as rank {same_as}")?
                }
                None => write!(f, "\n  {order}: rank {rank} {what}")?,
            }
            shown.push((*rank, what));
        }
        if !skipped.is_empty() {
            write!(
                f,
                "\n  note: rank(s) {skipped:?} skipped this closure, so any collective in it could not \
                 complete: every rank of a group must make the same calls in the same order. In a \
                 real job the other ranks would wait for them forever; here they get an error instead."
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for RanksFailed {}

/// The text printed under the cell: each rank's heading and output, then
/// the failures. A rank that wrote nothing, and neither failed nor skipped,
/// gets no heading, so that a run with nothing to say prints nothing.
pub(super) fn report(texts: &[String], skipped: &[usize], failed: Option<&RanksFailed>) -> String {
    let mut text = String::new();
    for (rank, output) in texts.iter().enumerate() {
        let status = if skipped.contains(&rank) {
            " (skipped this closure)"
        } else if failed.and_then(|f| f.failure_of(rank)).is_some() {
            " (failed)"
        } else if output.is_empty() {
            continue;
        } else {
            ""
        };
        text.push_str(&format!("── Rank {rank}{status} ──\n"));
        text.push_str(output);
        if !output.is_empty() && !output.ends_with('\n') {
            text.push('\n');
        }
    }
    if let Some(failed) = failed {
        text.push_str(&format!("✗ {failed}\n"));
    }
    text
}
