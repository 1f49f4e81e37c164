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
/// How many indices each of `num_replicas` ranks gets per epoch from a data
/// set of `dataset_len` examples; the same number for every rank. With
/// `drop_last`, no example is handed out twice in an epoch, and as few as
/// possible are left out; without it, every example is handed out, and as
/// few as possible twice.
#[allow(unused_variables)] // delete this line once you use the arguments
pub fn samples_per_rank(dataset_len: usize, num_replicas: usize, drop_last: bool) -> usize {
    // TODO: every rank must get the same number of examples, or one rank
    // runs out of batches early and its peers wait in a collective it never
    // joins. `drop_last` chooses between two ways to make the counts equal:
    // the doc comment says what each may and may not do; the tests try data
    // sets that divide evenly, that do not, and that are smaller than the
    // number of ranks.
    // Stuck? `cargo workbook hint 07` gives hints one at a time.
    todo!("exercise ch07: samples_per_rank in src/ch07_sharding/exercise.rs")
}

/// This rank's indices for the sampler's current epoch, in the order to
/// visit them, `samples_per_rank(..)` of them. The epoch's order of the
/// whole data set is the same on every rank: `permutation(dataset_len,
/// seed + epoch)` when shuffling (PyTorch's rule), `0, 1, 2, ...`
/// otherwise. Read round by round (rank 0's first index, rank 1's first,
/// ..., then every rank's second, ...), all ranks' shards together are that
/// order from its start: where it runs out before the last round is full,
/// it goes on from its start again (`drop_last = false`); with `drop_last`,
/// the examples that do not fill a whole round are left out.
#[allow(unused_variables)] // delete this line once you use the argument
pub fn epoch_shard(sampler: &DistributedSampler) -> Vec<i64> {
    // TODO: the ranks never talk while they sample, yet their shards must
    // fit together: every rank derives the same epoch order from the same
    // settings, and takes its own, disjoint part of it.
    // Keep: every rank gets `samples_per_rank` indices, each in
    // 0..dataset_len; over all ranks the shards cover the data set (with
    // `drop_last`, all but the left-out tail) and overlap only in the
    // padding; a new order every epoch, the same one on every rank; without
    // shuffling, 0, 1, 2, ... every epoch; a data set smaller than the
    // number of ranks still fills every shard. The doc comment's rule fixes
    // which index lands where (PyTorch's, index for index); the chapter says
    // why it is a good one.
    // Yours to decide: how to get from the settings to this rank's part:
    // what you build, and how this rank finds its positions in it.
    // Available: `crate::ddp::permutation(len, seed)`, the numbers 0..len in
    // a seeded random order; your `samples_per_rank`. (The library's own
    // `epoch_shard`, `shard_indices`, `sampler.epoch_order()` and
    // `sampler.indices()` are the reference: calling them would pass the
    // tests and teach nothing.)
    // Stuck? `cargo workbook hint 07` gives hints one at a time.
    todo!("exercise ch07: epoch_shard in src/ch07_sharding/exercise.rs")
}
// ANCHOR_END: stub
