//! The NCCL backend: collectives on CUDA tensors, one rank per GPU, through
//! NVIDIA's NCCL (what `init_process_group(backend="nccl")` uses). Build
//! with `--features nccl`; it loads NCCL and the CUDA driver at run time,
//! so the crate builds everywhere, and [`available`] says why not where
//! they are missing.
//!
//! Three ways to start ranks:
//! - [`spawn_on_gpus`]: one thread per GPU of this machine (like
//!   [`super::spawn`], which it mirrors);
//! - [`bootstrap`]: over a group that already exists (MPI's, when
//!   `mpirun` started one process per GPU): rank 0 makes NCCL's unique id
//!   and broadcasts it, and every rank joins on its local GPU;
//! - [`join`]: by hand, with an id handed around some other way.
//!
//! How it orders its work against libtorch's (docs/decisions.md says more):
//! libtorch queues kernels on the GPU's default stream; each group has its
//! own stream for NCCL. A call records an event on the default stream and
//! makes its stream wait for it (so NCCL reads the tensor only after the
//! kernels that wrote it), queues the collective, and records a second
//! event behind it. Launching does not block the host; `Work::wait` polls
//! that event, so backward keeps queueing kernels while NCCL runs.
//!
//! The same rules as the other backends, as far as NCCL allows:
//! - every call has a deadline (`DDP_TIMEOUT_SECS`); past it the
//!   communicator is aborted (`ncclCommAbort`) and the call, and every
//!   later one, fails naming it. The communicator is non-blocking, so no
//!   NCCL call can hang the host first. The aborted calls' tensors are kept
//!   until the GPU is past them (`kept.rs`), and a call whose event
//!   completes after an abort fails too (its kernel may have stopped early);
//! - ranks started by `spawn_on_gpus` learn at once that a peer failed; under
//!   `mpirun`, a rank that fails ends the job;
//! - with `DDP_DEBUG=detail` every collective first all-gathers its
//!   signature (operation, dtype, shape, root, tag), and every send is
//!   preceded by its shape and dtype, so ranks that disagree get a
//!   `Mismatch`. Off by default here, unlike on the other backends: each
//!   check makes the host wait for the GPU, which undoes the overlap;
//! - a send returns at once, as on the other backends, but it is only
//!   queued: NCCL posts it with this rank's next receive (so that a ring of
//!   sends cannot deadlock), or before its next collective. A send must
//!   therefore be received before the receiver's next collective.
//!
//! Not yet verified on a GPU: see the book's GPU chapter for what ran where.
//! Files: `group.rs`, `collectives.rs` and `p2p.rs` (the `ProcessGroup`),
//! `kept.rs` (the tensors of failed calls, kept while the GPU may still use
//! them), `ffi.rs` (NCCL), `cuda.rs` (the CUDA driver). Tests: `cargo test --features nccl --test nccl`.

mod cuda;
mod ffi;
mod group;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tch::{Device, Kind, Tensor};

pub use group::NcclProcessGroup;

use super::settings::signatures_from_env;
use super::{timeout_from_env, DistError, Group, ProcessGroup};
use crate::error_text::panic_message;
use group::JobWatch;

/// How many GPUs NCCL can use here, or, in words, why none.
pub fn available() -> Result<usize, String> {
    ffi::recent_enough()?;
    cuda::cuda_library()?;
    match cuda::device_count()? {
        0 => Err("the CUDA driver is installed, but it sees no GPU (is CUDA_VISIBLE_DEVICES empty?)".into()),
        gpus => Ok(gpus),
    }
}

/// The NCCL that was loaded, as "2.28.9"; needs NCCL only, no GPU.
pub fn version() -> Result<String, String> {
    ffi::nccl_version().map(ffi::version_text)
}

/// NCCL's unique id: what every rank needs to join one communicator.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId(pub ffi::IdBytes);

impl UniqueId {
    /// A fresh id. Works without a GPU. The process that makes it must keep
    /// running until every rank has joined (NCCL listens in it).
    pub fn new() -> Result<UniqueId, String> {
        ffi::unique_id().map(UniqueId)
    }
}

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UniqueId({:02x?}..)", &self.0[..8])
    }
}

