//! Communication hooks (PyTorch's `register_comm_hook`): a hook replaces how
//! one bucket is averaged over the ranks. The wrapper's default is no hook at
//! all: the bucket's all-reduce (SUM) in its own dtype, then the division by
//! the world size (`buckets.rs`), a path this file does not touch. A
//! registered hook ([`SimpleDistributedDataParallelism::register_comm_hook`](crate::ddp::SimpleDistributedDataParallelism::register_comm_hook))
//! is handed each complete bucket's flat buffer during backward and returns
//! a [`Work`]; once that is waited on, the buffer must hold the mean. The
//! library's hooks are in a file of their own, `bf16_hooks.rs`, since one of
//! them is chapter 12's answer.

use tch::Tensor;

use super::steps::{BucketSteps, Buckets};
use crate::dist::{DistError, ProcessGroup, Work};

// ANCHOR: comm_hook
/// Averages one bucket over the ranks, in place of the library's all-reduce
/// and division: handed the bucket's flat buffer (`[numel]`, the bucket's
/// dtype, this rank's gradients in their slots), it starts the
/// communication and returns its handle; once the handle is waited on, the
/// buffer holds the mean over the ranks, bitwise the same on every rank.
/// Every rank must register the same hook.
pub type CommHook = fn(&dyn ProcessGroup, &Tensor) -> Result<Work, DistError>;
// ANCHOR_END: comm_hook

/// The overlapped sync's steps with a hook: the library's `mark_ready` and
/// gradients installed in their slots, then the hook instead of the
/// all-reduce, and no division after it (the hook averages).
pub(super) struct HookSteps(pub CommHook);

impl BucketSteps for HookSteps {
    fn launch(&self, (pg, buckets, params): Buckets<'_>, b: usize) -> Result<Work, DistError> {
        buckets.fill_bucket(pg, b, params)?;
        (self.0)(pg, &buckets.buffer(b))
    }

    fn finish(&self, _: Buckets<'_>, _: usize, work: Work) -> Result<(), DistError> {
        work.wait()
    }
}
