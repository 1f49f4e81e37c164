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

use super::group::LocalProcessGroup;
use super::link::SimulatedLink;
use super::scheme::AllReduceScheme;
use super::world::World;
use crate::dist::{timeout_from_env, Group};
use crate::error_text::panic_message;

/// Settings for [`spawn_with`].
#[derive(Clone, Debug)]
pub struct SpawnOptions {
    pub world_size: usize,
    /// How long any call waits for its peers before it fails; `None`: from
    /// `DDP_TIMEOUT_SECS`, else [`DEFAULT_TIMEOUT`](crate::dist::DEFAULT_TIMEOUT).
    timeout: Option<Duration>,
    /// Fault injection for tests: the operating system "refuses" this rank's thread.
    refuse_thread_of_rank: Option<usize>,
    link: Option<SimulatedLink>,
    all_reduce_scheme: AllReduceScheme,
}

impl SpawnOptions {
    /// `world_size` ranks, with the timeout from `DDP_TIMEOUT_SECS` if that
    /// is set (and not empty), else [`DEFAULT_TIMEOUT`](crate::dist::DEFAULT_TIMEOUT). A bad value there
    /// makes [`spawn_with`] return [`SpawnError::InvalidTimeout`], before any
    /// rank starts: a typo should not silently mean the default.
    pub fn new(world_size: usize) -> Self {
        SpawnOptions {
            world_size,
            timeout: None,
            refuse_thread_of_rank: None,
            link: None,
            all_reduce_scheme: AllReduceScheme::Auto,
        }
    }

    /// Every call waits at most `timeout` (which must not be zero).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Every all-reduce takes at least as long as it would on `link` (see
    /// [`SimulatedLink`]): a network on a laptop, to see what overlap hides.
    pub fn link(mut self, link: SimulatedLink) -> Self {
        self.link = Some(link);
        self
    }

    /// Forces the all_reduce's algorithm (`Auto` by default: chosen by size
    /// and rank count); for benchmarks and tests that compare the two.
    pub fn all_reduce_scheme(mut self, scheme: AllReduceScheme) -> Self {
        self.all_reduce_scheme = scheme;
        self
    }

    /// The timeout these options give: the one set with
    /// [`timeout`](Self::timeout), else `DDP_TIMEOUT_SECS`, else the default.
    pub fn resolved_timeout(&self) -> Result<Duration, SpawnError> {
        let invalid = |problem: String| SpawnError::InvalidTimeout(problem);
        match self.timeout {
            Some(timeout) if timeout.is_zero() => Err(invalid(
                "SpawnOptions::timeout(Duration::ZERO) would fail every call at once; pass a \
                             positive duration"
                    .into(),
            )),
            Some(timeout) => Ok(timeout),
            None => timeout_from_env().map_err(invalid),
        }
    }

    /// The meeting place of a group with these options: at least one rank,
    /// a valid timeout, the link and the all_reduce scheme. `spawn_with`
    /// and [`StandingGroup`](super::StandingGroup) both start from it.
    pub(super) fn world(&self) -> Result<Arc<World>, SpawnError> {
        if self.world_size == 0 {
            return Err(SpawnError::NoRanks(self.world_size));
        }
        let timeout = self.resolved_timeout()?;
        Ok(Arc::new(World::new(self.world_size, timeout, self.link, self.all_reduce_scheme)))
    }

    /// For tests of `spawn` itself: pretend that the operating system
    /// refuses to start `rank`'s thread.
    #[doc(hidden)]
    pub fn refuse_thread_of_rank(mut self, rank: usize) -> Self {
        self.refuse_thread_of_rank = Some(rank);
        self
    }
}

/// How one rank failed.
#[derive(Debug)]
pub enum RankFailure {
    Panicked(String),
    Error(anyhow::Error),
}

impl RankFailure {
    /// Runs one rank's work, catching a panic: how `spawn` runs each rank,
    /// for callers that run rank threads themselves. The panic hook has
    /// already run when this returns (it prints the panic unless replaced).
    pub fn catch<T>(work: impl FnOnce() -> anyhow::Result<T>) -> Result<T, RankFailure> {
        match catch_unwind(AssertUnwindSafe(work)) {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => Err(RankFailure::Error(error)),
            Err(payload) => Err(RankFailure::Panicked(panic_message(payload.as_ref()))),
        }
    }
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
    #[error("{0}")]
    InvalidTimeout(String),
    /// The operating system refused to start a rank's thread; the ranks
    /// already started were told at once and have returned.
    #[error(
        "the operating system refused to start rank {rank}'s thread ({reason}); fewer ranks, or \
         fewer other threads and processes, may help"
    )]
    ThreadStart { rank: usize, reason: String },
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
            SpawnError::NoRanks(_) | SpawnError::InvalidTimeout(_) | SpawnError::ThreadStart { .. } => None,
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
///
/// What `spawn` cannot do: stop a thread. A rank that is stuck outside any
/// call of the group (an endless loop, a blocked read) is waited for, even
/// after every peer has failed; its peers' errors name it when their calls
/// time out, but `spawn` returns only once it does. Real processes (a
/// launcher that kills them) do not have this limit.
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
    let world = options.world()?;
    let failures = Mutex::new(Vec::new());
    let (results, refused) = std::thread::scope(|scope| {
        let mut handles = Vec::with_capacity(size);
        let mut refused = None;
        for rank in 0..size {
            let (rank_world, f, failures) = (world.clone(), &f, &failures);
            let started = if options.refuse_thread_of_rank == Some(rank) {
                Err(std::io::Error::other("refused on purpose by SpawnOptions::refuse_thread_of_rank"))
            } else {
                std::thread::Builder::new()
                    .name(format!("rank-{rank}"))
                    .spawn_scoped(scope, move || run_rank(rank, &rank_world, f, failures))
            };
            match started {
                Ok(handle) => handles.push(handle),
                Err(error) => {
                    // The ranks that did start must not wait out the whole
                    // timeout for peers that never come: they leave now.
                    for missing in rank..size {
                        world.leave(missing, format!("was never started: {error}"));
                    }
                    refused = Some((rank, error.to_string()));
                    break;
                }
            }
        }
        let results: Vec<Option<T>> =
            handles.into_iter().map(|h| h.join().expect("rank threads catch their panics")).collect();
        (results, refused)
    });
    if let Some((rank, reason)) = refused {
        return Err(SpawnError::ThreadStart { rank, reason });
    }
    let failures = failures.into_inner().unwrap_or_else(|p| p.into_inner());
    if failures.is_empty() {
        Ok(results.into_iter().map(|r| r.expect("no failure means every rank returned")).collect())
    } else {
        Err(SpawnError::RanksFailed { failures })
    }
}

/// One rank's thread: runs `f`, and records how the rank left the group.
fn run_rank<T, F>(
    rank: usize,
    world: &Arc<World>,
    f: &F,
    failures: &Mutex<Vec<(usize, RankFailure)>>,
) -> Option<T>
where
    F: Fn(Group) -> anyhow::Result<T> + Sync,
{
    let group: Group = Arc::new(LocalProcessGroup::new(rank, world.clone()));
    match RankFailure::catch(|| f(group)) {
        Ok(value) => {
            world.leave(rank, "finished and left the group".into());
            Some(value)
        }
        Err(failure) => {
            let reason = failure.to_string();
            // Record the failure before waking the peers, so that the cause
            // is listed before its consequences.
            failures.lock().unwrap_or_else(|p| p.into_inner()).push((rank, failure));
            world.leave(rank, reason);
            None
        }
    }
}
