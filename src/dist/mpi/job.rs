//! One call of the MPI backend as the communication
//! thread carries it: what was asked (`Action`), the MPI requests in flight
//! for it, and the `Done` slot where the caller finds the result. Try it:
//! `cargo test --features mpi --test mpi`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tch::Tensor;

use super::ffi::{self, Comm, Reduction, Request};
use super::ordered::Ordered;
use crate::dist::{DistError, ReduceOp};

/// The longest signature exchanged; longer ones are cut (their start still
/// names the operation, dtype and shape).
pub(crate) const SIGNATURE_BYTES: usize = 1024;

/// What a call asks for. Every tensor is a contiguous CPU tensor that the
/// job owns (a shallow clone of the caller's, or a copy) until it ends.
/// `AllocBuffer` asks for `bytes` in memory every rank of the node maps, if
/// `shareable` (a CPU tensor of a dtype MPI carries) and the node allows it
/// (`shm/regions.rs`); the engine makes it once every rank agreed.
pub(crate) enum Action {
    Broadcast { buf: Tensor, root: usize },
    AllReduce { buf: Tensor, op: ReduceOp },
    AllGather { input: Tensor, output: Tensor },
    ReduceScatter { input: Tensor, output: Tensor, op: ReduceOp },
    Barrier,
    NewGroup { ranks: Vec<usize> },
    AllocBuffer { bytes: usize, shareable: bool },
    Send { data: Tensor, dst: usize },
    Recv { into: Tensor, src: usize },
}

/// A call handed to the communication thread.
pub(crate) struct Job {
    /// Which communicator (an index into the engine's list).
    pub comm: usize,
    pub action: Action,
    /// The call in words, for errors: "all_reduce(sum) of Float[4] (call #3)".
    pub name: String,
    /// What every peer's call must equal (debug mode, and always for
    /// new_group and point-to-point shapes); `None` skips the exchange.
    pub signature: Option<String>,
    pub done: Arc<Done>,
    /// When the caller handed it over: its deadline counts from here, not
    /// from when the communication thread takes it (it may be busy).
    pub queued: Instant,
}

/// What a finished call gives back.
pub(crate) enum Reply {
    Done,
    /// new_group: for members, the new communicator's index, this
    /// process's rank in it and its members' world ranks.
    Group(Option<(usize, usize, Vec<usize>)>),
    /// alloc_buffer: the address of this rank's buffer in the node's shared
    /// memory, or `None` where the caller makes a plain tensor.
    Buffer(Option<usize>),
}

/// Where the communication thread leaves a call's result for its caller.
pub(crate) type Done = crate::dist::completion::Completion<Reply>;

/// A job on the communication thread, with its requests in flight. Buffers
/// live here until every request that reads or writes them has completed.
pub(crate) struct Active {
    pub job: Job,
    pub deadline: Instant,
    /// Own signature (sent to every peer) and each peer's, as received.
    pub own_signature: Vec<u8>,
    pub peer_signatures: Vec<(usize, Vec<u8>, Request)>,
    /// Requests that must complete before the job ends: signature sends,
    /// then the data transfer itself.
    pub requests: Vec<Request>,
    /// Bytes the data receive brought (point-to-point only).
    pub received: Option<usize>,
    /// The result, when it was decided before the requests completed (a
    /// mismatch found in the signatures, a new group).
    pub preset: Option<Result<Reply, DistError>>,
    /// An all-reduce through the node's shared memory (`shm.rs`): where it is.
    pub shm: Option<super::shm::progress::Progress>,
    /// A reduction in rank order over messages (`ordered.rs`): where it is.
    pub ordered: Option<Ordered>,
}

impl Active {
    /// The job, due `timeout` after its caller queued it.
    pub fn new(job: Job, timeout: Duration) -> Self {
        let mut own_signature = job.signature.clone().unwrap_or_default().into_bytes();
        own_signature.truncate(SIGNATURE_BYTES);
        let deadline = job.queued + timeout;
        Active {
            job,
            deadline,
            own_signature,
            peer_signatures: vec![],
            requests: vec![],
            received: None,
            preset: None,
            shm: None,
            ordered: None,
        }
    }

    /// Sends this call's signature to `peer` (kept until the send completes).
    pub fn send_signature(&mut self, peer: usize, tag: i32, comm: Comm) -> Result<(), String> {
        let own = &self.own_signature;
        // SAFETY: the buffer lives in `self` until the request completes.
        self.requests.push(unsafe { ffi::isend(own.as_ptr().cast(), own.len(), peer, tag, comm)? });
        Ok(())
    }

    /// Posts the receive of `peer`'s signature for this call.
    pub fn receive_signature(&mut self, peer: usize, tag: i32, comm: Comm) -> Result<(), String> {
        let mut theirs = vec![0u8; SIGNATURE_BYTES];
        // SAFETY: the heap block lives in `self` (moving the vector does not
        // move it) until the request completes.
        let request = unsafe { ffi::irecv(theirs.as_mut_ptr().cast(), SIGNATURE_BYTES, peer, tag, comm)? };
        self.peer_signatures.push((peer, theirs, request));
        Ok(())
    }

