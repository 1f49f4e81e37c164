//! The MPI backend: each rank is a process, started by `mpirun` (Open MPI),
//! on one machine or several, and the ranks talk through MPI. Build with
//! `--features mpi`; start with the launcher script:
//!
//! ```text
//! cargo build --release --features mpi --example hello_ranks
//! scripts/launch.sh -np 2 target/release/examples/hello_ranks --backend mpi
//! ```
//!
//! Inside the program, [`run`] is to processes what [`super::spawn`] is to
//! threads: it joins the job, hands the body this process's [`Group`], and
//! ends the whole job if the body fails:
//!
//! ```no_run
//! use ddp_workbook::dist::{self, ReduceOp};
//! use ddp_workbook::tch::Tensor;
//!
//! let total = dist::mpi::run(|group| {
//!     let mut t = Tensor::from_slice(&[group.rank() as f32 + 1.0]);
//!     group.all_reduce(&mut t, ReduceOp::Sum)?;
//!     Ok(t.double_value(&[0]))
//! });
//! println!("{total}"); // 3 on two processes
//! ```
//!
//! The same rules as the in-process backend, as far as MPI allows:
//! - every call has a deadline (`DDP_TIMEOUT_SECS`); past it the call fails
//!   naming the ranks that never arrived, and [`run`] ends the job, so
//!   `mpirun` exits non-zero instead of hanging;
//! - a rank that panics or returns an error ends the job at once, naming
//!   itself; a rank that is killed is noticed by `mpirun`, which ends the rest;
//! - with `DDP_DEBUG` unset (or `detail`) every collective first exchanges a
//!   signature (operation, dtype, shape, root, tag) with its peers, so ranks
//!   that disagree get a `Mismatch` naming both calls instead of MPI's
//!   undefined behaviour. `DDP_DEBUG=off` skips it.
//!
//! - the world's all-reduces between ranks on one machine go through an
//!   MPI-3 shared-memory window (`shm.rs`), summed in rank order like the
//!   in-process backend; `DDP_MPI_SHM=off` sends messages instead;
//! - floating-point sums that do not go through shared memory (sub-groups,
//!   `DDP_MPI_SHM=off`, ranks placed out of order) and every reduce-scatter
//!   are folded in rank order over point-to-point messages (`ordered.rs`),
//!   not in Open MPI's order: the in-process backend's bits on any number
//!   of processes;
//! - a tensor of more than 2^31 − 1 elements (MPI counts in `int`) travels
//!   as several calls (`ffi.rs`), so a checkpoint over 2 GiB resumes.
//!   Buffers from `alloc_buffer` (DDP's buckets) are summed where they lie,
//!   with no copy (`shm/regions.rs`); `DDP_MPI_SHM=copy` makes them plain.
//!
//! Files: `group.rs` (the `ProcessGroup`), `engine.rs` (the communication
//! thread; `engine/failures.rs`, how it breaks and ends), `job.rs` (one
//! call in flight), `shm.rs` (the shared-memory all-reduce), `ordered.rs`
//! (reductions in rank order over messages), `ffi.rs` (the raw MPI calls).

mod bf16_sum;
mod engine;
mod ffi;
mod group;
mod job;
mod ordered;
mod shm;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::channel;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use mpi::environment::{Threading, Universe};

pub use group::MpiProcessGroup;

use super::{timeout_from_env, DistError, Group, ProcessGroup};
use crate::error_text::panic_message;
use engine::{Command, Engine};
use group::Shared;
use job::Done;

/// This process's membership of an MPI job: MPI itself, the communication
/// thread, and the world group. Made by [`init`]; [`run`] does it all.
pub struct MpiWorld {
    group: Arc<MpiProcessGroup>,
    shared: Arc<Shared>,
    local: (usize, usize),
    thread: Option<JoinHandle<()>>,
    /// Finalizes MPI when dropped; forgotten instead when the job must abort.
    universe: Option<Universe>,
}

