//! Reductions in rank order over point-to-point messages: every
//! reduce-scatter, and the floating-point all-reduces that do not go
//! through the node's shared memory (`DDP_MPI_SHM=off`, sub-groups, ranks
//! placed across machines out of order). Open MPI's collectives combine
//! the ranks' values in an order of their own (a tree, a ring, chosen by
//! the number of ranks and the message size), and floating-point addition
//! is not associative: on 4 ranks their sums differ from the in-process
//! backend's in the last bits. Here each element is
//! `((x0 op x1) op x2) op ...`, as in the in-process backend, on any
//! number of ranks. Try it: `cargo test --features mpi --test mpi ordered`.
//!
//! The tensor is cut into one slice per rank (rank s owns elements
//! s·n/N up to (s+1)·n/N). Phase 1: each rank sends slice s to rank s and
//! receives every rank's part of its own slice; once all have arrived, it
//! folds them in rank order. A reduce-scatter ends there (its slices are
//! its rows). An all-reduce has phase 2: each rank sends its reduced slice
//! to every other and receives theirs in place. Each rank sends and
//! receives (N−1)/N of the tensor per phase, as a ring would.
//!
//! Messages carry tags of their own, two per call, from the call's place
//! among its communicator's collectives (every rank posts those in the
//! same order), so calls in flight together never take each other's
//! messages; 8192 calls in flight at once on one communicator would.

use std::ffi::c_int;

use tch::Tensor;

use super::ffi::{self, Comm, Request};
use crate::dist::ReduceOp;

/// Calls of one communicator that may be in flight together.
const TAGGED_CALLS: u64 = 8192;

/// Where one reduction in rank order is.
pub(crate) struct Ordered {
    comm: Comm,
    rank: usize,
    size: usize,
    /// The tag of phase 1; phase 2 uses the next.
    tag: c_int,
    /// Every other rank's part of this rank's slice, as it arrives (this
    /// rank's own entry is empty: its part is read where it lies).
    parts: Vec<Tensor>,
    phase: Phase,
}

#[derive(Clone, Copy, PartialEq)]
enum Phase {
    /// Parts in flight.
    Exchange,
    /// The all-reduce's reduced slices in flight.
    Gather,
    Done,
}

/// Element `s·n/N`: where rank `s`'s slice of `n` elements starts.
fn bound(s: usize, n: usize, size: usize) -> usize {
    (s as u128 * n as u128 / size as u128) as usize
}

impl Ordered {
    /// Starts phase 1 of a reduction of `input` (an all-reduce's buffer or
    /// a reduce-scatter's input), the `index`th collective of `comm`, where
    /// this process is `rank` of `size`; its requests go onto `requests`.
    ///
    /// # Safety
    /// The call's tensors, and this value, must stay alive and untouched
    /// until every request pushed (now and by [`Ordered::advance`]) has
    /// completed.
    pub unsafe fn start(
        input: &Tensor,
        comm: Comm,
        (rank, size): (usize, usize),
        index: u64,
        requests: &mut Vec<Request>,
    ) -> Result<Ordered, String> {
        let (n, elt) = (input.numel(), input.kind().elt_size_in_bytes());
        let (from, to) = (bound(rank, n, size), bound(rank + 1, n, size));
        let tag = ffi::TAG_ORDERED + 2 * (index % TAGGED_CALLS) as c_int;
        let mut parts = Vec::with_capacity(size);
        for r in 0..size {
            let len = if r == rank { 0 } else { to - from };
            parts.push(
                Tensor::f_empty([len as i64], (input.kind(), tch::Device::Cpu)).map_err(|e| e.to_string())?,
            );
        }
        let base: *mut u8 = input.data_ptr().cast();
        for r in (0..size).filter(|&r| r != rank) {
            let part = parts[r].data_ptr().cast();
            ffi::irecv_all(part, (to - from) * elt, r, tag, comm, requests)?;
            let (at, end) = (bound(r, n, size), bound(r + 1, n, size));
            ffi::isend_all(base.add(at * elt), (end - at) * elt, r, tag, comm, requests)?;
        }
        Ok(Ordered { comm, rank, size, tag, parts, phase: Phase::Exchange })
    }

    /// Called once every request posted so far has completed: folds this
    /// rank's slice of `input` with `op` after phase 1, into `output` for a
    /// reduce-scatter, or in place for an all-reduce (`output` is `None`),
    /// which then posts phase 2. True once the call has ended.
    ///
    /// # Safety
    /// As [`Ordered::start`]'s, with the same `input`.
    pub unsafe fn advance(
        &mut self,
        input: &Tensor,
        op: ReduceOp,
        output: Option<&Tensor>,
        requests: &mut Vec<Request>,
    ) -> Result<bool, String> {
        match self.phase {
            Phase::Exchange => {}
            Phase::Gather | Phase::Done => {
                self.phase = Phase::Done;
                return Ok(true);
            }
        }
        let (n, elt, kind) = (input.numel(), input.kind().elt_size_in_bytes(), input.kind());
        let (from, to) = (bound(self.rank, n, self.size), bound(self.rank + 1, n, self.size));
        let base: *mut u8 = input.data_ptr().cast();
        let own = base.add(from * elt);
        let parts: Vec<*mut u8> = (0..self.size)
            .map(|r| if r == self.rank { own } else { self.parts[r].data_ptr().cast() })
            .collect();
        let out = output.map_or(own, |output| output.data_ptr().cast());
        super::shm::fold_in_order(kind, op, None, &parts, to - from, &[out])
            .map_err(|e| format!("the slice's reduction in rank order: {e}"))?;
        self.parts.clear(); // no request reads or writes them any more
        if output.is_some() {
            self.phase = Phase::Done;
            return Ok(true);
        }
        // Phase 1's requests have completed: nothing reads the other slices now.
        let tag = self.tag + 1;
        for r in (0..self.size).filter(|&r| r != self.rank) {
            ffi::isend_all(own, (to - from) * elt, r, tag, self.comm, requests)?;
            let (at, end) = (bound(r, n, self.size), bound(r + 1, n, self.size));
            ffi::irecv_all(base.add(at * elt), (end - at) * elt, r, tag, self.comm, requests)?;
        }
        self.phase = Phase::Gather;
        Ok(false)
    }
}
