//! Chapter 06 reference solution: cut the epoch's order into one equal shard
//! per rank.
//!
//! Run the chapter's tests on it: `cargo test --features solutions --test chapter_06`

// ANCHOR: samples_per_rank
/// How many indices each of `num_replicas` ranks gets from a data set of
/// `dataset_len` examples: `ceil(dataset_len / num_replicas)` when the tail
/// is padded, `floor(dataset_len / num_replicas)` when it is dropped.
pub fn samples_per_rank(dataset_len: usize, num_replicas: usize, drop_last: bool) -> usize {
    if drop_last {
        dataset_len / num_replicas // the incomplete last round is dropped
    } else {
        dataset_len.div_ceil(num_replicas) // the last round is completed by padding
    }
}
// ANCHOR_END: samples_per_rank

// ANCHOR: shard_indices
/// Rank `rank`'s shard of `order` (the whole data set's order for this
/// epoch, the same on every rank). The list is first made a multiple of
/// `num_replicas` long, by repeating its start (`drop_last = false`) or by
/// cutting its tail (`drop_last = true`); then rank `rank` takes positions
/// `rank, rank + num_replicas, rank + 2 * num_replicas, ...` of it.
pub fn shard_indices(order: &[i64], num_replicas: usize, rank: usize, drop_last: bool) -> Vec<i64> {
    let total_size = samples_per_rank(order.len(), num_replicas, drop_last) * num_replicas;
    // Position i of the padded list is order[i % len]: past the end it wraps
    // around to the start, as often as needed (a data set smaller than the
    // number of ranks wraps more than once). With drop_last, total_size <=
    // len, so the modulo never wraps and this just cuts the tail.
    let evened: Vec<i64> = (0..total_size).map(|i| order[i % order.len()]).collect();
    // Strided, as PyTorch's `indices[rank:total_size:num_replicas]`: each rank
    // gets examples from the whole list, and a rank's i-th index is the i-th
    // of its round, so the ranks' i-th micro-batches come from the same part
    // of the epoch.
    evened.into_iter().skip(rank).step_by(num_replicas).collect()
}
// ANCHOR_END: shard_indices