/// Joins the MPI job this process was started in (a world of one when no
/// launcher started it).
pub fn init() -> Result<MpiWorld, DistError> {
    let setup = |detail: String| DistError::Invalid { rank: 0, op: "joining the MPI job".into(), detail };
    let timeout = timeout_from_env().map_err(setup)?;
    let debug = super::settings::signatures_from_env(true).map_err(setup)?;
    ffi::most_per_call_from_env().map_err(setup)?;
    let (universe, threading) = mpi::initialize_with_threading(Threading::Multiple)
        .ok_or_else(|| setup("MPI is already initialized in this process: call init() once".into()))?;
    if threading < Threading::Multiple {
        return Err(setup(format!(
            "this MPI library offers threads at level {threading:?}; the backend calls MPI from its \
             communication thread and needs Multiple (Open MPI from scripts/setup.sh has it)"
        )));
    }
    let (commands, inbox) = channel();
    let (ready, started) = channel();
    let thread = std::thread::Builder::new()
        .name("mpi-communication".into())
        .spawn(move || {
            let joined = ffi::world().and_then(|comm| {
                let (rank, size) = ffi::rank_and_size(comm)?;
                let node = shm::Node::join(comm, rank, size)?;
                Ok((comm, rank, size, ffi::local_rank_and_size(comm)?, node))
            });
            match joined {
                Ok((comm, rank, size, local, node)) => {
                    _ = ready.send(Ok((rank, size, local)));
                    Engine::new(comm, rank, size, timeout).with_node(node).run(inbox);
                }
                Err(message) => _ = ready.send(Err(message)),
            }
        })
        .map_err(|e| setup(format!("cannot start the communication thread: {e}")))?;
    let (rank, size, local) =
        started.recv().map_err(|_| setup("the communication thread died".into()))?.map_err(setup)?;
    let shared = Arc::new(Shared { commands: Mutex::new(commands), timeout, debug, world_rank: rank });
    let group = Arc::new(MpiProcessGroup::new(shared.clone(), 0, rank, (0..size).collect(), String::new()));
    Ok(MpiWorld { group, shared, local, thread: Some(thread), universe: Some(universe) })
}

impl MpiWorld {
    /// The world group, as chapter code holds it.
    pub fn group(&self) -> Group {
        self.group.clone()
    }

    /// This process's index among the job's processes on this machine
    /// (torch.distributed's LOCAL_RANK), as MPI counts them.
    pub fn local_rank(&self) -> usize {
        self.local.0
    }

    /// How many of the job's processes run on this machine (LOCAL_WORLD_SIZE).
    pub fn local_world_size(&self) -> usize {
        self.local.1
    }

    /// Waits for what is still in flight (sends no peer received yet, at
    /// most the deadline), then stops the communication thread and
    /// finalizes MPI. An error means the job cannot end cleanly: abort it.
    pub fn finish(mut self) -> Result<(), DistError> {
        let result = self.stop();
        match result {
            Ok(()) => drop(self.universe.take()), // MPI_Finalize
            // Finalizing would wait for peers that may never come: the caller aborts.
            Err(_) => std::mem::forget(self.universe.take()),
        }
        result
    }

    fn stop(&mut self) -> Result<(), DistError> {
        let done = Arc::new(Done::default());
        let sent = self
            .shared
            .commands
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(Command::Shutdown(done.clone()));
        let result = match sent {
            Ok(()) => done
                .wait(self.shared.timeout * 2, self.shared.world_rank, "finishing the MPI group")
                .map(|_| ()),
            Err(_) => Ok(()), // already stopped
        };
        if result.is_ok() {
            if let Some(thread) = self.thread.take() {
                _ = thread.join();
            }
        }
        result
    }
}

impl Drop for MpiWorld {
    /// A world dropped without [`finish`](Self::finish) finishes here; if it
    /// cannot (a broken communicator), finalizing would hang, so the job is
    /// aborted instead.
    fn drop(&mut self) {
        if self.universe.is_none() {
            return;
        }
        if let Err(error) = self.stop() {
            eprintln!("{error}\nrank {}: ending the whole job", self.shared.world_rank);
            std::mem::forget(self.universe.take());
            ffi::abort(1);
        }
    }
}

/// How many all-reduces this process has finished through the node's shared
/// memory (`shm.rs`) rather than Open MPI's collectives: how a test or a
/// benchmark sees which path its calls took.
pub fn shared_memory_all_reduces() -> u64 {
    shm::THROUGH_WINDOW.load(std::sync::atomic::Ordering::Relaxed)
}

/// How many all-reduces this process has finished in place in buffers from
/// `alloc_buffer` (`shm/regions.rs`), with no copy: none of them counted by
/// [`shared_memory_all_reduces`].
pub fn zero_copy_all_reduces() -> u64 {
    shm::ZERO_COPY.load(std::sync::atomic::Ordering::Relaxed)
}

// ANCHOR: run
/// Runs `body` as this process's rank of the MPI job and returns what it
/// returned, after finishing MPI. If `body` returns an error or panics, or
/// the group cannot finish, this prints what happened, naming the rank, and
/// aborts the whole job (`mpirun` then exits with status 1): the peers would
/// otherwise wait for this rank until their deadline.
pub fn run<T>(body: impl FnOnce(Group) -> anyhow::Result<T>) -> T {
    let world = init().unwrap_or_else(|error| {
        eprintln!("error: {error}");
        std::process::exit(2)
    });
    let (rank, size) = (world.group.rank(), world.group.world_size());
    let failure = match catch_unwind(AssertUnwindSafe(|| body(world.group()))) {
        Ok(Ok(value)) => match world.finish() {
            Ok(()) => return value,
            Err(error) => format!("could not finish: {error}"),
        },
        Ok(Err(error)) => format!("returned an error: {error:#}"),
        Err(panic) => format!("panicked: {}", panic_message(panic.as_ref())),
    };
    eprintln!("rank {rank} of {size} failed, ending the whole job: {failure}");
    ffi::abort(1)
}
// ANCHOR_END: run
