//! The memory work of one shared-memory
//! all-reduce (`shm.rs` says when each part runs): growing the window,
//! copying this rank's tensor into it, reducing this rank's slice over the
//! node's ranks in rank order, and copying the result out; or, for buffers
//! from `alloc_buffer`, reducing the slice in place in every rank's. Try it:
//! `cargo test --features mpi --test mpi shared_memory`.

use tch::{Device, Tensor};

use super::super::ffi;
use super::fold::fold_in_order;
use super::Node;

use crate::dist::ReduceOp;

impl Node {
    /// Grows the window to hold `bytes` per rank. Every rank of the node
    /// saw the same size in the agreement, so all make this collective call.
    pub(super) fn make_room(&mut self, bytes: usize) -> Result<(), String> {
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

    /// This call's tensor and the window, as `slices::Call` works on them.
    pub(super) fn call<'a>(&'a self, buf: &'a Tensor, op: ReduceOp) -> Result<Call<'a>, String> {
        let window = self.window.as_ref().expect("make_room made the window");
        let result = window.segments[0].wrapping_add(self.capacity);
        let inputs = &window.segments[..];
        Call::new(buf, op, self.rank, self.size, inputs, result)
    }
}

/// One call's tensor and the window, as this rank sees them.
pub(crate) struct Call<'a> {
    /// This rank's contiguous tensor (the caller's memory, or a copy).
    buf: &'a Tensor,
    op: ReduceOp,
    rank: usize,
    /// Where each rank's segment starts: its input, laid out as the tensor.
    inputs: &'a [*mut u8],
    /// The node's result area (the whole tensor's bytes).
    pub result: *mut u8,
    /// Elements, and bytes per element.
    numel: usize,
    elt: usize,
    /// Slice s is elements bounds[s] .. bounds[s + 1]; rank s reduces it.
    bounds: Vec<usize>,
}

impl<'a> Call<'a> {
    pub fn new(
        buf: &'a Tensor,
        op: ReduceOp,
        rank: usize,
        size: usize,
        inputs: &'a [*mut u8],
        result: *mut u8,
    ) -> Result<Call<'a>, String> {
        if !buf.is_contiguous() || buf.device() != Device::Cpu {
            return Err("the shared-memory all-reduce needs a contiguous CPU tensor".into());
        }
        let (numel, elt) = (buf.numel(), buf.kind().elt_size_in_bytes());
        // Rank s's slice: elements s * numel / size up to (s + 1) * numel / size.
        let bounds = (0..=size).map(|s| (s as u128 * numel as u128 / size as u128) as usize).collect();
        Ok(Call { buf, op, rank, inputs, result, numel, elt, bounds })
    }

    /// The tensor's bytes.
    pub fn bytes(&self) -> usize {
        self.numel * self.elt
    }

    /// The result area as a byte tensor (for a broadcast between leaders).
    pub fn result_bytes(&self) -> Tensor {
        super::bytes_at(self.result, self.bytes())
    }

    fn own(&self) -> *mut u8 {
        self.buf.data_ptr().cast()
    }

    /// This rank's slice, in bytes: (start, end).
    fn own_slice(&self) -> (usize, usize) {
        (self.bounds[self.rank] * self.elt, self.bounds[self.rank + 1] * self.elt)
    }

    /// Copies the slices other ranks reduce into this rank's segment (its
    /// own slice it reads from its tensor instead).
    pub fn copy_in(&self) {
        let (start, end) = self.own_slice();
        let segment = self.inputs[self.rank];
        // SAFETY: the segment holds at least the tensor's bytes (make_room);
        // nobody reads it until the barrier that follows.
        unsafe {
            copy(self.own(), segment, 0, start);
            copy(self.own(), segment, end, self.bytes() - end);
        }
    }

    /// Copies the result into this rank's tensor: all of it (`whole`), or
    /// all but the slice this rank reduced and wrote there already.
    pub fn copy_out(&self, whole: bool) {
        let (start, end) = if whole { (0, 0) } else { self.own_slice() };
        // SAFETY: the result area holds the tensor's bytes, final since the barrier.
        unsafe {
            copy(self.result, self.own(), 0, start);
            copy(self.result, self.own(), end, self.bytes() - end);
        }
    }

    /// Reduces this rank's slice over the node's ranks, in rank order, into
    /// the result area: from nothing on the first node (x0 op x1 op ...),
    /// else from the previous nodes' partial result, which the leader
    /// received there. With `write_own`, this rank's tensor gets its slice
    /// of the result too (it is final on a single node).
    pub fn reduce_own_slice(&self, first_node: bool, write_own: bool) -> Result<(), tch::TchError> {
        let at = |base: *mut u8| base.wrapping_add(self.bounds[self.rank] * self.elt);
        let parts: Vec<*mut u8> = (0..self.inputs.len())
            .map(|r| at(if r == self.rank { self.own() } else { self.inputs[r] }))
            .collect();
        let mut outs = vec![at(self.result)];
        if write_own {
            outs.push(at(self.own()));
        }
        self.fold((!first_node).then(|| at(self.result)), &parts, &outs)
    }

    /// The zero-copy path (`regions.rs`), where `inputs` are every rank's
    /// buffer itself: this rank's slice of all of them, reduced in rank
    /// order, written back into each.
    pub fn reduce_own_slice_everywhere(&self) -> Result<(), tch::TchError> {
        let at = self.bounds[self.rank] * self.elt;
        let buffers: Vec<*mut u8> = self.inputs.iter().map(|base| base.wrapping_add(at)).collect();
        self.fold(None, &buffers, &buffers)
    }

    /// This rank's slice: `start` (if any) then every part folded in, in
    /// order, with the call's operation; the result written to every `outs`.
    /// Every pointer is where the slice starts in its memory.
    fn fold(&self, start: Option<*mut u8>, parts: &[*mut u8], outs: &[*mut u8]) -> Result<(), tch::TchError> {
        let len = self.bounds[self.rank + 1] - self.bounds[self.rank];
        // SAFETY: the slice lies in every tensor, segment, buffer and result
        // area passed in, each alive for the whole call.
        unsafe { fold_in_order(self.buf.kind(), self.op, start, parts, len, outs) }
    }
}

/// Copies `len` bytes from `from + at` to `to + at`.
///
/// # Safety
/// Both ranges must be valid and must not overlap.
unsafe fn copy(from: *const u8, to: *mut u8, at: usize, len: usize) {
    if len > 0 {
        std::ptr::copy_nonoverlapping(from.add(at), to.add(at), len);
    }
}
