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
    // TODO: N - 1 steps. In each, every rank passes one chunk to its right
    // neighbour and adds the chunk that arrives from its left neighbour into
    // its own copy of that chunk. Which chunk travels in which step is yours
    // to work out: follow one chunk around the ring in the chapter's phase 1
    // table, then write down, for rank r in step s, the chunk it sends and
    // the chunk it receives.
    // Keep: only `pg.send` and `pg.recv`, once each per step (the tests count
    // the calls and the bytes); what arrives is ADDED, never written over your
    // own contribution; every chunk keeps its length and dtype; N = 1 works
    // (no steps at all); the ring also finishes on a backend whose `send`
    // returns only once the receiver has called `recv` (the tests run it on
    // one, as MPI's `MPI_Ssend` behaves).
    // Yours to decide: the chunk indices (one that goes below 0 must wrap
    // into 0..N), where incoming values land before you add them, and the
    // order of `send` and `recv` within a step on each rank: on such a
    // backend, what would each rank wait for if every rank sent first?
    // In place: `chunk += &incoming` adds and cannot fail; tch's fallible
    // `f_add_` returns a second handle on the chunk, which Rust asks you to
    // use, so write `let _ = chunk.f_add_(&incoming).map_err(..)?;`.
    // Stuck? `cargo workbook hint 01` gives hints one at a time.
    todo!("exercise ch01: ring_reduce_scatter in src/ch01_collectives/exercise.rs")
}

/// Phase 2: starts with `chunks[r]` complete on every rank r; afterwards every
/// chunk is complete on every rank.
#[allow(unused_variables)] // delete this line once you use the arguments
pub fn ring_all_gather(pg: &dyn ProcessGroup, chunks: &mut [Tensor]) -> Result<(), DistError> {
    // TODO: N - 1 more steps around the same ring. Each rank starts with one
    // complete chunk and partial sums everywhere else; pass complete chunks
    // on until every rank holds all N (the chapter's phase 2 table).
    // Keep: one send and one recv per step, to the right and from the left,
    // in an order that also finishes where a send waits for its receive;
    // what arrives is complete, so it REPLACES the partial sum you hold there
    // (adding would count contributions twice); this phase only copies,
    // which is why every rank ends with exactly the same bits.
    // Yours to decide: which chunk a rank sends in each step, and whether you
    // still need a separate buffer to receive into.
    todo!("exercise ch01: ring_all_gather in src/ch01_collectives/exercise.rs")
}
// ANCHOR_END: stub
