//! `spawn`: run a closure on every rank of an in-process group, one thread
//! per rank, and collect what each rank returns (compare
//! `torch.multiprocessing.spawn`).
//!
//! ```
//! use ddp_workbook::dist::{spawn, ReduceOp};
//! use ddp_workbook::tch::Tensor;
//!
//! let sums = spawn(3, |pg| {
//!     let mut t = Tensor::from(pg.rank() as f32);
//!     pg.all_reduce(&mut t, ReduceOp::Sum)?;
//!     Ok(t.double_value(&[]))
//! })
//! .unwrap();
//! assert_eq!(sums, vec![3.0, 3.0, 3.0]); // 0 + 1 + 2 on every rank
//! ```

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::local::LocalProcessGroup;
use super::world::World;
use super::{Group, DEFAULT_TIMEOUT};

/// Settings for [`spawn_with`].
#[derive(Clone, Debug)]
pub struct SpawnOptions {
    pub world_size: usize,
    /// How long any call waits for its peers before it fails.
    pub timeout: Duration,
}

impl SpawnOptions {
    /// `world_size` ranks, with the timeout from `DDP_TIMEOUT_SECS` if that
    /// is set (and not empty), else [`DEFAULT_TIMEOUT`].
    ///
    /// # Panics
    /// If `DDP_TIMEOUT_SECS` is set to something other than a positive number
    /// of seconds: a typo there should not silently mean the default.
    pub fn new(world_size: usize) -> Self {
        let timeout = match std::env::var("DDP_TIMEOUT_SECS") {
            Err(std::env::VarError::NotPresent) => DEFAULT_TIMEOUT,
            Ok(text) if text.trim().is_empty() => DEFAULT_TIMEOUT,
            Ok(text) => parse_timeout_secs(&text)
                .unwrap_or_else(|problem| panic!("DDP_TIMEOUT_SECS={text:?}: {problem}; fix it or unset it")),
            Err(std::env::VarError::NotUnicode(text)) => {
                panic!("DDP_TIMEOUT_SECS={text:?} is not text; set it to a number of seconds or unset it")
            }
        };
        SpawnOptions { world_size, timeout }
    }

    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
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

/// How one rank failed.
#[derive(Debug)]
pub enum RankFailure {
    Panicked(String),
    Error(anyhow::Error),
}

impl std::fmt::Display for RankFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RankFailure::Panicked(message) => write!(f, "panicked: {message}"),
            RankFailure::Error(error) => write!(f, "returned an error: {error:#}"),
        }
    }
}

/// Why [`spawn`] did not return every rank's result.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("a process group needs at least one rank, got world_size = {0}")]
    NoRanks(usize),
    /// `failures` holds every rank that failed, in the order they failed:
    /// the first is usually the cause, the others its consequences.
    #[error("rank {} {}{}", failures[0].0, failures[0].1, others(failures))]
    RanksFailed { failures: Vec<(usize, RankFailure)> },
}

fn others(failures: &[(usize, RankFailure)]) -> String {
    if failures.len() < 2 {
        return String::new();
    }
    let ranks: Vec<String> = failures[1..].iter().map(|(rank, _)| rank.to_string()).collect();
    format!(" (then rank {} failed too)", ranks.join(", "))
}

impl SpawnError {
    /// The failure of one rank, if that rank failed.
    pub fn failure_of(&self, rank: usize) -> Option<&RankFailure> {
        match self {
            SpawnError::NoRanks(_) => None,
            SpawnError::RanksFailed { failures } => {
                failures.iter().find(|(r, _)| *r == rank).map(|(_, failure)| failure)
            }
        }
    }
}

/// Runs `f` on `world_size` ranks of a fresh in-process group and returns
/// each rank's result in rank order. If any rank panics or returns an error,
/// the other ranks' calls fail promptly and `spawn` returns a [`SpawnError`]
/// that names the first rank to fail.
pub fn spawn<T, F>(world_size: usize, f: F) -> Result<Vec<T>, SpawnError>
where
    T: Send,
    F: Fn(Group) -> anyhow::Result<T> + Sync,
{
    spawn_with(SpawnOptions::new(world_size), f)
}

/// [`spawn`] with explicit [`SpawnOptions`].
pub fn spawn_with<T, F>(options: SpawnOptions, f: F) -> Result<Vec<T>, SpawnError>
where
    T: Send,
    F: Fn(Group) -> anyhow::Result<T> + Sync,
{
    let size = options.world_size;
    if size == 0 {
        return Err(SpawnError::NoRanks(size));
    }
    let world = Arc::new(World::new(size, options.timeout, String::new()));
    let failures = Mutex::new(Vec::new());
    let results: Vec<Option<T>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..size)
            .map(|rank| {
                let (world, f, failures) = (world.clone(), &f, &failures);
                std::thread::Builder::new()
                    .name(format!("rank-{rank}"))
                    .spawn_scoped(scope, move || {
                        let group: Group = Arc::new(LocalProcessGroup::new(rank, world.clone()));
                        let outcome = match catch_unwind(AssertUnwindSafe(|| f(group))) {
                            Ok(Ok(value)) => Ok(value),
                            Ok(Err(error)) => Err(RankFailure::Error(error)),
                            Err(payload) => Err(RankFailure::Panicked(panic_message(payload.as_ref()))),
                        };
                        match outcome {
                            Ok(value) => {
                                world.leave(rank, "finished and left the group".into());
                                Some(value)
                            }
                            Err(failure) => {
                                let reason = failure.to_string();
                                // Record the failure before waking the peers, so that
                                // the cause is listed before its consequences.
                                failures.lock().unwrap_or_else(|p| p.into_inner()).push((rank, failure));
                                world.leave(rank, reason);
                                None
                            }
                        }
                    })
                    .expect("the operating system refused to start a rank thread")
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("rank threads catch their panics")).collect()
    });
    let failures = failures.into_inner().unwrap_or_else(|p| p.into_inner());
    if failures.is_empty() {
        Ok(results.into_iter().map(|r| r.expect("no failure means every rank returned")).collect())
    } else {
        Err(SpawnError::RanksFailed { failures })
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(a panic without a message)".to_string()
    }
}
