//! [`World`]: rank threads that a notebook starts once and that take work
//! cell after cell, keeping what each rank computed (the `%dist_init`,
//! `%%rank`, `%sync`, `%dist_status` and `%dist_shutdown` of Jupyter's
//! distributed notebooks). The ranks are threads of the kernel's process on
//! the in-process backend, whose group, deadlines and "a rank left" errors
//! are `spawn`'s own (`dist::local::StandingGroup`). Part of
//! `src/notebook.rs`; tested by `cargo test --test notebook_world`.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::quiet::{last_panic_place, lock, quietly};
use super::rank::{Rank, RankOut};
use super::report::{report, RanksFailed};
use crate::dist::local::StandingGroup;
use crate::dist::{RankFailure, SpawnError, SpawnOptions};

/// One cell's work for one rank thread.
type Job = Box<dyn FnOnce(&mut Rank) + Send>;

/// Rank threads that live across cells. `World::start(2)?` once; then
/// `world.run(|rank| ...)` in any later cell runs on every rank, and what
/// a rank keeps (`rank.keep("model", vs)`) is there in the next cell
/// (`rank.get::<VarStore>("model")?`). Dropping it, or
/// [`shutdown`](Self::shutdown), ends the threads.
///
/// A cell that fails or panics on some rank reports which rank and why;
/// the world then makes its group again, every rank keeps what it kept,
/// and the next cell runs as usual. A collective that some rank never
/// joins fails at the group's deadline (60 s, or `DDP_TIMEOUT_SECS`, or
/// [`start_with`](Self::start_with)'s options) naming that rank.
pub struct World {
    size: usize,
    options: SpawnOptions,
    /// One cell at a time.
    cells: Mutex<Cells>,
    /// What [`status`](Self::status) reads while a cell runs.
    status: Arc<Mutex<Vec<RankStatus>>>,
    /// How many cells have run (the one running included).
    cell_count: AtomicUsize,
    /// How many groups this world has made: 1, plus one per failed cell.
    groups_made: AtomicUsize,
}

struct Cells {
    group: Arc<StandingGroup>,
    threads: Vec<RankThread>,
    shut_down: bool,
}

struct RankThread {
    jobs: Option<Sender<Job>>,
    handle: Option<JoinHandle<()>>,
}

/// What one rank is doing, and what it keeps.
#[derive(Clone, Debug, Default)]
pub struct RankStatus {
    pub rank: usize,
    /// The cell it is running (`Some(3)`: the world's third cell), or `None`: idle.
    pub busy_in_cell: Option<usize>,
    /// Each kept value's name and type.
    pub kept: Vec<(String, String)>,
    /// How this rank failed in the last cell that failed on it.
    pub last_error: Option<String>,
    /// Whether its thread has ended (after `shutdown`).
    pub ended: bool,
}

/// What [`World::status`] returns: each rank's [`RankStatus`], printed as
/// one line per rank (`println!("{}", world.status())`, or the value itself
/// as a cell's last line).
#[derive(Clone, Debug)]
pub struct WorldStatus {
    pub ranks: Vec<RankStatus>,
    /// How many cells the world has run.
    pub cells: usize,
    /// How many groups it has made: 1, plus one after each failed cell.
    pub groups_made: usize,
    /// How long a call waits for its peers.
    pub timeout: Duration,
}

impl World {
    /// Starts `world_size` rank threads on a group of the in-process backend.
    pub fn start(world_size: usize) -> Result<World, SpawnError> {
        World::start_with(SpawnOptions::new(world_size))
    }

