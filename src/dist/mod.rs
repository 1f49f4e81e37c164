//! The process-group layer: ranks, collectives and point-to-point messages on
//! `tch` tensors, shaped after `torch.distributed`.
//!
//! Chapter code talks only to the [`ProcessGroup`] trait, so the same DDP runs
//! on any backend. The in-process backend ([`spawn`]) runs every rank as a
//! thread of this process (asynchronous all-reduces progress on a
//! communication thread per rank, and [`SimulatedLink`] can give them a
//! network's cost); try it with `cargo test --test dist`. With the `mpi`
//! feature, [`mpi`] runs every rank as a process started by `mpirun`.
//!
//! Rules every backend keeps:
//! - no call blocks forever: each has a timeout, and a rank that panics,
//!   errors or exits makes its peers' pending and later calls fail promptly
//!   with a [`DistError`] that names that rank and the operation;
//! - ranks that disagree (a different operation, shape, dtype, root,
//!   [`tagged`] name or, untagged, source location for the same call) get a
//!   [`DistError::Mismatch`] instead of a wrong answer (MPI compares in its
//!   debug mode, on by default; NCCL with `DDP_DEBUG=detail`). What no
//!   backend can catch: untagged calls with the same operation, shape and
//!   dtype made from one place (a loop) that the ranks walk in a different
//!   order (or one rank skips): they pair up and combine unrelated tensors.
//!   Tag the calls whose order matters, as the DDP library does;
//! - reductions are deterministic: every rank receives bitwise the same result.
//!
//! Here, at the root, is what every backend shares: the [`ProcessGroup`]
//! trait, [`Work`], [`ReduceOp`] and [`CommStats`] (this file), a call's
//! signature as the ranks compare it (`call.rs`), the result a caller waits
//! on (`completion.rs`), [`DistError`] (`error.rs`), the environment's
//! settings (`settings.rs`), call tags (`tag.rs`) and what a launcher told
//! this process (`launch.rs`). Each backend has its folder: [`local`], the
//! in-process backend, and `mpi/` and `nccl/` behind their features.

mod call;
mod completion;
mod error;
mod launch;
pub mod local;
#[cfg(feature = "mpi")]
pub mod mpi;
#[cfg(feature = "nccl")]
pub mod nccl;
mod settings;
mod tag;

use std::sync::Arc;
use std::time::Duration;

use tch::Tensor;

pub use crate::error_text::{cause_in_words, panic_in_words};
pub use error::{torch_error, DistError};
pub use launch::{LaunchEnv, Launcher};
pub use local::{spawn, spawn_with, LocalProcessGroup, RankFailure, SimulatedLink, SpawnError, SpawnOptions};
pub use settings::{parse_timeout_secs, timeout_from_env};
pub use tag::{current_tag, tagged};

/// Whether `kind` is a floating-point type (what `ReduceOp::Avg` needs).
pub(crate) fn is_float(kind: tch::Kind) -> bool {
    use tch::Kind::*;
    matches!(kind, Half | BFloat16 | Float | Double)
}

/// A shared handle to a process group, as chapter code holds it.
pub type Group = Arc<dyn ProcessGroup>;

/// The default time any call waits for its peers before it gives up.
/// Override it per run with [`SpawnOptions::timeout`] or with the environment
/// variable `DDP_TIMEOUT_SECS`, in seconds (handy while stepping through a
/// debugger): `DDP_TIMEOUT_SECS=600 cargo test --test chapter_03`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// How `all_reduce` and `reduce_scatter` combine the ranks' tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    /// The sum divided by the world size (floating-point tensors only).
    Avg,
    Min,
    Max,
    Product,
}

impl ReduceOp {
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Avg => "avg",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Product => "product",
        }
    }

    /// `out = before op next`, element-wise, with libtorch's operations (bf16
    /// widened, added and rounded; booleans or'ed); `out` may be `before` or
    /// `next`. An average is summed here: the caller divides once, at the
    /// end. Every backend that reduces in rank order folds through this one
    /// function, so they all give the same bits: sums and products add and
    /// multiply `next` by `before`, as the in-process backend first did.
    pub(crate) fn combine(self, before: &Tensor, next: &Tensor, out: &Tensor) -> Result<(), tch::TchError> {
        match self {
            ReduceOp::Sum | ReduceOp::Avg => _ = next.f_add_out(out, before)?,
            ReduceOp::Product => _ = next.f_mul_out(out, before)?,
            ReduceOp::Min => _ = before.f_minimum_out(out, next)?,
            ReduceOp::Max => _ = before.f_maximum_out(out, next)?,
        }
        Ok(())
    }
}

