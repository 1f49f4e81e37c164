//! A process group for tests that replace the all-reduce and keep the rest:
//! every call goes to the real group, except `all_reduce_async` (and so the
//! blocking `all_reduce`, which waits on it), which the test supplies.
//! Chapter 6's `waiting.rs` delivers the sum only at the wait; `tests/train.rs`
//! makes every all-reduce do nothing; `bench_overlap --timeline` notes when
//! each one completed (`examples/support/timed_group.rs` includes this file).

use ddp_workbook::dist::{CommStats, DistError, Group, ProcessGroup, ReduceOp, Work};
use ddp_workbook::tch::Tensor;

/// What replaces the real group's `all_reduce_async`; it gets that group.
/// A closure with state of its own does too (any `F` below).
pub type AllReduceAsync = fn(&Group, &Tensor, ReduceOp) -> Result<Work, DistError>;

pub struct ReplacedAllReduce<F = AllReduceAsync> {
    pub inner: Group,
    /// What `backend()` says, for error messages.
    pub name: &'static str,
    pub all_reduce_async: F,
}

impl<F> ProcessGroup for ReplacedAllReduce<F>
where
    F: Fn(&Group, &Tensor, ReduceOp) -> Result<Work, DistError> + Send + Sync,
{
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
        (self.all_reduce_async)(&self.inner, tensor, op)
    }
    fn all_gather(&self, tensor: &Tensor) -> Result<Vec<Tensor>, DistError> {
        self.inner.all_gather(tensor)
    }
    fn reduce_scatter(&self, tensor: &Tensor, op: ReduceOp) -> Result<Tensor, DistError> {
        self.inner.reduce_scatter(tensor, op)
    }
    fn barrier(&self) -> Result<(), DistError> {
        self.inner.barrier()
    }
    fn send(&self, tensor: &Tensor, dst: usize) -> Result<(), DistError> {
        self.inner.send(tensor, dst)
    }
    fn recv(&self, tensor: &mut Tensor, src: usize) -> Result<(), DistError> {
        self.inner.recv(tensor, src)
    }
    fn stats(&self) -> CommStats {
        self.inner.stats()
    }
}