    /// [`start`](Self::start) with explicit options, e.g. a shorter deadline:
    /// `World::start_with(SpawnOptions::new(2).timeout(Duration::from_secs(5)))`.
    pub fn start_with(options: SpawnOptions) -> Result<World, SpawnError> {
        let group = Arc::new(StandingGroup::new(&options)?);
        let size = options.world_size;
        let status = Arc::new(Mutex::new(
            (0..size).map(|rank| RankStatus { rank, ..RankStatus::default() }).collect(),
        ));
        let mut threads = Vec::with_capacity(size);
        for rank in 0..size {
            let (jobs, inbox) = mpsc::channel::<Job>();
            let mut state = Rank::new(rank, size, group.rank(rank));
            let started = std::thread::Builder::new()
                .name(format!("rank-{rank}"))
                .spawn(move || take_jobs(&mut state, inbox));
            match started {
                Ok(handle) => threads.push(RankThread { jobs: Some(jobs), handle: Some(handle) }),
                Err(error) => {
                    // Dropping `threads` closes their inboxes: the started ranks end.
                    return Err(SpawnError::ThreadStart { rank, reason: error.to_string() });
                }
            }
        }
        let cells = Cells { group, threads, shut_down: false };
        let (cell_count, groups_made) = (AtomicUsize::new(0), AtomicUsize::new(1));
        Ok(World { size, options, cells: Mutex::new(cells), status, cell_count, groups_made })
    }

    /// How many ranks the world has.
    pub fn world_size(&self) -> usize {
        self.size
    }

    /// Runs `f` on every rank, prints what each rank wrote under its
    /// `── Rank N ──` heading in rank order (then the failures, if any),
    /// and returns each rank's value in rank order.
    pub fn run<T, F>(&self, f: F) -> Result<Vec<T>, RanksFailed>
    where
        T: Send + 'static,
        F: Fn(&mut Rank) -> anyhow::Result<T> + Send + Sync + 'static,
    {
        let all: Vec<usize> = (0..self.size).collect();
        self.print_cell(&all, f)
    }

    /// Runs `f` on the ranks listed only, while the others wait, and
    /// returns their values in the order listed. A collective inside `f`
    /// then waits for ranks that never come, and fails at the deadline
    /// naming them.
    pub fn on<T, F>(&self, ranks: &[usize], f: F) -> Result<Vec<T>, RanksFailed>
    where
        T: Send + 'static,
        F: Fn(&mut Rank) -> anyhow::Result<T> + Send + Sync + 'static,
    {
        self.check_ranks(ranks)?;
        self.print_cell(ranks, f)
    }

    /// Returns once every rank has reached a barrier of the group: every
    /// rank is alive, idle and agrees on its calls so far. Prints nothing
    /// unless a rank fails.
    pub fn sync(&self) -> Result<(), RanksFailed> {
        let all: Vec<usize> = (0..self.size).collect();
        let (text, result) = self.cell(&all, |rank| Ok(rank.pg().barrier()?));
        if result.is_err() {
            print!("{text}");
        }
        result.map(|_| ())
    }

    /// Each rank: idle or busy (in which cell), what it keeps, its last error.
    pub fn status(&self) -> WorldStatus {
        let cells = self.cell_count.load(Ordering::SeqCst);
        let groups_made = self.groups_made.load(Ordering::SeqCst);
        let timeout = self.options.resolved_timeout().unwrap_or_default();
        WorldStatus { ranks: lock(&self.status).clone(), cells, groups_made, timeout }
    }

    /// Ends the rank threads (after the cell they are running, if any) and
    /// drops what they keep. Later cells on this world fail with an error
    /// that says to start a new one. Calling it twice does nothing more.
    /// Like [`spawn`](crate::dist::spawn), it cannot stop a thread: a rank
    /// stuck outside any call of the group (an endless loop) is waited for.
    pub fn shutdown(&self) {
        let mut cells = lock(&self.cells);
        if cells.shut_down {
            return;
        }
        cells.shut_down = true;
        for thread in &mut cells.threads {
            thread.jobs = None; // the rank's inbox closes: it ends after its current job
        }
        for thread in &mut cells.threads {
            if let Some(handle) = thread.handle.take() {
                _ = handle.join(); // its jobs catch their panics: nothing to report
            }
        }
        for rank in 0..self.size {
            cells.group.leave(rank, "left: its notebook World was shut down".into());
        }
        for status in lock(&self.status).iter_mut() {
            status.ended = true;
            status.busy_in_cell = None;
            status.kept.clear();
        }
    }

