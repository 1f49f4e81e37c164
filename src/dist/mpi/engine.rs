//! The communication thread. Every MPI call of this
//! process is made here, as gloo and NCCL keep a thread of their own: the
//! caller hands over a job and waits on its `Done` (or, for an asynchronous
//! all-reduce, goes on computing while this thread drives MPI's progress).
//! Try it: `cargo test --features mpi --test mpi`.
//!
//! The rules it keeps:
//! - collectives of one communicator are posted in call order, one after
//!   the other has been posted (MPI requires the same order on every rank);
//! - in debug mode each collective first exchanges a signature (its
//!   operation, dtype, shape, root, tag) with every peer, and ranks that
//!   disagree all get the same `Mismatch` before any data moves;
//! - every call has a deadline. MPI cannot cancel a collective, so a missed
//!   deadline breaks the communicator: the call fails naming the ranks that
//!   never arrived, every later call fails with `Broken`, and the job must
//!   end (`super::run` aborts it). How it breaks and ends, keeping every
//!   buffer MPI may still write into, is in `engine/failures.rs`.
//!
//! Also here: `engine/point_to_point.rs` (send and recv, each behind its
//! signature) and `engine/agreed.rs` (the blocking calls, made only once
//! every rank has agreed on them: new_group, alloc_buffer).

use std::collections::VecDeque;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::ffi::{self, Comm};
use super::job::{Action, Active, Done, Job, Reply};
use super::shm::Node;
use crate::dist::DistError;

mod agreed;
mod failures;
mod point_to_point;
#[cfg(test)]
mod tests;

/// What callers send to the communication thread.
pub(crate) enum Command {
    Run(Job),
    /// Finish what is in flight (within the deadline), then stop.
    Shutdown(Arc<Done>),
}

/// One communicator: the world's duplicate, or a sub-group's.
struct CommState {
    raw: Comm,
    rank: usize,
    /// World rank of each member: errors name world ranks.
    global: Vec<usize>,
    /// Collectives not yet posted; only the front one may exchange signatures.
    queue: VecDeque<Active>,
    /// Posted collectives and point-to-point calls, until they complete.
    running: Vec<Active>,
    /// Collectives taken from the queue so far: the same count on every
    /// rank, since every rank makes them in the same order.
    collectives: u64,
}

pub(crate) struct Engine {
    comms: Vec<CommState>,
    timeout: Duration,
    world_rank: usize,
    /// The error that broke the communicators, once one has.
    broken: Option<String>,
    /// Jobs of a broken engine: never freed, since MPI may still write into
    /// their buffers until the job is aborted (`end` leaks them).
    kept: Vec<Active>,
    /// The node's shared memory, through which the world's all-reduces go
    /// (`shm.rs`); `None` sends messages for them (`ordered.rs`).
    node: Option<Node>,
}

impl Engine {
    /// The engine of a fresh world communicator (`comm`, this process's
    /// `rank` of `size`).
    pub fn new(comm: Comm, rank: usize, size: usize, timeout: Duration) -> Self {
        let world = CommState {
            raw: comm,
            rank,
            global: (0..size).collect(),
            queue: VecDeque::new(),
            running: vec![],
            collectives: 0,
        };
        Engine { comms: vec![world], timeout, world_rank: rank, broken: None, kept: vec![], node: None }
    }

    /// The same engine, reducing the world's all-reduces through `node`.
    pub fn with_node(mut self, node: Option<Node>) -> Self {
        self.node = node;
        self
    }

    fn busy(&self) -> bool {
        self.comms.iter().any(|c| !c.queue.is_empty() || !c.running.is_empty())
    }

