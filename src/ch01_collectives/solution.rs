//! Chapter 01 reference solution: the two phases of a ring all-reduce, from
//! `send` and `recv` alone.
//!
//! Run the chapter's tests against it: `cargo test --features solutions --test chapter_01`
//!
//! Picture the ranks on a circle: every rank sends only to its right
//! neighbour (rank + 1) and receives only from its left neighbour (rank - 1),
//! so every link carries the same amount of data and no rank is a bottleneck.

use tch::Tensor;

use crate::dist::{DistError, ProcessGroup};

// ANCHOR: solution
/// Phase 1: afterwards `chunks[r]` holds the sum over all ranks of their
/// `chunks[r]`. The other chunks may hold partial sums.
pub fn ring_reduce_scatter(pg: &dyn ProcessGroup, chunks: &mut [Tensor]) -> Result<(), DistError> {
    let (rank, n) = (pg.rank(), pg.world_size());
    expect_one_chunk_per_rank(rank, "ring_reduce_scatter", chunks.len(), n)?;
    let (right, left) = ((rank + 1) % n, (rank + n - 1) % n);
    let r = rank as isize;
    for step in 0..n - 1 {
        let s = step as isize;
        // The chunk we added into in the previous step (at step 0: the one we
        // start with) travels on; the one our left neighbour passes on to us
        // is one position further back.
        let send_index = wrap(r - 1 - s, n);
        let recv_index = wrap(r - 2 - s, n);
        let mut incoming = chunks[recv_index].empty_like(); // [len of that chunk]
        send_and_receive(pg, &chunks[send_index], right, &mut incoming, left)?;
        chunks[recv_index] += &incoming; // one more rank's contribution
    }
    // The last recv_index was wrap(r - n) = rank: that chunk now holds all N.
    Ok(())
}

/// Phase 2: starts with `chunks[r]` complete on every rank r; afterwards every
/// chunk is complete on every rank.
pub fn ring_all_gather(pg: &dyn ProcessGroup, chunks: &mut [Tensor]) -> Result<(), DistError> {
    // Starts where phase 1 ends and passes the complete chunks around the
    // ring, so that after N - 1 steps every rank holds every complete chunk.
    let (rank, n) = (pg.rank(), pg.world_size());
    expect_one_chunk_per_rank(rank, "ring_all_gather", chunks.len(), n)?;
    let (right, left) = ((rank + 1) % n, (rank + n - 1) % n);
    let r = rank as isize;
    for step in 0..n - 1 {
        let s = step as isize;
        // Forward the complete chunk we got in the previous step (at step 0:
        // our own); the complete chunk from the left overwrites our partial one.
        let send_index = wrap(r - s, n);
        let recv_index = wrap(r - 1 - s, n);
        let outgoing = chunks[send_index].shallow_clone(); // a second handle: chunks is borrowed below
        send_and_receive(pg, &outgoing, right, &mut chunks[recv_index], left)?;
    }
    Ok(())
}

/// One step's exchange: `outgoing` to the right, `incoming` from the left.
/// Where a send waits until its receive is posted (`MPI_Ssend`), a step in
/// which every rank sends first never ends. So even ranks send first and odd
/// ranks receive first: every even rank's right neighbour is odd and already
/// receiving, except when N is odd, where rank N - 1's right neighbour is rank
/// 0, whose receive comes right after its own send to the odd rank 1.
fn send_and_receive(
    pg: &dyn ProcessGroup,
    outgoing: &Tensor,
    right: usize,
    incoming: &mut Tensor,
    left: usize,
) -> Result<(), DistError> {
    if pg.rank().is_multiple_of(2) {
        pg.send(outgoing, right)?;
        pg.recv(incoming, left)
    } else {
        pg.recv(incoming, left)?;
        pg.send(outgoing, right)
    }
}

/// `i` modulo `n`, also for negative `i` (Rust's `%` keeps the sign: -1 % 3 == -1).
fn wrap(i: isize, n: usize) -> usize {
    i.rem_euclid(n as isize) as usize
}
// ANCHOR_END: solution

fn expect_one_chunk_per_rank(rank: usize, op: &str, chunks: usize, n: usize) -> Result<(), DistError> {
    if chunks == n {
        return Ok(());
    }
    let detail = format!(
        "got {chunks} chunks for a world of {n} ranks; cut the buffer with \
         ch01_collectives::split_into_chunks(flat, world_size)"
    );
    Err(DistError::Invalid { rank, op: op.into(), detail })
}