    fn check_ranks(&self, ranks: &[usize]) -> Result<(), RanksFailed> {
        if let Some(&bad) = ranks.iter().find(|&&rank| rank >= self.size) {
            return Err(RanksFailed::Invalid(format!(
                "world.on: rank {bad} does not exist in a world of {} ranks (ranks are 0 to {}); list \
                 only existing ranks",
                self.size,
                self.size - 1
            )));
        }
        if let Some((i, &twice)) = ranks.iter().enumerate().find(|(i, rank)| ranks[..*i].contains(rank)) {
            return Err(RanksFailed::Invalid(format!(
                "world.on: rank {twice} is listed twice in {ranks:?} (at position {i} again); list each \
                 rank once"
            )));
        }
        Ok(())
    }

    fn print_cell<T, F>(&self, ranks: &[usize], f: F) -> Result<Vec<T>, RanksFailed>
    where
        T: Send + 'static,
        F: Fn(&mut Rank) -> anyhow::Result<T> + Send + Sync + 'static,
    {
        let (text, result) = self.cell(ranks, f);
        print!("{text}");
        result
    }

    /// Runs one cell on `ranks` and waits for all of them: the text to
    /// print under the cell and the values in the order of `ranks`, or
    /// the failures. After a failure the world makes a new group.
    pub(super) fn cell<T, F>(&self, ranks: &[usize], f: F) -> (String, Result<Vec<T>, RanksFailed>)
    where
        T: Send + 'static,
        F: Fn(&mut Rank) -> anyhow::Result<T> + Send + Sync + 'static,
    {
        let mut cells = lock(&self.cells);
        if cells.shut_down {
            let error = "this World was shut down (world.shutdown()); start a new one: let world = \
                         World::start(n)?;";
            return (String::new(), Err(RanksFailed::Invalid(error.into())));
        }
        let cell = self.cell_count.fetch_add(1, Ordering::SeqCst) + 1;
        let f = Arc::new(f);
        let outs: Vec<RankOut> = (0..self.size).map(|_| RankOut::new()).collect();
        let values: Arc<Mutex<Vec<Option<T>>>> = Arc::new(Mutex::new((0..self.size).map(|_| None).collect()));
        let failures: Arc<Mutex<Vec<(usize, RankFailure)>>> = Arc::default();
        let places: Arc<Mutex<Vec<(usize, String)>>> = Arc::default();
        let (done, finished) = mpsc::channel::<usize>();
        let mut lost = Vec::new();
        for &r in ranks {
            let (f, values, failures, places, done) =
                (f.clone(), values.clone(), failures.clone(), places.clone(), done.clone());
            let (group, out, status) = (cells.group.clone(), outs[r].clone(), self.status.clone());
            let job: Job = Box::new(move |rank: &mut Rank| {
                rank.begin_cell(group.rank(r), out);
                lock(&status)[r].busy_in_cell = Some(cell);
                let outcome = quietly(|| RankFailure::catch(|| f(rank)));
                let error = match outcome {
                    Ok(value) => {
                        lock(&values)[r] = Some(value);
                        None
                    }
                    Err(failure) => {
                        if let Some(place) = last_panic_place() {
                            lock(&places).push((r, place));
                        }
                        let reason = failure.to_string();
                        // Recorded before the peers wake, so the cause is listed first.
                        lock(&failures).push((r, failure));
                        // Values kept with this group (a DDP wrapper) meet this
                        // reason at their next call, once the world has made a new one.
                        let why = format!("{reason} (in the World's cell {cell}; then the World made a new group: rank.pg())");
                        group.leave(r, why);
                        Some(reason)
                    }
                };
                {
                    let mut status = lock(&status);
                    let mine = &mut status[r];
                    mine.busy_in_cell = None;
                    mine.kept = rank.kept();
                    if error.is_some() {
                        mine.last_error = error.map(|e| format!("cell {cell}: {e}"));
                    }
                }
                _ = done.send(r);
            });
            let sent = cells.threads[r].jobs.as_ref().is_some_and(|jobs| jobs.send(job).is_ok());
            if !sent {
                lost.push(r);
            }
        }
        drop(done);
        // Every job sends once when it ends; a thread that is gone drops its
        // job, and with it its sender, so this loop ends either way.
        while finished.recv().is_ok() {}
        let failures = take(&failures);
        let skipped: Vec<usize> = (0..self.size).filter(|r| !ranks.contains(r)).collect();
        let texts: Vec<String> = outs.iter().map(RankOut::text).collect();
        if !lost.is_empty() {
            let error = format!("rank(s) {lost:?} of this World have no thread any more; start a new World");
            return (report(&texts, &[], None), Err(RanksFailed::Invalid(error)));
        }
        if failures.is_empty() {
            let mut values = take(&values);
            let values =
                ranks.iter().map(|&r| values[r].take().expect("a rank that did not fail has a value"));
            return (report(&texts, &[], None), Ok(values.collect()));
        }
        let cause = failures.first().map_or_else(String::new, |(r, failure)| format!("rank {r} {failure}"));
        let remade = self.remake_group(&mut cells, cell, &cause);
        let failed =
            RanksFailed::Ranks { failures, panic_locations: take(&places), skipped: skipped.clone() };
        let mut text = report(&texts, &skipped, Some(&failed));
        text.push_str(&remade);
        (text, Err(failed))
    }