    /// The thread's loop: take jobs, drive MPI, hand out results.
    pub fn run(mut self, commands: Receiver<Command>) {
        let mut idle_rounds = 0u32;
        let mut shutdown: Option<(Arc<Done>, Instant)> = None;
        loop {
            let command = if self.busy() || shutdown.is_some() {
                commands.try_recv().ok()
            } else {
                match commands.recv() {
                    Ok(command) => Some(command),
                    Err(_) => return self.end(), // every handle is gone
                }
            };
            match command {
                Some(Command::Run(job)) => self.accept(job),
                Some(Command::Shutdown(done)) => shutdown = Some((done, Instant::now() + self.timeout)),
                None => {}
            }
            if let Some((done, deadline)) = &shutdown {
                if !self.busy() || Instant::now() >= *deadline || self.broken.is_some() {
                    let (done, result) = (done.clone(), self.shutdown_result());
                    self.end(); // before the caller hears (and may call MPI_Abort)
                    done.set(result);
                    return;
                }
            }
            if self.advance() {
                idle_rounds = 0;
            } else {
                idle_rounds = idle_rounds.saturating_add(1);
                pause(idle_rounds);
            }
        }
    }

    fn accept(&mut self, job: Job) {
        if let Some(cause) = &self.broken {
            let (rank, op, cause) = (self.world_rank, job.name.clone(), cause.clone());
            return job.done.set(Err(DistError::Broken { rank, op, cause }));
        }
        let mut active = Active::new(job, self.timeout);
        if let Action::Send { .. } = active.job.action {
            // Sends are buffered, as in the in-process backend: one may wait
            // for its receive as long as the program likes (shutdown checks).
            active.deadline = Instant::now() + Duration::from_secs(10 * 365 * 24 * 3600);
        }
        let comm = &mut self.comms[active.job.comm];
        let posted = match active.job.action {
            Action::Send { dst, .. } => point_to_point::send_side(&mut active, dst, comm.raw),
            Action::Recv { src, .. } => point_to_point::receive_side(&mut active, src, comm.raw),
            _ => return comm.queue.push_back(active),
        };
        match posted {
            Ok(()) => comm.running.push(active),
            Err(message) => self.fail(active, message),
        }
    }

    /// One round over every communicator; true if anything moved.
    fn advance(&mut self) -> bool {
        let mut moved = false;
        for c in 0..self.comms.len() {
            loop {
                match self.advance_front(c) {
                    Ok(true) => moved = true,
                    Ok(false) => break,
                    Err((active, message)) => {
                        self.fail(*active, message);
                        return true;
                    }
                }
            }
            let mut i = 0;
            while i < self.comms[c].running.len() {
                match super::shm::finished(&mut self.node, &mut self.comms[c].running[i]) {
                    Ok(true) => {
                        let active = self.comms[c].running.swap_remove(i);
                        self.complete(c, active);
                        moved = true;
                    }
                    Ok(false) if Instant::now() >= self.comms[c].running[i].deadline => {
                        let active = self.comms[c].running.swap_remove(i);
                        return self.time_out(c, active);
                    }
                    Ok(false) => i += 1,
                    Err(message) => {
                        let active = self.comms[c].running.swap_remove(i);
                        self.fail(active, message);
                        return true;
                    }
                }
            }
        }
        moved
    }

