//! The MPI backend's all-reduce at memory speed. The
//! ranks on one machine (a node) reduce through an MPI-3 shared-memory
//! window instead of Open MPI's collectives: each rank reduces one fixed
//! slice of the tensor, in place in the window (the in-process backend's
//! `src/dist/local/split_reduce.rs` shares blocks among the ranks instead;
//! across processes, a fixed slice per rank needs no shared counter). Try it:
//! `cargo test --features mpi --test mpi shared_memory`.
//!
//! One call on a node of N ranks, tensor cut into N slices (rank i owns slice i):
//! 1. agree: a tiny all-reduce on the node's communicator of the call's
//!    byte count. It proves that every rank has finished the previous call
//!    (so the window may be overwritten), finds ranks that passed different
//!    sizes (a `Mismatch`, even with `DDP_DEBUG=off`), and tells every rank
//!    together when the window must grow (a blocking, collective allocation,
//!    safe once all have agreed to make it);
//! 2. each rank copies the slices other ranks own into its segment; a
//!    barrier; each rank reduces its slice over the N ranks, in rank order,
//!    into the node's result area; a barrier; each copies the result out.
//!    Every element is computed once, by one rank, so every rank gets the
//!    same bits, and rank order makes them the in-process backend's bits.
//!
//! Buffers from `alloc_buffer` skip both copies: when the agreement shows
//! that every rank passed one at the same place, each rank sums its slice
//! of every rank's buffer where it lies and writes it back into all of
//! them, between two barriers (`shm/regions.rs`).
//!
//! Across nodes the sum stays in world-rank order: the nodes hold blocks of
//! consecutive ranks (`Node::join` checks it, or the job reduces over
//! messages, `ordered.rs`), so node k's slices start from the partial sum of nodes
//! 0..k, which its first rank (the leader) receives from the previous
//! leader into the result area before the first barrier; the last node's
//! leader then broadcasts the total to the other leaders, and a third
//! barrier lets each node's ranks copy it out. The sum is bitwise the one
//! of the same ranks on one node (the multinode tests compare the two).
//!
//! Why it is correct under MPI's memory model: the window is shared memory
//! (MPI-3's unified model), read and written with plain loads and stores
//! inside one `lock_all` epoch. Each barrier is preceded by `MPI_Win_sync`
//! (this rank's stores reach memory) and followed by one (other ranks'
//! stores become visible): the pattern the MPI standard gives for
//! shared-memory windows. Barriers are non-blocking (`MPI_Ibarrier`), tested
//! by the communication thread like every other request, so the call keeps
//! its deadline: a rank that never arrives times it out.

use std::sync::atomic::{fence, AtomicU64, Ordering};

use tch::{Device, Kind, Tensor};

use super::ffi::{self, Comm, Request, SharedWindow};
use super::job::{Action, Active};
use crate::dist::DistError;
use progress::{Phase, Progress};

mod chain;
mod fold;
mod join;
pub(crate) mod progress;
mod regions;
mod slices;

pub(crate) use fold::fold_in_order;
pub(crate) use regions::ZERO_COPY;

/// All-reduces this process finished through the window: the tests' proof
/// that the path was taken ([`super::shared_memory_all_reduces`]).
pub(crate) static THROUGH_WINDOW: AtomicU64 = AtomicU64::new(0);

/// This process's place on its node, and the node's window.
pub(crate) struct Node {
    comm: Comm,
    rank: usize,
    size: usize,
    world_rank: usize,
    /// This node holds world rank 0 (its sums start from nothing).
    first: bool,
    /// The leaders' communicator, this leader's index in it and the number
    /// of nodes; `None` on one node and on the other ranks.
    leaders: Option<(Comm, usize, usize)>,
    /// Several nodes take part.
    spread: bool,
    /// Never freed when the job ends: `MPI_Finalize` releases it, and
    /// `MPI_Win_free` is a blocking collective that would make a rank that
    /// finishes early wait, without a deadline, for every other rank.
    window: Option<SharedWindow>,
    /// Bytes of each rank's segment (the result area is as large).
    capacity: usize,
    /// The buffers of `alloc_buffer`, mapped by every rank (`regions.rs`),
    /// and whether this rank may make them (`DDP_MPI_SHM` is not "copy").
    regions: Vec<regions::Region>,
    buffers: bool,
    /// A call is using the window: the next one waits for it.
    pub busy: bool,
}

impl Node {
    /// Whether this call goes through the window: all-reduces of the world
    /// (across nodes, those that the leaders can pass on in one message).
    pub fn takes(&self, active: &Active) -> bool {
        let Action::AllReduce { buf, .. } = &active.job.action else { return false };
        active.job.comm == 0 && chain::fits_the_leaders(super::job::byte_len(buf), self.spread)
    }

    /// Whether this call is an `alloc_buffer` (whose blocking collectives
    /// must wait until no call uses the node's communicator).
    pub fn shares(&self, active: &Active) -> bool {
        matches!(active.job.action, Action::AllocBuffer { .. })
    }

    /// Starts `active` (an all-reduce of the world): the agreement.
    pub fn start(&mut self, active: &mut Active) -> Result<(), String> {
        let Action::AllReduce { buf, .. } = &active.job.action else { unreachable!("Node::takes") };
        let bytes = super::job::byte_len(buf) as i64;
        let (region, offset) = match self.place(buf) {
            Some((index, offset)) if !self.spread => (index as i64, offset as i64),
            _ => (-1, -1),
        };
        let sizes = Box::new([bytes, -bytes, region, -region, offset, -offset]);
        let mut progress = Progress { phase: Phase::Agree, request: null(), sizes, zero_copy: None };
        // SAFETY: the sizes live in `progress`, boxed, until the request completes.
        progress.request = unsafe { ffi::iall_max(&mut progress.sizes[..], self.comm)? };
        active.shm = Some(progress);
        self.busy = true;
        Ok(())
    }

