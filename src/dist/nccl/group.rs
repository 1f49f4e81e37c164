//! `NcclProcessGroup`, the `ProcessGroup` of one
//! rank on one GPU. Each call checks its tensors, (in debug mode) compares
//! its signature with every rank's, queues the NCCL call on the group's own
//! stream behind libtorch's work, and waits for its event with a deadline.
//! Try it: `cargo test --features nccl --test nccl -- --include-ignored` on
//! a machine with a GPU.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cudarc::nccl::result as nccl;
use tch::{Device, Kind, Tensor};

use super::cuda::{self, Event};
use super::ffi::{self, Comm, IdBytes, State};
use crate::dist::call::{Call, Op};
use crate::dist::{CommStats, DistError};

/// What the ranks started together by `spawn_on_gpus` share: the first
/// rank that failed, so that the others stop waiting for it.
#[derive(Default)]
pub(crate) struct JobWatch {
    pub failed: Mutex<Option<(usize, String)>>,
}

/// The first other rank of the job that failed, and how.
fn peer_failure(job: Option<&Arc<JobWatch>>, rank: usize) -> Option<(usize, String)> {
    let failed = job?.failed.lock().unwrap_or_else(|p| p.into_inner()).clone();
    failed.filter(|(peer, _)| *peer != rank)
}

/// The same, in words, for a wait that stops on it.
fn peer_failure_text(job: Option<&Arc<JobWatch>>, rank: usize) -> Option<String> {
    peer_failure(job, rank).map(|(peer, why)| format!("rank {peer} {why}"))
}

/// What a `Work` handle needs after the call returned.
struct Inner {
    comm: Mutex<Comm>,
    /// Why the communicator was aborted, once it was.
    broken: Mutex<Option<String>>,
    /// Calls that failed after they were queued. `ncclCommAbort` returns
    /// while their kernels may still run (or not have started: the stream
    /// waits for libtorch's work first), so their tensors must not go back
    /// to libtorch's caching allocator, which would hand the memory to a new
    /// tensor. They are kept while the group lives (kept.rs).
    kept: Mutex<Vec<Pending>>,
    job: Option<Arc<JobWatch>>,
    timeout: Duration,
    rank: usize,
}

/// One queued NCCL call: its completion event, and the tensors it reads or
/// writes, kept alive (libtorch must not reuse their memory) until it is done.
struct Pending {
    done: Event,
    _keep: Vec<Tensor>,
    /// When the call was made: its deadline counts from here, not from
    /// when a caller waits for it (an asynchronous all-reduce is waited for
    /// at the end of backward).
    called: Instant,
}

/// One rank of an NCCL communicator, on one GPU. Make it with
/// [`super::join`], [`super::bootstrap`] or [`super::spawn_on_gpus`].
pub struct NcclProcessGroup {
    inner: Arc<Inner>,
    world: usize,
    ordinal: usize,
    debug: bool,
    stats: Mutex<CommStats>,
    /// Sends not yet posted (see p2p.rs).
    sends: Mutex<Vec<p2p::QueuedSend>>,
}

const SIGNATURE_BYTES: usize = 256;

impl NcclProcessGroup {
    pub(crate) fn join(
        rank: usize,
        world: usize,
        ordinal: usize,
        id: &IdBytes,
        timeout: Duration,
        debug: bool,
        job: Option<Arc<JobWatch>>,
    ) -> Result<Self, DistError> {
        let op = format!("joining the NCCL communicator on cuda:{ordinal}");
        let broken = |cause: String| DistError::Broken { rank, op: op.clone(), cause };
        let mut comm = Comm::start_join(ordinal, rank, world, id).map_err(broken)?;
        if let Err(cause) = comm.settle(Instant::now() + timeout, &|| peer_failure_text(job.as_ref(), rank)) {
            comm.abort();
            return Err(broken(match cause.as_str() {
                "deadline" => format!("not every one of the {world} ranks joined within {timeout:?}"),
                _ => cause,
            }));
        }
        let (broken, kept) = (Mutex::default(), Mutex::default());
        let inner = Inner { comm: Mutex::new(comm), broken, kept, job, timeout, rank };
        let (stats, sends) = (Mutex::default(), Mutex::default());
        Ok(NcclProcessGroup { inner: Arc::new(inner), world, ordinal, debug, stats, sends })
    }

    /// The GPU this rank's tensors must be on.
    pub fn device(&self) -> Device {
        Device::Cuda(self.ordinal)
    }