    /// Tests every signature receive; true once all have arrived.
    pub fn signatures_arrived(&mut self) -> Result<bool, String> {
        let mut all = true;
        for (_, buffer, request) in &mut self.peer_signatures {
            match ffi::test(request)? {
                Some(len) if len > 0 => buffer.truncate(len),
                Some(_) => {}
                None => all = false,
            }
        }
        Ok(all)
    }

    /// The peers whose signatures have not arrived.
    pub fn silent_peers(&self) -> Vec<usize> {
        // MPI sets a request to null when a test finds it complete.
        self.peer_signatures.iter().filter(|(_, _, r)| !ffi::is_null(r)).map(|(p, _, _)| *p).collect()
    }

    /// The first peer (in rank order) whose signature differs from
    /// `reference`, with what it sent.
    pub fn first_difference(&self, reference: &[u8]) -> Option<(usize, String)> {
        let mut all: Vec<(usize, &[u8])> =
            self.peer_signatures.iter().map(|(p, b, _)| (*p, b.as_slice())).collect();
        all.sort_by_key(|(p, _)| *p);
        all.into_iter()
            .find(|(_, theirs)| *theirs != reference)
            .map(|(peer, theirs)| (peer, String::from_utf8_lossy(theirs).into_owned()))
    }

    /// Posts the data transfer of the job's action on `comm`, where it is
    /// the `index`th collective (point-to-point calls pass 0).
    pub fn post(&mut self, comm: Comm, index: u64, (rank, size): (usize, usize)) -> Result<(), String> {
        use Action::*;
        let kind_of =
            |t: &Tensor| ffi::datatype(t.kind()).ok_or_else(|| format!("MPI cannot carry {:?}", t.kind()));
        let requests = &mut self.requests;
        // SAFETY: every tensor below is owned by the job until it ends.
        unsafe {
            match &self.job.action {
                Broadcast { buf, root } => ffi::ibcast(buf, kind_of(buf)?, *root, comm, requests)?,
                AllReduce { buf, op } => match ffi::reduction(buf.kind(), *op)? {
                    Reduction::Mpi(reduce) => ffi::iallreduce(buf, kind_of(buf)?, reduce, comm, requests)?,
                    Reduction::InRankOrder => {
                        self.ordered = Some(Ordered::start(buf, comm, (rank, size), index, requests)?);
                    }
                },
                AllGather { input, output } => {
                    ffi::iallgather(input, output, kind_of(input)?, comm, requests)?
                }
                // Every reduce-scatter, whatever its dtype: MPI has no
                // reduce-scatter of more than 2^31 - 1 elements per rank.
                ReduceScatter { input, .. } => {
                    self.ordered = Some(Ordered::start(input, comm, (rank, size), index, requests)?);
                }
                Barrier => requests.push(ffi::ibarrier(comm)?),
                // Made by the engine, blocking, after agreement.
                NewGroup { .. } | AllocBuffer { .. } => {}
                Send { data, dst } => {
                    let at = data.data_ptr().cast();
                    ffi::isend_all(at, byte_len(data), *dst, ffi::TAG_P2P_DATA, comm, requests)?
                }
                Recv { into, src } => {
                    let at = into.data_ptr().cast();
                    ffi::irecv_all(at, byte_len(into), *src, ffi::TAG_P2P_DATA, comm, requests)?
                }
            }
        }
        Ok(())
    }

    /// Tests the requests; true once all have completed (and, for a
    /// reduction in rank order, once its last phase has).
    pub fn finished(&mut self) -> Result<bool, String> {
        let mut all = self.signatures_arrived()?; // a receive's signature travels apart
        let is_recv = matches!(self.job.action, Action::Recv { .. });
        for request in &mut self.requests {
            if ffi::is_null(request) {
                continue; // completed at an earlier test
            }
            match ffi::test(request)? {
                // A receive's requests are its data's pieces: count their bytes.
                Some(bytes) if is_recv => *self.received.get_or_insert(0) += bytes,
                Some(_) => {}
                None => all = false,
            }
        }
        let (Some(ordered), true) = (&mut self.ordered, all) else { return Ok(all) };
        let (input, op, output) = match &self.job.action {
            Action::AllReduce { buf, op } => (buf, *op, None),
            Action::ReduceScatter { input, output, op } => (input, *op, Some(output)),
            _ => unreachable!("only all-reduces and reduce-scatters are reduced in rank order"),
        };
        // SAFETY: the action's tensors and `ordered` live in `self` until it ends.
        unsafe { ordered.advance(input, op, output, &mut self.requests) }
    }
}

/// How many bytes a contiguous tensor's elements take.
pub(crate) fn byte_len(tensor: &Tensor) -> usize {
    tensor.numel() * tensor.kind().elt_size_in_bytes()
}
