//! A process group that changes some calls of a real group and forwards
//! every other one to it, for tests and for two examples that include this
//! file with `#[path]`. What changes is an [`Intercept`]: its methods get
//! the real group and, by default, just call it, so an intercept writes
//! only the calls it changes.
//!
//! Users: chapter 6's `waiting.rs` delivers an all-reduce's sum only at the
//! wait, and `tests/train.rs` makes every all-reduce do nothing (both with
//! [`ReplaceAllReduce`]); chapter 1's `waiting_sends.rs` makes a send wait
//! for its receive; `bench_overlap --timeline` notes when each all-reduce
//! completed (`examples/support/timed_group.rs`); the ring figure reads the
//! chunks before every step (`examples/figures/ch01_ring.rs`); chapter 11's
//! `step_bucket.rs` gives `reduce_scatter` NCCL's way of averaging;
//! `counting.rs` notes the bytes of every collective call (chapters 11 and
//! 14); the PyTorch
//! oracle adds bf16 sums in gloo's order (`tests/torch_oracle/gloo_order.rs`).

use ddp_workbook::dist::{CommStats, DistError, Group, ProcessGroup, ReduceOp, Work};
use ddp_workbook::tch::Tensor;

/// The calls a [`Forwarding`] group lets its user change; each one gets the
/// real group, `inner`, and forwards to it unless overridden. The blocking
/// `all_reduce` goes through `all_reduce_async` (it waits on its `Work`).
pub trait Intercept: Send + Sync {
    fn all_reduce_async(&self, inner: &Group, tensor: &Tensor, op: ReduceOp) -> Result<Work, DistError> {
        inner.all_reduce_async(tensor, op)
    }
    fn reduce_scatter(&self, inner: &Group, tensor: &Tensor, op: ReduceOp) -> Result<Tensor, DistError> {
        inner.reduce_scatter(tensor, op)
    }
    fn all_gather(&self, inner: &Group, tensor: &Tensor) -> Result<Vec<Tensor>, DistError> {
        inner.all_gather(tensor)
    }
    fn send(&self, inner: &Group, tensor: &Tensor, dst: usize) -> Result<(), DistError> {
        inner.send(tensor, dst)
    }
    fn recv(&self, inner: &Group, tensor: &mut Tensor, src: usize) -> Result<(), DistError> {
        inner.recv(tensor, src)
    }
}

pub struct Forwarding<I> {
    pub inner: Group,
    /// What `backend()` says, for error messages.
    pub name: &'static str,
    pub intercept: I,
}

impl<I: Intercept> ProcessGroup for Forwarding<I> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn world_size(&self) -> usize {
        self.inner.world_size()
    }
    fn backend(&self) -> &'static str {
        self.name
    }
    fn broadcast(&self, tensor: &mut Tensor, root: usize) -> Result<(), DistError> {
        self.inner.broadcast(tensor, root)
    }
    fn all_reduce_async(&self, tensor: &Tensor, op: ReduceOp) -> Result<Work, DistError> {
        self.intercept.all_reduce_async(&self.inner, tensor, op)
    }
    fn all_gather(&self, tensor: &Tensor) -> Result<Vec<Tensor>, DistError> {
        self.intercept.all_gather(&self.inner, tensor)
    }
    fn reduce_scatter(&self, tensor: &Tensor, op: ReduceOp) -> Result<Tensor, DistError> {
        self.intercept.reduce_scatter(&self.inner, tensor, op)
    }
    fn barrier(&self) -> Result<(), DistError> {
        self.inner.barrier()
    }
    fn send(&self, tensor: &Tensor, dst: usize) -> Result<(), DistError> {
        self.intercept.send(&self.inner, tensor, dst)
    }
    fn recv(&self, tensor: &mut Tensor, src: usize) -> Result<(), DistError> {
        self.intercept.recv(&self.inner, tensor, src)
    }
    fn stats(&self) -> CommStats {
        self.inner.stats()
    }
}

/// A plain function that replaces the all-reduce; it gets the real group.
pub type AllReduceAsync = fn(&Group, &Tensor, ReduceOp) -> Result<Work, DistError>;

/// An intercept that replaces the all-reduce with `F` (a function, or a
/// closure with state of its own) and keeps every other call.
pub struct ReplaceAllReduce<F = AllReduceAsync>(pub F);

impl<F> Intercept for ReplaceAllReduce<F>
where
    F: Fn(&Group, &Tensor, ReduceOp) -> Result<Work, DistError> + Send + Sync,
{
    fn all_reduce_async(&self, inner: &Group, tensor: &Tensor, op: ReduceOp) -> Result<Work, DistError> {
        (self.0)(inner, tensor, op)
    }
}