    /// Moves the front collective of communicator `c` one phase on: start
    /// its signature exchange, or, once every signature has arrived, check
    /// them and post the transfer. True if it moved.
    fn advance_front(&mut self, c: usize) -> Result<bool, (Box<Active>, String)> {
        let comm = &mut self.comms[c];
        let Some(front) = comm.queue.front_mut() else { return Ok(false) };
        let peers: Vec<usize> = (0..comm.global.len()).filter(|&p| p != comm.rank).collect();
        let wants_signature = front.job.signature.is_some() && !peers.is_empty();
        if wants_signature && front.peer_signatures.is_empty() {
            let started = peers.iter().try_for_each(|&p| {
                front.send_signature(p, ffi::TAG_COLLECTIVE_SIGNATURE, comm.raw)?;
                front.receive_signature(p, ffi::TAG_COLLECTIVE_SIGNATURE, comm.raw)
            });
            return started.map(|()| true).map_err(|m| (Box::new(comm.queue.pop_front().expect("front")), m));
        }
        if wants_signature {
            match front.signatures_arrived() {
                Ok(true) => {}
                Ok(false) if Instant::now() >= front.deadline => {
                    let active = comm.queue.pop_front().expect("front");
                    self.time_out(c, active);
                    return Ok(false);
                }
                Ok(false) => return Ok(false),
                Err(message) => return Err((Box::new(comm.queue.pop_front().expect("front")), message)),
            }
        }
        let through_node = self.node.as_ref().filter(|node| node.takes(front) || node.shares(front));
        if through_node.is_some_and(|node| node.busy) {
            return Ok(false); // the node's previous call must end on every rank first
        }
        let through_node = through_node.is_some_and(|node| node.takes(front));
        let (active, raw, place) =
            (comm.queue.pop_front().expect("front"), comm.raw, (comm.rank, comm.global.len()));
        let index = comm.collectives;
        comm.collectives += 1;
        if let Some(detail) = disagreement(&active, comm) {
            let (rank, op) = (self.world_rank, active.job.name.clone());
            self.finish_later(c, active, Err(DistError::Mismatch { rank, op, detail }));
            return Ok(true);
        }
        let Some(mut active) = self.made_after_agreement(c, active)? else { return Ok(true) };
        let posted = match (through_node, self.node.as_mut()) {
            (true, Some(node)) => node.start(&mut active),
            _ => active.post(raw, index, place),
        };
        match posted {
            Ok(()) => {
                self.comms[c].running.push(active);
                Ok(true)
            }
            Err(message) => Err((Box::new(active), message)),
        }
    }

    /// Ends `active` with `result` once its requests (signature sends) have completed.
    pub(super) fn finish_later(&mut self, c: usize, mut active: Active, result: Result<Reply, DistError>) {
        active.preset = Some(result);
        self.comms[c].running.push(active);
    }

    /// Hands a finished job its result.
    fn complete(&mut self, c: usize, mut active: Active) {
        let result = match active.preset.take() {
            Some(result) => result,
            None => self.received_as_expected(c, &active).map(|()| Reply::Done),
        };
        active.job.done.set(result);
    }
}

// ANCHOR: disagreement
/// Why the ranks' signatures differ, in words, or `None` when they agree.
/// Every rank compares all signatures against group rank 0's, so every
/// rank names the same two calls.
fn disagreement(active: &Active, comm: &CommState) -> Option<String> {
    active.job.signature.as_ref()?;
    let mut all: Vec<(usize, &[u8])> =
        active.peer_signatures.iter().map(|(p, bytes, _)| (*p, bytes.as_slice())).collect();
    all.push((comm.rank, &active.own_signature));
    all.sort_by_key(|(rank, _)| *rank);
    let (first_rank, first) = all[0];
    let (other, theirs) = all.iter().find(|(_, bytes)| *bytes != first)?;
    // The call's number is in the error's operation ("... (call #3)").
    let words = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    Some(format!(
        "rank {} called {} but rank {} called {}",
        comm.global[first_rank],
        words(first),
        comm.global[*other],
        words(theirs)
    ))
}

// ANCHOR_END: disagreement

// ANCHOR: pause
/// Backs off while requests are in flight but nothing moved. Open MPI's
/// non-blocking collectives advance only inside MPI calls (our MPI_Test):
/// a large all-reduce is many small rounds, and a thread that slept between
/// tests would stall each one (25 MiB took 37 ms with 50 µs sleeps, 5.5 ms
/// with yields, on this book's machine). So: spin briefly, then yield the
/// core to any thread that wants it, and sleep only after a long wait (a
/// peer still computing), to stop burning a core for nothing.
fn pause(idle_rounds: u32) {
    match idle_rounds {
        0..=64 => std::hint::spin_loop(),
        65..=200_000 => std::thread::yield_now(),
        _ => std::thread::sleep(Duration::from_micros(50)),
    }
}
// ANCHOR_END: pause
