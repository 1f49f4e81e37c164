//! The tensors of NCCL calls that failed. A failed
//! call aborts the communicator (`ncclCommAbort`), which returns while the
//! call's kernels may still run on the GPU, or not even have started (the
//! group's stream first waits for libtorch's queued work). Freeing the
//! call's tensors then would hand their memory, through libtorch's caching
//! allocator, to a new tensor that NCCL could still write into. So they are
//! kept, like the MPI backend's buffers, as long as the group lives (an
//! aborted group carries nothing more), and when it is dropped they are
//! freed if an event behind each call shows that the stream is past it, or
//! else never. Tested on a GPU by
//! `cargo test --features nccl --test nccl -- --include-ignored`.

use tch::Tensor;

use super::super::cuda::Event;
use super::{Inner, Pending};

impl Inner {
    /// Keeps a failed call's tensors while the group lives.
    pub(super) fn keep(&self, pending: Pending) {
        self.kept.lock().unwrap_or_else(|p| p.into_inner()).push(pending);
    }

    /// Keeps the tensors of a call whose queueing failed half-way: part of
    /// it may be on the stream. An event recorded now, behind whatever was
    /// queued, says when the stream is past it; if even that fails, the
    /// tensors are never freed.
    pub(super) fn keep_queued(&self, tensors: Vec<Tensor>) {
        let comm = self.comm.lock().unwrap_or_else(|p| p.into_inner());
        let behind = comm.device.bind().and_then(|()| Event::record_on(comm.stream));
        drop(comm);
        match behind {
            Ok(done) => self.keep(Pending { done, _keep: tensors, called: std::time::Instant::now() }),
            Err(_) => std::mem::forget(tensors),
        }
    }
}

impl Drop for Inner {
    /// The last handle is gone. Kept calls whose event has completed are
    /// freed; the others are leaked, since the GPU may still write there
    /// (a failed query, after a fault of the GPU itself, leaks them too).
    fn drop(&mut self) {
        let kept = std::mem::take(&mut *self.kept.lock().unwrap_or_else(|p| p.into_inner()));
        if kept.is_empty() {
            return;
        }
        let bound = self.comm.lock().unwrap_or_else(|p| p.into_inner()).device.bind().is_ok();
        for call in kept {
            if !(bound && matches!(call.done.is_done(), Ok(true))) {
                std::mem::forget(call);
            }
        }
    }
}
