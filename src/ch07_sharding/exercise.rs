//! Chapter 07 exercise: how many examples each rank gets, and which ones,
//! epoch after epoch. This is the file you edit.
//!
//! Check your work: `cargo test --test chapter_07`
//!
//! `shard_len` in `mod.rs` calls your `samples_per_rank`, and `shard` calls
//! your `epoch_shard` with the library's `DistributedSampler`, which only
//! holds the settings (`dataset_len()`, `num_replicas()`, `rank()`,
//! `shuffle()`, `seed()`, `epoch()`, `drop_last()`). The chapter's tests
//! train the whole DDP loop on the shards your code cuts.

use crate::ddp::DistributedSampler;

// ANCHOR: stub
/// How many indices each of `num_replicas` ranks gets from a data set of
/// `dataset_len` examples: `ceil(dataset_len / num_replicas)` when the tail
/// is padded, `floor(dataset_len / num_replicas)` when it is dropped.
#[allow(unused_variables)] // delete this line once you use the arguments
pub fn samples_per_rank(dataset_len: usize, num_replicas: usize, drop_last: bool) -> usize {
    // TODO: every rank must get the same number of examples, or one rank
    // runs out of batches early and its peers wait in a collective it never
    // joins. The two settings of `drop_last` fix what happens to the
    // examples that do not fill a whole round of `num_replicas`.
    // Stuck? `cargo workbook hint 07` gives hints one at a time.
    todo!("exercise ch07: samples_per_rank in src/ch07_sharding/exercise.rs")
}

/// This rank's indices for the sampler's current epoch, in the order to
/// visit them, `samples_per_rank(..)` of them: the whole data set's order
/// for the epoch (a permutation drawn from `seed + epoch` when shuffling,
/// `0, 1, 2, ...` otherwise; the same on every rank), made a multiple of
/// `num_replicas` long by repeating its start (`drop_last = false`) or by
/// cutting its tail (`drop_last = true`), then every `num_replicas`-th
/// position of it, starting at position `rank`.
#[allow(unused_variables)] // delete this line once you use the argument
pub fn epoch_shard(sampler: &DistributedSampler) -> Vec<i64> {
    // TODO: the ranks never talk while they sample, yet their shards must
    // fit together: every rank derives the same epoch order from the same
    // settings, and takes its own, disjoint part of it.
    // Keep: every rank gets `samples_per_rank` indices, each in
    // 0..dataset_len; over all ranks the shards cover the data set (with
    // `drop_last`, all but the dropped tail) and overlap only in the padding;
    // a new order every epoch, the same one on every rank; without shuffling,
    // 0, 1, 2, ... every epoch; a data set smaller than the number of ranks
    // still fills every shard.
    // Yours to decide: how to build the evened list (padding that repeats
    // the start, even when it is longer than the data set, or cutting the
    // tail) and how a rank picks its part of it; the doc comment fixes the
    // rules (PyTorch's: the seed of epoch e is seed + e, shards are strided),
    // the chapter says why.
    // Available: `crate::ddp::permutation(len, seed)`, the numbers 0..len in
    // a seeded random order; your `samples_per_rank`. (The library's own
    // `epoch_shard`, `shard_indices`, `sampler.epoch_order()` and
    // `sampler.indices()` are the reference: calling them would pass the
    // tests and teach nothing.)
    // Stuck? `cargo workbook hint 07` gives hints one at a time.
    todo!("exercise ch07: epoch_shard in src/ch07_sharding/exercise.rs")
}
// ANCHOR_END: stub
