//! Chapter 01: processes, ranks and collectives. You build a ring all-reduce
//! (sum) out of nothing but `send` and `recv`, and check it against the
//! built-in `all_reduce`.
//!
//! Your code:           `cargo test --test chapter_01`
//! The reference code:  `cargo test --features solutions --test chapter_01`
//!
//! This file holds the part that is already solved: cutting a tensor into one
//! chunk per rank and putting it back together. The two phases of the ring
//! are yours, in `exercise.rs`:
//!
//! 1. [`learner::ring_reduce_scatter`]: after N - 1 steps, `chunks[rank]` holds the
//!    sum of every rank's `chunks[rank]`;
//! 2. [`learner::ring_all_gather`]: after N - 1 more steps, every rank holds every
//!    summed chunk.
//!
//! [`ring_all_reduce`] runs both on a tensor of any shape, through
//! [`learner`]: your phases, or with `--features solutions` the reference.

use tch::{TchError, Tensor};

use crate::dist::{DistError, ProcessGroup};

pub mod exercise; // the file you edit
pub mod solution; // the reference solution

/// `learner::f` is your `exercise.rs`, or `solution.rs` with `--features solutions`.
#[cfg(not(feature = "solutions"))]
pub use exercise as learner;
#[cfg(feature = "solutions")]
pub use solution as learner;

// ANCHOR: chunks
/// How many elements each of the `world_size` chunks of a buffer of `len`
/// elements gets: as equal as possible, the first `len % world_size` chunks
/// one element longer. Chunks are empty when `len < world_size`.
///
/// `chunk_lengths(7, 3) == [3, 2, 2]`, `chunk_lengths(2, 4) == [1, 1, 0, 0]`.
pub fn chunk_lengths(len: i64, world_size: usize) -> Vec<i64> {
    let n = world_size as i64;
    (0..n).map(|i| len / n + i64::from(i < len % n)).collect()
}

/// Cuts a 1-D tensor into `world_size` chunks of [`chunk_lengths`]. Each chunk
/// is its own contiguous copy, so the ring may overwrite a chunk or replace
/// it by a new tensor; [`ring_all_reduce`] glues them back together after.
pub fn split_into_chunks(flat: &Tensor, world_size: usize) -> Result<Vec<Tensor>, TchError> {
    let lengths = chunk_lengths(flat.numel() as i64, world_size);
    flat.f_split_with_sizes(&lengths, 0)? // world_size views of flat
        .iter()
        .map(Tensor::f_detach_copy) // its own storage: no chunk aliases another
        .collect()
}
// ANCHOR_END: chunks

// ANCHOR: ring_all_reduce
/// Sums `tensor` over all ranks, in place, with a ring of `send`/`recv`
/// calls: every rank must call it with a tensor of the same shape and dtype.
/// Each rank sends 2·(N - 1)/N of the tensor's bytes, whatever N is.
pub fn ring_all_reduce(pg: &dyn ProcessGroup, tensor: &mut Tensor) -> Result<(), DistError> {
    let (rank, world_size) = (pg.rank(), pg.world_size());
    let op = "ring_all_reduce";
    if !tensor.defined() {
        let detail = "the tensor is undefined (a gradient that was never computed?)".to_string();
        return Err(DistError::Invalid { rank, op: op.into(), detail });
    }
    if world_size == 1 {
        return Ok(()); // the sum over one rank is the tensor itself
    }
    let torch = |source| DistError::Torch { rank, op: op.into(), cause: source };
    tch::no_grad(|| {
        let flat = tensor.f_reshape([-1]).map_err(torch)?; // [numel]
        let mut chunks = split_into_chunks(&flat, world_size).map_err(torch)?; // N x [about numel/N]
        let lengths: Vec<i64> = chunks.iter().map(|c| c.numel() as i64).collect();

        learner::ring_reduce_scatter(pg, &mut chunks)?;
        learner::ring_all_gather(pg, &mut chunks)?;

        check_chunks_kept_their_shape(rank, &chunks, &lengths, tensor)?;
        let summed = Tensor::f_cat(&chunks, 0).map_err(torch)?; // [numel]
        tensor.f_copy_(&summed.f_view(tensor.size().as_slice()).map_err(torch)?).map_err(torch)
    })
}
// ANCHOR_END: ring_all_reduce

/// The phases may add into chunks or replace them, but must hand back one
/// chunk per rank, each with its original length and dtype; otherwise say so
/// here rather than fail obscurely in `cat`.
fn check_chunks_kept_their_shape(
    rank: usize,
    chunks: &[Tensor],
    lengths: &[i64],
    tensor: &Tensor,
) -> Result<(), DistError> {
    let invalid = |detail: String| DistError::Invalid { rank, op: "ring_all_reduce".into(), detail };
    if chunks.len() != lengths.len() {
        return Err(invalid(format!(
            "the ring phases left {} chunks but there must be one per rank ({}); \
             replace chunks in place, never push or remove them",
            chunks.len(),
            lengths.len()
        )));
    }
    for (index, (chunk, &len)) in chunks.iter().zip(lengths).enumerate() {
        if chunk.size() != [len] || chunk.kind() != tensor.kind() {
            return Err(invalid(format!(
                "after the ring phases chunk {index} is {:?}{:?} but it must stay {:?}[{len}]; \
                 receive into a buffer made with `empty_like` of the chunk and add it in",
                chunk.kind(),
                chunk.size(),
                tensor.kind()
            )));
        }
    }
    Ok(())
}