/// Joins the communicator `id` names as `rank` of `world`, on GPU
/// `cuda:ordinal`. Every rank must call it; it returns once all have.
pub fn join(rank: usize, world: usize, ordinal: usize, id: &UniqueId) -> Result<NcclProcessGroup, DistError> {
    let fail = |detail: String| DistError::Invalid { rank, op: "joining NCCL".into(), detail };
    let gpus = available().map_err(fail)?;
    if rank >= world || ordinal >= gpus {
        return Err(fail(format!(
            "rank {rank} of {world} on cuda:{ordinal}, but this machine has {gpus} GPU(s)"
        )));
    }
    let timeout = timeout_from_env().map_err(fail)?;
    let debug = signatures_from_env(false).map_err(fail)?;
    NcclProcessGroup::join(rank, world, ordinal, &id.0, timeout, debug, None)
}

/// An NCCL group with the same ranks as `over` (a CPU group, such as MPI's),
/// each on GPU `cuda:ordinal`, usually its local rank on its machine. Rank 0
/// makes the unique id and broadcasts it over `over`.
pub fn bootstrap(over: &dyn ProcessGroup, ordinal: usize) -> Result<NcclProcessGroup, DistError> {
    let rank = over.rank();
    let mut id = Tensor::zeros([128], (Kind::Uint8, Device::Cpu));
    if rank == 0 {
        let made =
            UniqueId::new().map_err(|detail| DistError::Invalid { rank, op: "NCCL's id".into(), detail })?;
        id = Tensor::from_slice(&made.0);
    }
    over.broadcast(&mut id, 0)?;
    let bytes =
        Vec::<u8>::try_from(&id).map_err(|cause| DistError::Torch { rank, op: "NCCL's id".into(), cause })?;
    join(rank, over.world_size(), ordinal, &UniqueId(bytes.try_into().expect("128 bytes")))
}

/// Runs `body` on `world` ranks, one thread per GPU (rank r on `cuda:r`),
/// joined in one NCCL communicator; their results in rank order. NCCL
/// refuses two ranks on one GPU, so `world` may not exceed the GPU count.
/// A rank that fails or panics makes the others' pending calls fail at once.
/// Every call waits at most `DDP_TIMEOUT_SECS` (60 s when unset).
pub fn spawn_on_gpus<T, F>(world: usize, body: F) -> Result<Vec<T>, String>
where
    T: Send,
    F: Fn(Group) -> anyhow::Result<T> + Sync,
{
    available()?; // first: why this machine cannot run NCCL at all
    spawn_on_gpus_with_timeout(world, timeout_from_env()?, body)
}

/// [`spawn_on_gpus`], with every call waiting at most `timeout` (which must
/// not be zero) whatever `DDP_TIMEOUT_SECS` says.
pub fn spawn_on_gpus_with_timeout<T, F>(world: usize, timeout: Duration, body: F) -> Result<Vec<T>, String>
where
    T: Send,
    F: Fn(Group) -> anyhow::Result<T> + Sync,
{
    let gpus = available()?;
    if world == 0 || world > gpus {
        return Err(format!(
            "asked for {world} ranks on {gpus} GPU(s): NCCL needs one GPU per rank; ask for 1 to {gpus}"
        ));
    }
    if timeout.is_zero() {
        return Err("a timeout of zero would fail every call: give a positive duration".into());
    }
    let debug = signatures_from_env(false)?;
    let id = UniqueId::new()?;
    let job = Arc::new(JobWatch::default());
    let failures = Mutex::new(Vec::new());
    let results: Vec<Option<T>> = std::thread::scope(|scope| {
        let ranks: Vec<_> = (0..world)
            .map(|rank| {
                let (job, body, failures) = (job.clone(), &body, &failures);
                scope.spawn(move || {
                    let run = || -> anyhow::Result<T> {
                        let group = NcclProcessGroup::join(
                            rank,
                            world,
                            rank,
                            &id.0,
                            timeout,
                            debug,
                            Some(job.clone()),
                        )?;
                        body(Arc::new(group))
                    };
                    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(run));
                    let why = match outcome {
                        Ok(Ok(value)) => return Some(value),
                        Ok(Err(error)) => format!("returned an error: {error:#}"),
                        Err(payload) => format!("panicked: {}", panic_message(&*payload)),
                    };
                    job.failed.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert((rank, why.clone()));
                    failures.lock().unwrap_or_else(|p| p.into_inner()).push(format!("rank {rank} {why}"));
                    None
                })
            })
            .collect();
        ranks.into_iter().map(|rank| rank.join().ok().flatten()).collect()
    });
    let failures = failures.into_inner().unwrap_or_else(|p| p.into_inner());
    match failures.is_empty() {
        true => Ok(results.into_iter().map(|r| r.expect("every rank succeeded")).collect()),
        false => Err(failures.join("\n")),
    }
}