    fn invalid(&self, op: &str, detail: String) -> DistError {
        DistError::Invalid { rank: self.inner.rank, op: op.to_string(), detail }
    }

    fn torch(&self, op: &str) -> impl Fn(tch::TchError) -> DistError + '_ {
        let op = op.to_string();
        move |cause| DistError::Torch { rank: self.inner.rank, op: op.clone(), cause }
    }

    /// Fails unless the tensor is defined, on this rank's GPU (or the CPU:
    /// see [`on_gpu`]), of a type NCCL has.
    fn check(&self, op: &str, tensor: &Tensor) -> Result<(), DistError> {
        if !tensor.defined() {
            return Err(self.invalid(op, "the tensor is undefined (a gradient never computed?)".into()));
        }
        if tensor.device() != self.device() && tensor.device() != Device::Cpu {
            let detail = format!(
                "the nccl backend works on tensors on this rank's GPU, {:?}; this one is on {:?}: \
                 move it with .to_device(group.device())",
                self.device(),
                tensor.device()
            );
            return Err(self.invalid(op, detail));
        }
        match ffi::data_type(tensor.kind()) {
            Some(_) => Ok(()),
            None => Err(self.invalid(op, format!("NCCL has no type for {:?} tensors", tensor.kind()))),
        }
    }

    // ANCHOR: launch
    /// Queues `calls` behind everything libtorch has queued so far, then an
    /// event behind them. On any failure the communicator is aborted.
    fn launch(
        &self,
        op: &str,
        keep: Vec<Tensor>,
        calls: impl FnOnce(&Comm) -> Result<(), String>,
    ) -> Result<Pending, DistError> {
        let called = Instant::now();
        self.inner.open(op)?;
        let comm = self.inner.comm.lock().unwrap_or_else(|p| p.into_inner());
        let queued = (|| {
            comm.device.bind()?;
            Event::record_on(cuda::torch_stream())?.block(comm.stream)?;
            calls(&comm)?;
            let peer_failed = || peer_failure_text(self.inner.job.as_ref(), self.inner.rank);
            comm.settle(Instant::now() + self.inner.timeout, &peer_failed)?;
            Event::record_on(comm.stream)
        })();
        drop(comm);
        match queued {
            Ok(done) => Ok(Pending { done, _keep: keep, called }),
            Err(cause) => {
                let error = self.inner.fail(op, format!("queueing it failed: {cause}"));
                self.inner.keep_queued(keep); // part of the call may have been queued
                Err(error)
            }
        }
    }
    // ANCHOR_END: launch

    /// In debug mode, every rank learns every rank's call (an all-gather of
    /// their descriptions), and all fail with a mismatch if they differ.
    fn agree(&self, call: &Call) -> Result<(), DistError> {
        if !self.debug || self.world == 1 {
            return Ok(());
        }
        let mine = call.signature();
        let mut bytes = mine.as_bytes().to_vec();
        bytes.resize(SIGNATURE_BYTES, 0);
        let input = Tensor::from_slice(&bytes).to_device(self.device());
        let gathered = self.gather_bytes("signature exchange", &input)?.to_device(Device::Cpu);
        let all = Vec::<u8>::try_from(gathered.reshape([-1])).map_err(self.torch("signature exchange"))?;
        for (rank, theirs) in all.chunks(SIGNATURE_BYTES).enumerate() {
            if theirs != bytes.as_slice() {
                let theirs = String::from_utf8_lossy(theirs).trim_end_matches('\0').to_string();
                let detail = format!("rank {rank} called {theirs}, this rank called {mine}");
                return Err(DistError::Mismatch { rank: self.inner.rank, op: mine, detail });
            }
        }
        Ok(())
    }

    fn gather_bytes(&self, op: &str, input: &Tensor) -> Result<Tensor, DistError> {
        let output = Tensor::empty([self.world as i64, input.numel() as i64], (Kind::Uint8, self.device()));
        let (send, receive, count) = (ffi::pointer(input), ffi::pointer(&output), input.numel());
        let byte = ffi::data_type(Kind::Uint8).expect("bytes");
        let pending = self.launch(op, vec![input.shallow_clone(), output.shallow_clone()], |comm| {
            // SAFETY: both buffers are on this GPU and kept alive by `pending`.
            comm.queue(|c, s| unsafe { nccl::all_gather(send, receive, count, byte, c, s) })
        })?;
        self.inner.finish(op, pending)?;
        Ok(output)
    }

    fn count(&self, tensor: &Tensor, add: impl FnOnce(&mut CommStats)) {
        let mut stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        add(&mut stats);
        stats.collective_bytes += (tensor.numel() * tensor.kind().elt_size_in_bytes()) as u64;
    }

    #[track_caller]
    fn call(&self, op: Op, tensor: &Tensor) -> Call {
        Call::here(op, tensor.size(), Some(tensor.kind()))
    }
}

