//! Helpers for the evcxr notebooks in `notebooks/`: run a closure on every
//! rank and show what each rank wrote under its own `Rank N` heading, in rank
//! order; run a closure on some ranks only, to see what a skipped collective
//! does; time a piece of code. notebooks/README.md shows how a notebook uses
//! them. Checked by `cargo test --lib notebook`.
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

use std::cell::{Cell, RefCell};
use std::fmt;
use std::panic::{self, catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::{Mutex, Once};
use std::time::{Duration, Instant};

use crate::dist::{spawn_with, Group, RankFailure, SpawnError, SpawnOptions};

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

/// A poisoned buffer (its rank panicked while writing) still holds the text
/// written before the panic, which is exactly what the notebook should show.
fn lock(buffer: &Mutex<String>) -> std::sync::MutexGuard<'_, String> {
    buffer.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Why [`on_ranks`] or [`on_some_ranks`] did not return every rank's value.
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
        /// The ranks that skipped the closure ([`on_some_ranks`]).
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
    print!("{}", report(&texts, &skipped, result.as_ref().err()));
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
    install_quiet_panic_hook();
    let buffers: Vec<Mutex<String>> = (0..world_size).map(|_| Mutex::new(String::new())).collect();
    let panic_locations: Mutex<Vec<(usize, String)>> = Mutex::new(Vec::new());
    let runs_here = |rank: usize| only.is_none_or(|ranks| ranks.contains(&rank));

    let outcome = spawn_with(options, |pg| {
        let rank = pg.rank();
        if !runs_here(rank) {
            return Ok(None); // this rank skips the closure and leaves the group
        }
        let mut out = RankOutput { rank, buffer: &buffers[rank] };
        QUIET_PANICS.with(|quiet| quiet.set(true));
        let result = catch_unwind(AssertUnwindSafe(|| f(pg, &mut out)));
        QUIET_PANICS.with(|quiet| quiet.set(false));
        match result {
            Ok(value) => value.map(Some),
            Err(payload) => {
                if let Some(place) = LAST_PANIC_LOCATION.with(|l| l.borrow_mut().take()) {
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

/// The text printed under the cell: each rank's heading and output, then
/// the failures. A rank that wrote nothing, and neither failed nor skipped,
/// gets no heading, so that a run with nothing to say prints nothing.
fn report(texts: &[String], skipped: &[usize], failed: Option<&RanksFailed>) -> String {
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

thread_local! {
    /// Set while a rank thread runs the notebook's closure: the panic hook
    /// then keeps the panic off stderr, because the report shows it.
    static QUIET_PANICS: Cell<bool> = const { Cell::new(false) };
    /// Where the last quiet panic of this thread happened.
    static LAST_PANIC_LOCATION: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Wraps the process's panic hook once (per copy of this crate: evcxr links
/// one into every cell) so that panics in rank closures are recorded, not
/// printed. Every other panic still goes to the previous hook.
fn install_quiet_panic_hook() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if QUIET_PANICS.with(Cell::get) {
                let place = info.location().map(|l| format!("{}:{}:{}", l.file(), l.line(), l.column()));
                LAST_PANIC_LOCATION.with(|l| *l.borrow_mut() = place);
            } else {
                previous(info);
            }
        }));
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dist::ReduceOp;
    use tch::Tensor;

    #[test]
    fn every_rank_runs_and_values_come_back_in_rank_order() {
        let values = on_ranks(3, |pg, out| {
            let mut t = Tensor::from(pg.rank() as f64 + 1.0);
            pg.all_reduce(&mut t, ReduceOp::Sum)?;
            writeln!(out, "rank {} sees {}", out.rank(), t.double_value(&[]))?;
            Ok((pg.rank(), t.double_value(&[])))
        })
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(values, vec![(0, 6.0), (1, 6.0), (2, 6.0)]);
    }

    #[test]
    fn the_report_lists_ranks_in_order_and_the_failure_after_them() {
        let texts = vec!["a\n".to_string(), "b".to_string(), String::new(), String::new()];
        let failed = RanksFailed::Ranks {
            failures: vec![(1, RankFailure::Panicked("boom".into()))],
            panic_locations: vec![(1, "src/x.rs:3:5".into())],
            skipped: vec![3],
        };
        let text = report(&texts, &[3], Some(&failed));
        assert_eq!(
            text.lines().take(5).collect::<Vec<_>>(),
            ["── Rank 0 ──", "a", "── Rank 1 (failed) ──", "b", "── Rank 3 (skipped this closure) ──"],
            "rank 2 wrote nothing and did not fail: no heading"
        );
        assert_eq!(report(&texts[2..], &[], None), "", "silent ranks print nothing");
        let failure = text.lines().nth(5).unwrap_or_default();
        assert!(failure.starts_with("✗ 1 rank(s) failed"), "{text}");
        assert!(text.contains("first: rank 1 panicked: boom (in src/x.rs:3:5)"), "{text}");
        let same = RanksFailed::Ranks {
            failures: vec![
                (2, RankFailure::Panicked("boom".into())),
                (0, RankFailure::Panicked("boom".into())),
            ],
            panic_locations: vec![],
            skipped: vec![],
        };
        assert!(same.to_string().ends_with("then: rank 0 failed the same way as rank 2"), "{same}");
        assert!(text.contains("rank(s) [3] skipped"), "{text}");
    }

    #[test]
    fn output_written_before_a_panic_survives_and_the_panic_becomes_an_error() {
        let (texts, _, result) = run_collecting_output(SpawnOptions::new(2), None, |pg, out| {
            writeln!(out, "rank {} before", pg.rank())?;
            if pg.rank() == 1 {
                todo!("exercise ch99: planted in a test");
            }
            // Rank 0 waits for rank 1 in a collective, which rank 1 never reaches.
            pg.barrier()?;
            writeln!(out, "rank 0 passed the barrier")?;
            Ok(())
        });
        assert_eq!(texts, ["rank 0 before\n", "rank 1 before\n"], "rank 0 cannot pass the barrier");
        let error = result.expect_err("rank 1 panicked, so the run must fail");
        assert_eq!(error.first_failed_rank(), Some(1));
        let message = error.to_string();
        assert!(message.contains("first: rank 1 panicked: not yet implemented: exercise ch99"), "{message}");
        assert!(message.contains("src/notebook.rs:"), "the panic's location is kept: {message}");
        assert!(matches!(error.failure_of(0), Some(RankFailure::Error(_))), "{message}");
    }

    #[test]
    fn a_collective_on_some_ranks_only_fails_naming_the_rank_that_skipped() {
        let error = on_some_ranks(3, &[0, 1], |pg, _out| {
            let mut t = Tensor::from(1.0);
            pg.all_reduce(&mut t, ReduceOp::Sum)?;
            Ok(())
        })
        .expect_err("rank 2 skipped the all_reduce");
        let message = error.to_string();
        let rank0 = error.error_of(0).map(|e| format!("{e:#}")).unwrap_or_default();
        assert!(rank0.contains("all_reduce") && rank0.contains("rank 2"), "{message}");
        assert!(message.contains("rank(s) [2] skipped"), "{message}");
    }

    #[test]
    fn without_a_collective_the_skipping_ranks_just_return_none() {
        let values = on_some_ranks(3, &[1], |pg, _out| Ok(pg.rank() * 10)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(values, vec![None, Some(10), None]);
    }

    #[test]
    fn bad_arguments_are_clear_errors() {
        let no_ranks = on_ranks(0, |_pg, _out| Ok(())).expect_err("zero ranks");
        assert!(no_ranks.to_string().contains("at least one rank"), "{no_ranks}");
        let missing = on_some_ranks(2, &[0, 5], |_pg, _out| Ok(())).expect_err("rank 5 of 2");
        assert!(missing.to_string().contains("rank 5 does not exist"), "{missing}");
        let twice = on_some_ranks(3, &[1, 1], |_pg, _out| Ok(())).expect_err("rank 1 twice");
        assert!(twice.to_string().contains("listed twice"), "{twice}");
    }

    #[test]
    fn median_time_runs_f_as_often_as_asked_and_takes_the_middle_time() {
        let mut calls = 0;
        median_time(3, || calls += 1);
        assert_eq!(calls, 3);
        let ms = Duration::from_millis;
        assert_eq!(median(vec![ms(5), ms(200), ms(1)]), ms(5), "one slow run must not be the median");
        assert_eq!(median(vec![ms(4), ms(2)]), ms(4));
    }
}
