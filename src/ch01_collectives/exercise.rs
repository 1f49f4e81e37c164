//! Chapter 01 exercise: the two phases of a ring all-reduce, built from
//! `pg.send` and `pg.recv` alone. This is the file you edit.
//!
//! Check your work: `cargo test --test chapter_01`
//!
//! `ring_all_reduce` in `mod.rs` has already cut the buffer into
//! `chunks.len() == pg.world_size()` 1-D chunks (some may be empty) and calls
//! your two functions one after the other. Write N for `pg.world_size()` and
//! r for `pg.rank()`; "x mod N" below means the result in 0..N, also when x
//! is negative (`x.rem_euclid(n)` on a signed integer, not `%`).
//! Every rank sends only to its right neighbour, (r + 1) mod N, and receives
//! only from its left neighbour, (r - 1) mod N. Do not call `all_reduce`,
//! `broadcast`, `all_gather` or `reduce_scatter`: the tests check.

use tch::Tensor;

use crate::dist::{DistError, ProcessGroup};

// ANCHOR: stub
/// Phase 1: afterwards `chunks[r]` holds the sum over all ranks of their
/// `chunks[r]`. The other chunks may hold partial sums.
#[allow(unused_variables)] // delete this line once you use the arguments
pub fn ring_reduce_scatter(pg: &dyn ProcessGroup, chunks: &mut [Tensor]) -> Result<(), DistError> {
    // TODO: run N - 1 steps, s = 0, 1, ..., N - 2. In step s:
    //   1. send chunks[(r - 1 - s) mod N] to the right neighbour;
    //   2. receive from the left neighbour into a new buffer shaped like
    //      chunks[(r - 2 - s) mod N] (`chunks[i].empty_like()`);
    //   3. add that buffer into chunks[(r - 2 - s) mod N] (`chunks[i] += &buffer`).
    // Send before you receive: sends are buffered in the in-process backend,
    // so every rank sending first cannot deadlock here (chapter 01 explains
    // what real backends do instead). Return errors with `?`.
    todo!("exercise ch01: ring_reduce_scatter in src/ch01_collectives/exercise.rs")
}

/// Phase 2: starts with `chunks[r]` complete on every rank r; afterwards every
/// chunk is complete on every rank.
#[allow(unused_variables)] // delete this line once you use the arguments
pub fn ring_all_gather(pg: &dyn ProcessGroup, chunks: &mut [Tensor]) -> Result<(), DistError> {
    // TODO: run N - 1 steps, s = 0, 1, ..., N - 2. In step s:
    //   1. send chunks[(r - s) mod N] (complete by now) to the right neighbour;
    //   2. receive from the left neighbour straight into chunks[(r - 1 - s) mod N],
    //      replacing the partial sum there (`pg.recv(&mut chunks[i], left)`).
    todo!("exercise ch01: ring_all_gather in src/ch01_collectives/exercise.rs")
}
// ANCHOR_END: stub