impl Inner {
    fn open(&self, op: &str) -> Result<(), DistError> {
        match &*self.broken.lock().unwrap_or_else(|p| p.into_inner()) {
            None => Ok(()),
            Some(cause) => Err(DistError::Broken { rank: self.rank, op: op.into(), cause: cause.clone() }),
        }
    }

    /// Aborts the communicator: this call and every later one fail.
    fn fail(&self, op: &str, cause: String) -> DistError {
        self.comm.lock().unwrap_or_else(|p| p.into_inner()).abort();
        let mut broken = self.broken.lock().unwrap_or_else(|p| p.into_inner());
        let cause = broken.get_or_insert(format!("{op}: {cause}")).clone();
        DistError::Broken { rank: self.rank, op: op.into(), cause }
    }

    // ANCHOR: finish
    /// Waits for `pending` to complete on the GPU. If it fails, the
    /// communicator is aborted, and the call's tensors are kept: the GPU
    /// may still run the aborted kernels on them.
    fn finish(&self, op: &str, pending: Pending) -> Result<(), DistError> {
        let result = self.wait_for(op, &pending);
        if result.is_err() {
            self.keep(pending);
        }
        result
    }

    /// The wait: the call's event, the communicator's own errors, a peer's
    /// failure, and the deadline, `timeout` after the call was made.
    fn wait_for(&self, op: &str, pending: &Pending) -> Result<(), DistError> {
        let (started, deadline) = (Instant::now(), pending.called + self.timeout);
        // The waiting thread may never have touched this GPU (a Work handed
        // to another thread): event queries need the context current.
        if let Err(cause) = self.comm.lock().unwrap_or_else(|p| p.into_inner()).device.bind() {
            return Err(self.fail(op, cause));
        }
        loop {
            match pending.done.is_done() {
                // Done, but after an abort (by a call that failed meanwhile)
                // the kernel may have stopped half-way: no result to trust.
                Ok(true) => return self.open(op),
                Ok(false) => {}
                Err(cause) => return Err(self.fail(op, cause)),
            }
            if let State::Failed(cause) = self.comm.lock().unwrap_or_else(|p| p.into_inner()).state() {
                return Err(self.fail(op, cause));
            }
            if let Some((peer, reason)) = peer_failure(self.job.as_ref(), self.rank) {
                self.fail(op, format!("rank {peer} {reason}"));
                return Err(DistError::PeerGone { rank: self.rank, op: op.into(), peer, reason });
            }
            if Instant::now() >= deadline {
                let cause = format!(
                    "no result within {:?} (DDP_TIMEOUT_SECS); NCCL cannot say which rank is \
                     missing, so the communicator was aborted",
                    self.timeout
                );
                return Err(self.fail(op, cause));
            }
            // Spin briefly (most collectives end within microseconds), then doze.
            match started.elapsed() < Duration::from_millis(1) {
                true => std::thread::yield_now(),
                false => std::thread::sleep(Duration::from_micros(50)),
            }
        }
    }
    // ANCHOR_END: finish
}

/// The tensor itself if NCCL can write into it; else a contiguous copy on
/// `gpu`, and `true`: copy the result back. CPU tensors are staged through
/// the GPU like this, so that the library's small bookkeeping collectives
/// (replica fingerprints, unused-parameter masks) work on every backend, as
/// PyTorch's object collectives do; gradients and buckets live on the GPU.
fn on_gpu(tensor: &Tensor, gpu: Device) -> Result<(Tensor, bool), tch::TchError> {
    match (tensor.device() == gpu, tensor.is_contiguous()) {
        (true, true) => Ok((tensor.shallow_clone(), false)),
        _ => Ok((tch::no_grad(|| tensor.f_to_device(gpu)?.f_contiguous())?, true)),
    }
}

#[path = "collectives.rs"]
mod collectives;
#[path = "kept.rs"]
mod kept;
#[path = "p2p.rs"]
mod p2p;
