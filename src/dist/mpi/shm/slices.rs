//! src/dist/mpi/shm/slices.rs: the memory work of one shared-memory
//! all-reduce (`shm.rs` says when each part runs): copying this rank's
//! tensor into the window, reducing this rank's slice over the node's ranks
//! in rank order, and copying the result out. Try it:
//! `cargo test --features mpi --test mpi shared_memory`.

use tch::{Device, Kind, Tensor};

use super::fold::{sum_in_order, Bf16};

use crate::dist::ReduceOp;

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

    /// A view of `len` elements at element `offset` of the memory at `base`.
    fn view(&self, base: *mut u8, offset: usize, len: usize) -> Tensor {
        let at = base.wrapping_add(offset * self.elt);
        // SAFETY: every caller's range lies in the tensor or a segment of the
        // window, both alive for the whole call.
        unsafe { Tensor::from_blob(at, &[len as i64], &[1], self.buf.kind(), Device::Cpu) }
    }

    /// Reduces this rank's slice over the node's ranks, in rank order, into
    /// the result area: from nothing on the first node (x0 op x1 op ...),
    /// else from the previous nodes' partial result, which the leader
    /// received there. With `write_own`, this rank's tensor gets its slice
    /// of the result too (it is final on a single node).
    pub fn reduce_own_slice(&self, first_node: bool, write_own: bool) -> Result<(), tch::TchError> {
        let (offset, len) = (self.bounds[self.rank], self.bounds[self.rank + 1] - self.bounds[self.rank]);
        if len == 0 {
            return Ok(());
        }
        let at = |base: *mut u8| base.wrapping_add(offset * self.elt);
        let parts: Vec<*mut u8> = (0..self.inputs.len())
            .map(|r| at(if r == self.rank { self.own() } else { self.inputs[r] }))
            .collect();
        let (acc, own) = (at(self.result), write_own.then(|| at(self.own())));
        let sum = matches!(self.op, ReduceOp::Sum | ReduceOp::Avg);
        // SAFETY: the slice lies in the tensor, in every segment and in the
        // result area; the result area overlaps no input.
        let folded = unsafe {
            match self.buf.kind() {
                Kind::Float if sum => sum_as::<f32>(acc, &parts, len, first_node, own),
                Kind::Double if sum => sum_as::<f64>(acc, &parts, len, first_node, own),
                Kind::BFloat16 if sum => sum_as::<Bf16>(acc, &parts, len, first_node, own),
                _ => false,
            }
        };
        if folded {
            return Ok(());
        }
        // Elsewhere libtorch, in pieces below its grain size (32768), so
        // that it never wakes its thread pool.
        let mut start = 0;
        while start < len {
            let n = PIECE.min(len - start);
            let views: Vec<Tensor> = parts.iter().map(|&p| self.view(p, start, n)).collect();
            let acc = self.view(acc, start, n);
            tch::no_grad(|| -> Result<(), tch::TchError> {
                let mut rest = views.iter();
                if first_node {
                    acc.shallow_clone().f_copy_(rest.next().expect("a node has a rank"))?;
                }
                for part in rest {
                    combine(self.op, &acc.shallow_clone(), part, &acc)?;
                }
                if let Some(own) = own {
                    self.view(own, start, n).f_copy_(&acc)?;
                }
                Ok(())
            })?;
            start += n;
        }
        Ok(())
    }
}

/// Pieces of the libtorch path, in elements.
const PIECE: usize = 16384;

/// [`sum_in_order`] on elements of `T`; true (it did the work).
///
/// # Safety
/// As [`sum_in_order`]'s.
unsafe fn sum_as<T: Copy + std::ops::Add<Output = T>>(
    acc: *mut u8,
    parts: &[*mut u8],
    len: usize,
    fresh: bool,
    own: Option<*mut u8>,
) -> bool {
    let parts: Vec<*const T> = parts.iter().map(|&p| p.cast_const().cast()).collect();
    sum_in_order(acc.cast(), &parts, len, fresh, own.map(|p| p.cast()));
    true
}

/// `out = before op next`, with the in-process backend's operations (and so
/// its bits): libtorch's add (bf16 widened, added, rounded; booleans or'ed),
/// mul, minimum and maximum. An average is summed here and divided by the
/// caller (`group.rs`), as on the MPI path.
fn combine(op: ReduceOp, before: &Tensor, next: &Tensor, out: &Tensor) -> Result<(), tch::TchError> {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => _ = next.f_add_out(out, before)?,
        ReduceOp::Product => _ = next.f_mul_out(out, before)?,
        ReduceOp::Min => _ = before.f_minimum_out(out, next)?,
        ReduceOp::Max => _ = before.f_maximum_out(out, next)?,
    }
    Ok(())
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