    /// Drives `active`'s call on; true once it has ended (its result, or a
    /// `Mismatch` in `active.preset`).
    pub fn poll(&mut self, active: &mut Active) -> Result<bool, String> {
        let Active { job, shm, preset, .. } = active;
        let progress = shm.as_mut().expect("a call through the window");
        let Action::AllReduce { buf, op } = &job.action else { unreachable!("Node::takes") };
        loop {
            let Some(received) = ffi::test(&mut progress.request)? else { return Ok(false) };
            let next = match progress.phase {
                Phase::Agree => {
                    let (most, least) = (progress.sizes[0], -progress.sizes[1]);
                    if most != least {
                        let detail = format!(
                            "the ranks on this node passed tensors of different sizes ({least} to {most} \
                             bytes); DDP_DEBUG=detail names the calls"
                        );
                        *preset = Some(Err(DistError::Mismatch {
                            rank: self.world_rank,
                            op: job.name.clone(),
                            detail,
                        }));
                        self.busy = false;
                        return Ok(true);
                    }
                    let agreed =
                        |k: usize| (progress.sizes[k] == -progress.sizes[k + 1]).then_some(progress.sizes[k]);
                    if let (Some(region @ 0..), Some(offset)) = (agreed(2), agreed(4)) {
                        progress.zero_copy = Some((region as usize, offset as usize));
                        progress.phase = self.barrier(progress, Phase::Filled)?;
                        continue;
                    }
                    self.make_room(most as usize)?;
                    let call = self.call(buf, *op)?;
                    call.copy_in();
                    match self.receive_previous(&call)? {
                        Some(request) => {
                            progress.request = request;
                            Phase::ReceivePrevious
                        }
                        None => self.barrier(progress, Phase::DataIn)?,
                    }
                }
                Phase::ReceivePrevious => {
                    let want = super::job::byte_len(buf);
                    if received != want {
                        return Err(format!("the previous node sent {received} bytes of a {want}-byte sum"));
                    }
                    self.barrier(progress, Phase::DataIn)?
                }
                Phase::DataIn => {
                    self.sync()?;
                    let call = self.call(buf, *op)?;
                    call.reduce_own_slice(self.first, !self.spread)
                        .map_err(|e| format!("the slice's reduction: {e}"))?;
                    self.barrier(progress, Phase::Reduced)?
                }
                Phase::Reduced if !self.spread => {
                    self.sync()?;
                    self.call(buf, *op)?.copy_out(false);
                    return Ok(self.finished());
                }
                Phase::Reduced | Phase::SendNext => match self.leaders.is_some() {
                    true => {
                        self.sync()?;
                        let call = self.call(buf, *op)?;
                        let (request, next) = self.pass_on(&call, progress.phase)?;
                        progress.request = request;
                        next
                    }
                    false => self.barrier(progress, Phase::ResultIn)?,
                },
                Phase::Broadcast => self.barrier(progress, Phase::ResultIn)?,
                Phase::Filled => {
                    fence(Ordering::SeqCst); // the other ranks' stores, published before the barrier
                    self.sum_in_place(buf, *op, progress.zero_copy.expect("agreed on a region"))?;
                    self.barrier(progress, Phase::Summed)?
                }
                Phase::Summed => {
                    fence(Ordering::SeqCst);
                    ZERO_COPY.fetch_add(1, Ordering::Relaxed);
                    self.busy = false;
                    return Ok(true);
                }
                Phase::ResultIn => {
                    self.sync()?;
                    self.call(buf, *op)?.copy_out(true);
                    return Ok(self.finished());
                }
            };
            progress.phase = next;
        }
    }

    fn finished(&mut self) -> bool {
        THROUGH_WINDOW.fetch_add(1, Ordering::Relaxed);
        self.busy = false;
        true
    }

    /// Publishes this rank's stores, then starts the node's barrier.
    fn barrier(&self, progress: &mut Progress, next: Phase) -> Result<Phase, String> {
        fence(Ordering::SeqCst); // for the regions, which are no MPI window
        self.sync()?;
        // SAFETY: a barrier has no buffer.
        progress.request = unsafe { ffi::ibarrier(self.comm)? };
        Ok(next)
    }

    fn sync(&self) -> Result<(), String> {
        self.window.as_ref().map_or(Ok(()), SharedWindow::sync)
    }
}

/// Tests `active`'s requests and, for a call through the node's shared
/// memory, drives it on; true once all is done.
pub(crate) fn finished(node: &mut Option<Node>, active: &mut Active) -> Result<bool, String> {
    let requests = active.finished()?;
    match (active.shm.is_some(), node.as_mut()) {
        (true, Some(node)) => Ok(node.poll(active)? && requests),
        _ => Ok(requests),
    }
}

/// MPI's byte datatype.
fn sys_u8() -> mpi::ffi::MPI_Datatype {
    // SAFETY: reading a constant that mpi-sys exports.
    unsafe { mpi::ffi::RSMPI_UINT8_T }
}

fn null() -> Request {
    // SAFETY: reading a constant that mpi-sys exports.
    unsafe { mpi::ffi::RSMPI_REQUEST_NULL }
}

/// The result area as a byte tensor (a view of the window, owning nothing).
pub(crate) fn bytes_at(at: *mut u8, len: usize) -> Tensor {
    // SAFETY: the caller's `len` bytes at `at` lie in the window, alive as long as the view is used.
    unsafe { Tensor::from_blob(at, &[len as i64], &[1], Kind::Uint8, Device::Cpu) }
}
