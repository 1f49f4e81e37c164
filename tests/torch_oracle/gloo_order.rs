//! gloo's order of additions in a bf16 all-reduce (SUM), so that the
//! workbook's bf16 hook in PyTorch's order can be compared with PyTorch's
//! `bf16_compress_hook` bit for bit on 3 ranks. bf16 addition rounds every
//! partial sum, so the order of the additions shows in the bits: the
//! in-process backend adds in rank order, gloo adds along its ring, and the
//! order depends on where an element lies in the buffer. This group
//! forwards every call to the real one, but sums a bf16 all-reduce in
//! gloo's order (from every rank's contribution, gathered), so that what is
//! compared with PyTorch is the hook's own arithmetic.
//! Compiled into `cargo test --features solutions,mpi,nccl --test torch_oracle`.
//!
//! gloo's ring all-reduce (`gloo/allreduce.cc`, `ring`): the buffer is cut
//! into `num_segments` segments, a multiple of the world size N and at least
//! 2N (more only above 1 MiB a segment), of `segment_bytes` each rounded up
//! to whole elements; rank r ends with chunk r, its `num_segments / N`
//! consecutive segments. A chunk travels down the ring, from rank r - 1 to
//! r - 2 and so on, each rank adding its own contribution, and ends on rank
//! r: chunk r is (((x[r-1] + x[r-2]) + ...) + x[r]), ranks mod N.
//! `the_gloo_order_group_sums_as_gloo_does` checks it against gloo itself.
//!
//! gloo's float64 reduce-scatter (`reduce_scatter_tensor`, FSDP2's gradient
//! collective) adds in the same order: it is that ring all-reduce of the
//! whole input, each rank keeping its own part (rank r the elements
//! [r L, (r + 1) L) of N L). So an element's order depends on the ring's
//! chunks, of the WHOLE buffer, not on which rank keeps it; on short
//! buffers a rank's part spans two of the ring's chunks.
//! `gloo_reduce_scatters_in_its_ring_order` checks it against gloo.

use ddp_workbook::dist::{torch_error, DistError, Group, ReduceOp, Work};
use ddp_workbook::tch::{self, Kind, Tensor};

use crate::forwarding::{Forwarding, Intercept};

/// gloo's largest segment (`AllreduceOptionsImpl::kMaxSegmentSize`), in bytes.
const MAX_SEGMENT_BYTES: usize = 1024 * 1024;

/// The element ranges of the chunks of an all-reduce of `numel` elements of
/// `element_size` bytes on `world_size` ranks: chunk r, which rank r ends
/// with, is `ranges[r]` (empty at the end when the buffer is short).
pub fn gloo_chunks(numel: usize, element_size: usize, world_size: usize) -> Vec<std::ops::Range<usize>> {
    let total_bytes = numel * element_size;
    let max_segment = element_size * (MAX_SEGMENT_BYTES / element_size).max(1);
    let num_segments = total_bytes.div_ceil(max_segment).max(2 * world_size).next_multiple_of(world_size);
    let segment_bytes = total_bytes.div_ceil(num_segments).next_multiple_of(element_size);
    let chunk = num_segments / world_size * segment_bytes / element_size;
    (0..world_size).map(|r| (r * chunk).min(numel)..((r + 1) * chunk).min(numel)).collect()
}

/// The sum of `contributions` (one per rank, in rank order) in gloo's
/// ring order, with libtorch's bf16 additions.
pub fn gloo_ring_sum(contributions: &[Tensor]) -> Tensor {
    let n = contributions.len();
    let out = contributions[0].zeros_like();
    let numel = contributions[0].numel();
    for (r, range) in
        gloo_chunks(numel, contributions[0].kind().elt_size_in_bytes(), n).into_iter().enumerate()
    {
        if range.is_empty() {
            continue;
        }
        let (start, len) = (range.start as i64, range.len() as i64);
        let part = |rank: usize| contributions[rank % n].narrow(0, start, len);
        let sum = (2..=n).fold(part(r + n - 1), |sum, k| sum + part(r + n - k));
        out.narrow(0, start, len).copy_(&sum);
    }
    out
}

/// This rank's part of gloo's reduce-scatter (SUM) of `contributions` (one
/// flat buffer of `world_size` parts per rank, in rank order): the ring
/// sum of the whole buffers, cut.
pub fn gloo_reduce_scatter(contributions: &[Tensor], rank: usize) -> Tensor {
    let n = contributions.len() as i64;
    let part = contributions[0].numel() as i64 / n;
    gloo_ring_sum(contributions).narrow(0, rank as i64 * part, part)
}

/// Sums each bf16 all-reduce (SUM), and each float64 reduce-scatter (SUM),
/// in gloo's order; every other call goes to the real group as it is.
pub struct GlooRingOrder;

impl Intercept for GlooRingOrder {
    fn all_reduce_async(&self, inner: &Group, tensor: &Tensor, op: ReduceOp) -> Result<Work, DistError> {
        if (tensor.kind(), op) != (Kind::BFloat16, ReduceOp::Sum) {
            return inner.all_reduce_async(tensor, op);
        }
        let sum = gloo_ring_sum(&inner.all_gather(tensor)?);
        let mut result = tensor.shallow_clone();
        let written = torch_error(inner.as_ref(), "writing gloo's sum into the all-reduce's tensor");
        // The result lands at the wait, as the Work contract has it.
        Ok(Work::new(move || tch::no_grad(|| result.f_copy_(&sum)).map(|_| ()).map_err(written)))
    }

    fn reduce_scatter(&self, inner: &Group, tensor: &Tensor, op: ReduceOp) -> Result<Tensor, DistError> {
        if (tensor.kind(), op) != (Kind::Double, ReduceOp::Sum) {
            return inner.reduce_scatter(tensor, op);
        }
        // dim 0 in world_size chunks, as the contract has it: the flat
        // buffer's parts, reshaped back.
        let mut shape = tensor.size();
        shape[0] /= inner.world_size() as i64;
        let everyone: Vec<Tensor> =
            inner.all_gather(&tensor.contiguous())?.iter().map(|t| t.reshape([-1])).collect();
        Ok(gloo_reduce_scatter(&everyone, inner.rank()).reshape(shape.as_slice()))
    }
}

/// `pg`, with its bf16 sums and float64 reduce-scatters in gloo's order.
pub fn in_gloo_order(pg: Group) -> Group {
    std::sync::Arc::new(Forwarding {
        inner: pg,
        name: "bf16 sums in gloo's ring order",
        intercept: GlooRingOrder,
    })
}
