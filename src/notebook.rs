//! Helpers for the evcxr notebooks in `notebooks/`: a [`World`] of rank
//! threads started once, that runs cell after cell and keeps what each rank
//! computed (`world.rs`, `rank.rs`); run a closure on every rank of a group
//! made for one cell and show what each rank wrote under its own `Rank N`
//! heading, in rank order; run a closure on some ranks only, to see what a
//! skipped collective does; time a piece of code. notebooks/README.md shows
//! how a notebook uses them. Checked by `cargo test --test notebook_world`,
//! `cargo test --test notebook`, `cargo test --lib notebook` (the private
//! parts) and `cargo test --doc notebook`.
//!
//! ```
//! use ddp_workbook::dist::ReduceOp;
//! use ddp_workbook::notebook::on_ranks;
//! use ddp_workbook::tch::Tensor;
//!
//! let sums = on_ranks(3, |pg, out| {
//!     let mut t = Tensor::from(pg.rank() as f64); // rank r holds r
//!     pg.all_reduce(&mut t, ReduceOp::Sum)?;
//!     writeln!(out, "after all_reduce: {}", t.double_value(&[]))?;
//!     Ok(t.double_value(&[]))
//! })?;
//! assert_eq!(sums, vec![3.0; 3]); // printed: `── Rank 0 ──`, its line, `── Rank 1 ──`, ...
//! # Ok::<(), anyhow::Error>(())
//! ```
//!
//! Why not `println!` inside the closure: the ranks are threads running at
//! the same time, so their lines would interleave in whatever order the
//! threads happen to run. Each rank writes into its own buffer instead, and
//! the buffers are printed once every rank has finished, also when a rank
//! failed (then the failure is printed after them).
//!
//! A rank that panics (an exercise still at `todo!()`) is reported like a
//! rank that returned an error, and its panic message is kept off stderr:
//! the notebook runner treats `panicked at` on stderr as a failed notebook,
//! and a failure shown on purpose must not count as one.

use std::fmt;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::dist::{spawn_with, Group, SpawnError, SpawnOptions};
use quiet::{last_panic_place, lock, quietly};

// Panics of rank closures kept off stderr, and the lock on what ranks share.
mod quiet;
// What a World's closure gets on each rank: its group, output and kept values.
mod rank;
// The error these helpers return, and the text printed under the cell.
mod report;
#[cfg(test)]
mod tests;
// Rank threads that live across cells, with what each rank keeps.
mod world;

pub use rank::{Found, Keepable, KeptError, Rank, RankOut};
pub use report::RanksFailed;
pub use world::{RankStatus, World, WorldStatus};

/// The `anyhow` this crate was built with, for a notebook's own functions
/// (`fn f() -> anyhow::Result<()>` after `use ddp_workbook::notebook::anyhow;`):
/// a notebook depends on this crate only, never on a second, drifting copy.
pub use anyhow;

/// Where one rank writes what the notebook shows under its `Rank N` heading:
/// `writeln!(out, "loss {loss:.4}")?` (no `use` needed).
pub struct RankOutput<'a> {
    rank: usize,
    buffer: &'a Mutex<String>,
}

impl RankOutput<'_> {
    /// The rank this output belongs to.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// What `write!` and `writeln!` call. An inherent method, so a notebook
    /// needs no `use std::fmt::Write` to write into a `RankOutput`.
    pub fn write_fmt(&mut self, args: fmt::Arguments<'_>) -> fmt::Result {
        fmt::Write::write_fmt(&mut *lock(self.buffer), args)
    }
}

impl fmt::Write for RankOutput<'_> {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        lock(self.buffer).push_str(text);
        Ok(())
    }
}