/// How many calls of each kind this rank made, and how many bytes it handed
/// over. Tests use it to prove claims such as "one all-reduce per bucket".
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CommStats {
    pub broadcast: u64,
    pub all_reduce: u64,
    pub all_gather: u64,
    pub reduce_scatter: u64,
    pub barrier: u64,
    pub send: u64,
    pub recv: u64,
    /// Bytes of the tensors this rank passed into collectives.
    pub collective_bytes: u64,
    /// Bytes this rank sent with `send`.
    pub p2p_bytes_sent: u64,
    /// Per kind, the bytes of the whole buffer each collective works on (the
    /// size NCCL's and PyTorch's benchmarks quote a collective by): the
    /// tensor of a broadcast or an all-reduce, the input of a reduce-scatter
    /// (every rank's chunks), the output of an all-gather (world size times
    /// the tensor handed in). So a reduce-scatter and the all-gather that
    /// undoes it count the same bytes. [`ring_wire_bytes`](Self::ring_wire_bytes)
    /// turns them into bytes on the wire.
    pub broadcast_bytes: u64,
    pub all_reduce_bytes: u64,
    pub all_gather_bytes: u64,
    pub reduce_scatter_bytes: u64,
}

impl CommStats {
    /// All collective calls together (point-to-point calls not included).
    pub fn collectives(&self) -> u64 {
        self.broadcast + self.all_reduce + self.all_gather + self.reduce_scatter + self.barrier
    }

    /// The bytes each rank sends over the wire for these collectives if each
    /// runs as a ring of `world_size` ranks (NCCL's and gloo's algorithm for
    /// large buffers): a reduce-scatter sends N-1 chunks of 1/N of its
    /// buffer, an all-gather the same, a pipelined broadcast about its buffer
    /// once per rank but the last, and an all-reduce is a reduce-scatter then
    /// an all-gather. So (N-1)/N per reduce-scatter, all-gather or broadcast
    /// byte, 2(N-1)/N per all-reduce byte; nothing on one rank. This is why
    /// ZeRO-2's reduce-scatter plus all-gather costs what DDP's all-reduce
    /// costs.
    pub fn ring_wire_bytes(&self, world_size: usize) -> f64 {
        let n = world_size.max(1) as f64;
        let once = (self.reduce_scatter_bytes + self.all_gather_bytes + self.broadcast_bytes) as f64;
        (n - 1.0) / n * (once + 2.0 * self.all_reduce_bytes as f64)
    }

    /// The calls and bytes made between `before` and `self` (both from one
    /// group handle, `before` the earlier).
    pub fn since(&self, before: &CommStats) -> CommStats {
        CommStats {
            broadcast: self.broadcast - before.broadcast,
            all_reduce: self.all_reduce - before.all_reduce,
            all_gather: self.all_gather - before.all_gather,
            reduce_scatter: self.reduce_scatter - before.reduce_scatter,
            barrier: self.barrier - before.barrier,
            send: self.send - before.send,
            recv: self.recv - before.recv,
            collective_bytes: self.collective_bytes - before.collective_bytes,
            p2p_bytes_sent: self.p2p_bytes_sent - before.p2p_bytes_sent,
            broadcast_bytes: self.broadcast_bytes - before.broadcast_bytes,
            all_reduce_bytes: self.all_reduce_bytes - before.all_reduce_bytes,
            all_gather_bytes: self.all_gather_bytes - before.all_gather_bytes,
            reduce_scatter_bytes: self.reduce_scatter_bytes - before.reduce_scatter_bytes,
        }
    }
}

/// A collective that has been started but may not have finished: the result
/// of [`ProcessGroup::all_reduce_async`]. Call [`Work::wait`] before reading
/// the tensor, and do not modify the tensor until then. Dropping it without
/// waiting gives up this rank's result and frees what the backend kept for
/// it; the peers still get theirs, computed from the tensor as it was handed
/// over, so even then leave it alone until they have (the tensor's contents
/// are unspecified afterwards).
#[must_use = "the tensor holds its result only after wait() returns"]
pub struct Work {
    wait: Option<Box<dyn FnOnce() -> Result<(), DistError> + Send>>,
    release: Option<Box<dyn FnOnce() + Send>>,
}

impl Work {
    /// Wraps a completion step: what a backend runs to finish a call, or what
    /// a communication hook (chapter 12) does once its collective is done.
    pub fn new(wait: impl FnOnce() -> Result<(), DistError> + Send + 'static) -> Self {
        Work { wait: Some(Box::new(wait)), release: None }
    }

    /// [`new`](Self::new), plus what to free if the handle is dropped unwaited.
    pub fn with_release(
        wait: impl FnOnce() -> Result<(), DistError> + Send + 'static,
        release: impl FnOnce() + Send + 'static,
    ) -> Self {
        Work { wait: Some(Box::new(wait)), release: Some(Box::new(release)) }
    }

    /// Blocks until the collective has finished and its result is in place.
    pub fn wait(mut self) -> Result<(), DistError> {
        self.release = None; // waiting collects the result: nothing to give up
        let wait = self.wait.take().expect("a Work is waited on at most once");
        wait()
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            release();
        }
    }
}