    /// After a failed cell: every rank leaves the old group (so that what
    /// still holds it fails at once, saying why) and gets a new one.
    /// `cause` (the first failure, "rank 0 returned an error: ...") goes
    /// into every rank's reason, so that a call on the old group names it
    /// whichever rank reaches the call first.
    fn remake_group(&self, cells: &mut Cells, cell: usize, cause: &str) -> String {
        for rank in 0..self.size {
            let reason = format!(
                "left: {cause} (in the World's cell {cell}; then the World made a new group: rank.pg())"
            );
            cells.group.leave(rank, reason);
        }
        match StandingGroup::new(&self.options) {
            Ok(group) => {
                cells.group = Arc::new(group);
                self.groups_made.fetch_add(1, Ordering::SeqCst);
                "↻ the world made a new group; every rank still keeps what it kept. Values that hold \
                 the old group (built from rank.pg() before this cell) must be built again.\n"
                    .to_string()
            }
            // The options made a group before, so they cannot fail now.
            Err(error) => format!("✗ the world could not make a new group: {error}\n"),
        }
    }
}

impl Drop for World {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A rank thread's life: take one cell's job after the other, until the
/// world closes the inbox; what the rank keeps is dropped here, on its thread.
fn take_jobs(rank: &mut Rank, inbox: Receiver<Job>) {
    while let Ok(job) = inbox.recv() {
        job(rank);
    }
}

fn take<T>(shared: &Mutex<Vec<T>>) -> Vec<T> {
    std::mem::take(&mut *lock(shared))
}

/// How much of a rank's last error a status line shows.
const STATUS_ERROR_CHARS: usize = 100;

impl fmt::Display for WorldStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let size = self.ranks.len();
        write!(
            f,
            "World of {size} ranks (in-process), {} cell(s) run, group made {} time(s), deadline {:?}",
            self.cells, self.groups_made, self.timeout
        )?;
        for status in &self.ranks {
            let doing = match (status.ended, status.busy_in_cell) {
                (true, _) => "ended".to_string(),
                (false, Some(cell)) => format!("busy in cell {cell}"),
                (false, None) => "idle".to_string(),
            };
            let kept: Vec<String> = status.kept.iter().map(|(key, ty)| format!("{key}: {ty}")).collect();
            let kept = if kept.is_empty() { "nothing".to_string() } else { kept.join(", ") };
            write!(f, "\n  rank {}: {doing}; keeps {kept}", status.rank)?;
            if let Some(error) = &status.last_error {
                // Its start says what failed; the whole text is in `last_error`.
                let shown: String = error.chars().take(STATUS_ERROR_CHARS).collect();
                let more = if shown.len() < error.len() { " …" } else { "" };
                write!(f, "; last error: {shown}{more}")?;
            }
        }
        Ok(())
    }
}

impl WorldStatus {
    /// How evcxr shows a status that ends a cell: as its text.
    pub fn evcxr_display(&self) {
        println!("EVCXR_BEGIN_CONTENT text/plain\n{self}\nEVCXR_END_CONTENT");
    }
}
