//! src/dist/mpi/shm.rs: the MPI backend's all-reduce at memory speed. The
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
//! Across nodes the sum stays in world-rank order: the nodes hold blocks of
//! consecutive ranks (`Node::join` checks it, or the job keeps Open MPI's
//! collectives), so node k's slices start from the partial sum of nodes
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

use std::sync::atomic::{AtomicU64, Ordering};

use tch::{Device, Kind, Tensor};

use super::ffi::{self, Comm, Request, SharedWindow};
use super::job::{Action, Active};
use crate::dist::{DistError, ReduceOp};

mod fold;
mod join;
mod slices;

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
    /// A call is using the window: the next one waits for it.
    pub busy: bool,
}

/// Where one call is.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Phase {
    Agree,
    ReceivePrevious,
    DataIn,
    Reduced,
    SendNext,
    Broadcast,
    ResultIn,
}

/// One all-reduce going through the window.
pub(crate) struct Progress {
    phase: Phase,
    request: Request,
    /// The agreement's buffer: [bytes, -bytes], then their maxima.
    sizes: Box<[i64; 2]>,
}

impl Node {
    /// Whether this call goes through the window: all-reduces of the world.
    pub fn takes(&self, active: &Active) -> bool {
        active.job.comm == 0 && matches!(active.job.action, Action::AllReduce { .. })
    }

    /// Starts `active` (an all-reduce of the world): the agreement.
    pub fn start(&mut self, active: &mut Active) -> Result<(), String> {
        let Action::AllReduce { buf, .. } = &active.job.action else { unreachable!("Node::takes") };
        let bytes = super::job::byte_len(buf) as i64;
        let mut progress =
            Progress { phase: Phase::Agree, request: null(), sizes: Box::new([bytes, -bytes]) };
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
                    self.make_room(most as usize)?;
                    let call = self.call(buf, *op)?;
                    call.copy_in();
                    match &self.leaders {
                        Some((leaders, index, _)) if !self.first => {
                            let bytes = call.bytes();
                            // SAFETY: the result area lives in the window, which outlives the call.
                            progress.request = unsafe {
                                ffi::irecv(
                                    call.result.cast(),
                                    bytes,
                                    index - 1,
                                    ffi::TAG_NODE_CHAIN,
                                    *leaders,
                                )?
                            };
                            Phase::ReceivePrevious
                        }
                        _ => self.barrier(progress, Phase::DataIn)?,
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
                Phase::Reduced | Phase::SendNext => match self.leaders {
                    Some((leaders, index, nodes)) => {
                        self.sync()?;
                        let call = self.call(buf, *op)?;
                        if progress.phase == Phase::Reduced && index + 1 < nodes {
                            // SAFETY: the result area outlives the call; nobody writes it until the send completes.
                            progress.request = unsafe {
                                ffi::isend(
                                    call.result.cast(),
                                    call.bytes(),
                                    index + 1,
                                    ffi::TAG_NODE_CHAIN,
                                    leaders,
                                )?
                            };
                            Phase::SendNext
                        } else {
                            let all = call.result_bytes();
                            // SAFETY: as above; the last leader sends it, the others receive into it.
                            progress.request = unsafe { ffi::ibcast(&all, sys_u8(), nodes - 1, leaders)? };
                            Phase::Broadcast
                        }
                    }
                    None => self.barrier(progress, Phase::ResultIn)?,
                },
                Phase::Broadcast => self.barrier(progress, Phase::ResultIn)?,
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
        self.sync()?;
        // SAFETY: a barrier has no buffer.
        progress.request = unsafe { ffi::ibarrier(self.comm)? };
        Ok(next)
    }

    fn sync(&self) -> Result<(), String> {
        self.window.as_ref().map_or(Ok(()), SharedWindow::sync)
    }

    /// Grows the window to hold `bytes` per rank. Every rank of the node
    /// saw the same size in the agreement, so all make this collective call.
    fn make_room(&mut self, bytes: usize) -> Result<(), String> {
        if bytes <= self.capacity && self.window.is_some() {
            return Ok(());
        }
        if let Some(old) = self.window.take() {
            old.free()?;
        }
        let capacity = bytes.max(1).next_multiple_of(1 << 20);
        // Rank 0's segment holds its input and then the result area.
        let own = if self.rank == 0 { 2 * capacity } else { capacity };
        self.window = Some(ffi::allocate_shared(self.comm, own, self.size)?);
        self.capacity = capacity;
        Ok(())
    }

    fn call<'a>(&'a self, buf: &'a Tensor, op: ReduceOp) -> Result<slices::Call<'a>, String> {
        let window = self.window.as_ref().expect("make_room made the window");
        let result = window.segments[0].wrapping_add(self.capacity);
        let inputs = &window.segments[..];
        slices::Call::new(buf, op, self.rank, self.size, inputs, result)
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