// ANCHOR: process_group
/// A group of ranks that run collectives together (`torch.distributed`'s
/// process group). Every rank must make the same calls in the same order.
///
/// `#[track_caller]` lets a backend see where each collective was called
/// from: an untagged call is named by that place, and ranks whose calls
/// pair up from different places get a mismatch (see `dist::tag`).
pub trait ProcessGroup: Send + Sync {
    /// This process's index in the group, from 0 to `world_size() - 1`.
    fn rank(&self) -> usize;
    /// How many ranks the group has.
    fn world_size(&self) -> usize;
    /// The backend's name, for logs ("in-process", "mpi", "nccl").
    fn backend(&self) -> &'static str;

    /// Copies `root`'s tensor into `tensor` on every rank.
    #[track_caller]
    fn broadcast(&self, tensor: &mut Tensor, root: usize) -> Result<(), DistError>;
    /// Replaces `tensor` on every rank with the reduction of all ranks' tensors.
    #[track_caller]
    fn all_reduce(&self, tensor: &mut Tensor, op: ReduceOp) -> Result<(), DistError> {
        self.all_reduce_async(tensor, op)?.wait()
    }
    /// Starts an all-reduce and returns at once; the result lands in `tensor`
    /// when the returned [`Work`] is waited on.
    #[track_caller]
    fn all_reduce_async(&self, tensor: &Tensor, op: ReduceOp) -> Result<Work, DistError>;
    /// Every rank's `tensor`, in rank order, on every rank.
    #[track_caller]
    fn all_gather(&self, tensor: &Tensor) -> Result<Vec<Tensor>, DistError>;
    /// Splits `tensor` along dimension 0 into `world_size` equal chunks,
    /// reduces chunk `i` across ranks, and returns it to rank `i`.
    #[track_caller]
    fn reduce_scatter(&self, tensor: &Tensor, op: ReduceOp) -> Result<Tensor, DistError>;
    /// Starts a [`reduce_scatter`](Self::reduce_scatter) and returns at once;
    /// this rank's chunk lands in `output` (`[rows / world_size, ...]`, the
    /// tensor's dtype) when the returned [`Work`] is waited on. Leave both
    /// alone until then. The default runs it here and now (a backend
    /// without a communication thread); the in-process backend runs it on
    /// its communication thread, as it does an asynchronous all-reduce.
    #[track_caller]
    fn reduce_scatter_async(
        &self,
        tensor: &Tensor,
        op: ReduceOp,
        output: &Tensor,
    ) -> Result<Work, DistError> {
        let chunk = self.reduce_scatter(tensor, op)?;
        let mut output = output.shallow_clone();
        let rank = self.rank();
        tch::no_grad(|| output.f_copy_(&chunk)).map_err(|cause| DistError::Torch {
            rank,
            op: "copying the reduce-scattered chunk into its output".into(),
            cause,
        })?;
        Ok(Work::new(|| Ok(())))
    }
    /// Returns once every rank has called it.
    #[track_caller]
    fn barrier(&self) -> Result<(), DistError>;
    /// Sends a copy of `tensor` to rank `dst`. Sends are buffered, so this
    /// returns without waiting for the matching `recv`. (On NCCL the copy
    /// waits on this rank until its next `recv` or collective, which then
    /// waits until it is received: see `dist::nccl`.)
    fn send(&self, tensor: &Tensor, dst: usize) -> Result<(), DistError>;
    /// Receives the next tensor that rank `src` sent to this rank into
    /// `tensor`, which must have the same shape and dtype.
    fn recv(&self, tensor: &mut Tensor, src: usize) -> Result<(), DistError>;

    /// Makes a sub-group of the ranks listed (`torch.distributed.new_group`).
    /// Every rank of this group must call it, with the same list, at the same
    /// point of its program. Members get `Some(group)`, in which they are
    /// renumbered 0, 1, ... in the order of `ranks`; the others get `None`.
    /// Collectives in the sub-group involve its members only.
    ///
    /// The default says that the backend has no sub-groups.
    #[track_caller]
    fn new_group(&self, ranks: &[usize]) -> Result<Option<Group>, DistError> {
        let detail = format!("the {} backend cannot make sub-groups (asked for {ranks:?})", self.backend());
        Err(DistError::Invalid { rank: self.rank(), op: "new_group".into(), detail })
    }

    /// A zeroed, flat tensor of `numel` elements for all-reduces that this
    /// group may carry faster: PyTorch's and NCCL's "symmetric memory". A
    /// collective: every rank calls it with the same sizes, in the same
    /// order. The MPI backend places CPU buffers in memory that every rank
    /// of the node maps, and reduces them there without copying
    /// (`src/dist/mpi/shm/regions.rs`); the default is a plain tensor.
    #[track_caller]
    fn alloc_buffer(&self, numel: usize, kind: tch::Kind, device: tch::Device) -> Result<Tensor, DistError> {
        let op = "alloc_buffer".to_string();
        Tensor::f_zeros([numel as i64], (kind, device)).map_err(|cause| DistError::Torch {
            rank: self.rank(),
            op,
            cause,
        })
    }

    /// What this rank has sent so far through this group handle.
    fn stats(&self) -> CommStats;
}
// ANCHOR_END: process_group
