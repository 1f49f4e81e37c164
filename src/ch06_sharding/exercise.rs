//! Chapter 06 exercise: cut the epoch's order into one equal shard per rank.
//! This is the file you edit.
//!
//! Check your work: `cargo test --test chapter_06`
//!
//! `shard_len` in `mod.rs` calls your `samples_per_rank`; `shard` asks the
//! library's `DistributedSampler` for the epoch's order (the seeded shuffle,
//! already written) and calls your `shard_indices` with it.

// ANCHOR: stub
/// How many indices each of `num_replicas` ranks gets from a data set of
/// `dataset_len` examples: `ceil(dataset_len / num_replicas)` when the tail
/// is padded, `floor(dataset_len / num_replicas)` when it is dropped.
#[allow(unused_variables)] // delete this line once you use the arguments
pub fn samples_per_rank(dataset_len: usize, num_replicas: usize, drop_last: bool) -> usize {
    // TODO: with `drop_last`, the examples that do not fill a whole round of
    // `num_replicas` are dropped: integer division rounded down. Without it,
    // the last round is filled up by padding: rounded up (`usize::div_ceil`).
    todo!("exercise ch06: samples_per_rank in src/ch06_sharding/exercise.rs")
}

/// Rank `rank`'s shard of `order` (the whole data set's order for this
/// epoch, the same on every rank). The list is first made a multiple of
/// `num_replicas` long, by repeating its start (`drop_last = false`) or by
/// cutting its tail (`drop_last = true`); then rank `rank` takes positions
/// `rank, rank + num_replicas, rank + 2 * num_replicas, ...` of it.
#[allow(unused_variables)] // delete this line once you use the arguments
pub fn shard_indices(order: &[i64], num_replicas: usize, rank: usize, drop_last: bool) -> Vec<i64> {
    // TODO:
    //   1. total_size = samples_per_rank(order.len(), num_replicas, drop_last) * num_replicas;
    //   2. build the evened list of total_size indices: without drop_last,
    //      `order` followed by its first elements again, wrapping around as
    //      often as needed (10 examples on 4 ranks: order[0..10], order[0],
    //      order[1]; 2 examples on 5 ranks wrap twice); with drop_last, the
    //      first total_size elements of `order`. (One expression can do both:
    //      think of the remainder operator `%` on the position.)
    //   3. keep every num_replicas-th element, starting at position `rank`
    //      (`.iter().skip(rank).step_by(num_replicas)`), not a contiguous block.
    todo!("exercise ch06: shard_indices in src/ch06_sharding/exercise.rs")
}
// ANCHOR_END: stub