/// Runs `f` on every rank of a fresh in-process group of `world_size` ranks
/// (see [`crate::dist::spawn`]), prints what each rank wrote into its
/// [`RankOutput`] under a `── Rank N ──` heading in rank order, then the
/// failures if any rank failed, and returns each rank's value in rank order.
pub fn on_ranks<T, F>(world_size: usize, f: F) -> Result<Vec<T>, RanksFailed>
where
    T: Send,
    F: Fn(Group, &mut RankOutput<'_>) -> anyhow::Result<T> + Sync,
{
    on_ranks_with(SpawnOptions::new(world_size), f)
}

/// [`on_ranks`] with explicit options, e.g. a shorter timeout:
/// `on_ranks_with(SpawnOptions::new(2).timeout(Duration::from_secs(2)), f)`.
pub fn on_ranks_with<T, F>(options: SpawnOptions, f: F) -> Result<Vec<T>, RanksFailed>
where
    T: Send,
    F: Fn(Group, &mut RankOutput<'_>) -> anyhow::Result<T> + Sync,
{
    let values = run(options, None, f)?;
    Ok(values.into_iter().map(|value| value.expect("without `only`, every rank runs f")).collect())
}

/// Runs `f` only on the ranks listed in `ranks`; the other ranks of the
/// world skip it and leave the group at once. Values come back in rank
/// order, `None` for a rank that skipped. A collective inside `f` then
/// cannot complete, and fails with an error that names a skipping rank:
/// the deadlock of a real job, turned into an error.
pub fn on_some_ranks<T, F>(world_size: usize, ranks: &[usize], f: F) -> Result<Vec<Option<T>>, RanksFailed>
where
    T: Send,
    F: Fn(Group, &mut RankOutput<'_>) -> anyhow::Result<T> + Sync,
{
    run(SpawnOptions::new(world_size), Some(ranks), f)
}

/// Runs `f` `runs` times and returns the median wall-clock time of one run:
/// steadier than a single measurement on a busy machine. Run it once more
/// beforehand if the first call does extra work (allocations, caches).
pub fn median_time(runs: usize, mut f: impl FnMut()) -> Duration {
    assert!(runs > 0, "median_time needs at least one run, got runs = 0");
    let times: Vec<Duration> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed()
        })
        .collect();
    median(times)
}

/// The middle value (the upper of the two middle ones for an even count).
fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn run<T, F>(options: SpawnOptions, only: Option<&[usize]>, f: F) -> Result<Vec<Option<T>>, RanksFailed>
where
    T: Send,
    F: Fn(Group, &mut RankOutput<'_>) -> anyhow::Result<T> + Sync,
{
    check_arguments(options.world_size, only)?;
    let (texts, skipped, result) = run_collecting_output(options, only, f);
    print!("{}", report::report(&texts, &skipped, result.as_ref().err()));
    result
}

/// Runs the ranks; returns what each rank wrote, which ranks skipped, and
/// the values or the failures.
#[allow(clippy::type_complexity)]
fn run_collecting_output<T, F>(
    options: SpawnOptions,
    only: Option<&[usize]>,
    f: F,
) -> (Vec<String>, Vec<usize>, Result<Vec<Option<T>>, RanksFailed>)
where
    T: Send,
    F: Fn(Group, &mut RankOutput<'_>) -> anyhow::Result<T> + Sync,
{
    let world_size = options.world_size;
    let buffers: Vec<Mutex<String>> = (0..world_size).map(|_| Mutex::new(String::new())).collect();
    let panic_locations: Mutex<Vec<(usize, String)>> = Mutex::new(Vec::new());
    let runs_here = |rank: usize| only.is_none_or(|ranks| ranks.contains(&rank));

    let outcome = spawn_with(options, |pg| {
        let rank = pg.rank();
        if !runs_here(rank) {
            return Ok(None); // this rank skips the closure and leaves the group
        }
        let mut out = RankOutput { rank, buffer: &buffers[rank] };
        let result = quietly(|| catch_unwind(AssertUnwindSafe(|| f(pg, &mut out))));
        match result {
            Ok(value) => value.map(Some),
            Err(payload) => {
                if let Some(place) = last_panic_place() {
                    panic_locations.lock().unwrap_or_else(|p| p.into_inner()).push((rank, place));
                }
                // On to spawn, which reports it as this rank's panic. resume_unwind
                // does not call the panic hook again.
                resume_unwind(payload)
            }
        }
    });

    let texts: Vec<String> =
        buffers.into_iter().map(|b| b.into_inner().unwrap_or_else(|p| p.into_inner())).collect();
    let skipped: Vec<usize> = (0..world_size).filter(|&rank| !runs_here(rank)).collect();
    let result = outcome.map_err(|error| match error {
        SpawnError::RanksFailed { failures } => RanksFailed::Ranks {
            failures,
            panic_locations: panic_locations.into_inner().unwrap_or_else(|p| p.into_inner()),
            skipped: skipped.clone(),
        },
        other => RanksFailed::Invalid(other.to_string()),
    });
    (texts, skipped, result)
}

fn check_arguments(world_size: usize, only: Option<&[usize]>) -> Result<(), RanksFailed> {
    if world_size == 0 {
        return Err(RanksFailed::Invalid("a group needs at least one rank, got world_size = 0".into()));
    }
    let Some(ranks) = only else { return Ok(()) };
    if let Some(&bad) = ranks.iter().find(|&&rank| rank >= world_size) {
        return Err(RanksFailed::Invalid(format!(
            "on_some_ranks: rank {bad} does not exist in a world of {world_size} ranks \
             (ranks are 0 to {}); list only existing ranks",
            world_size - 1
        )));
    }
    if let Some((i, &twice)) = ranks.iter().enumerate().find(|(i, rank)| ranks[..*i].contains(rank)) {
        return Err(RanksFailed::Invalid(format!(
            "on_some_ranks: rank {twice} is listed twice in {ranks:?} (at position {i} again); list each rank once"
        )));
    }
    Ok(())
}
