//! Chapter 07 tests, part 1: the `DistributedSampler` on its own. Compiled
//! into `cargo test --test chapter_07` (see `tests/chapter_07.rs`).
//!
//! This file: which indices each rank gets (equal counts, shards that cover
//! the data set, the padding and the stride, the library's shards). The
//! grid below covers data set lengths that do and do not divide by the
//! number of ranks, lengths smaller than it, with and without shuffling and
//! `drop_last`. The order they are dealt from (a new permutation every
//! epoch, the same on every rank) is `sampler_order.rs`; the tests that
//! never run your code are `sampler_controls.rs`.

use std::collections::BTreeSet;

use ddp_workbook::ch07_sharding::{shard, shard_len, DistributedSampler};

// The tests of the library's sampler that never run your code.
#[path = "sampler_controls.rs"]
mod controls;
// The order of every epoch: shuffling, set_epoch, seeds.
#[path = "sampler_order.rs"]
mod order;

const SEED: u64 = 2024;

fn sampler(len: i64, n: usize, rank: usize, shuffle: bool, seed: u64, drop_last: bool) -> DistributedSampler {
    DistributedSampler::new(len, n, rank, shuffle, seed, drop_last).unwrap_or_else(|e| {
        panic!("DistributedSampler::new({len}, {n}, {rank}, ..) refused valid input: {e}")
    })
}

/// Every rank's indices for `epoch`, in rank order.
fn all_shards(len: i64, n: usize, shuffle: bool, drop_last: bool, epoch: u64) -> Vec<Vec<i64>> {
    (0..n)
        .map(|rank| {
            let mut s = sampler(len, n, rank, shuffle, SEED, drop_last);
            s.set_epoch(epoch);
            shard(&s)
        })
        .collect()
}

/// Every valid (len, n, shuffle, drop_last) of the grid.
fn grid() -> Vec<(i64, usize, bool, bool)> {
    let mut cases = vec![];
    for len in (1..=13).chain([64, 97]) {
        for n in 1..=5 {
            for shuffle in [false, true] {
                for drop_last in [false, true] {
                    if !(drop_last && (len as usize) < n) {
                        cases.push((len, n, shuffle, drop_last));
                    }
                }
            }
        }
    }
    cases
}

/// Counted by hand: one index per complete round of n, plus one from a last,
/// incomplete round, which is padded (or, with drop_last, left out).
fn expected_count(len: i64, n: usize, drop_last: bool) -> usize {
    len as usize / n + usize::from(!drop_last && !(len as usize).is_multiple_of(n))
}

#[test]
fn every_rank_gets_the_same_number_of_indices() {
    for (len, n, shuffle, drop_last) in grid() {
        let expected = expected_count(len, n, drop_last);
        let rule = match drop_last {
            true => "the most every rank can get with no example handed out twice",
            false => "the fewest every rank can get with every example handed out",
        };
        for rank in 0..n {
            let s = sampler(len, n, rank, shuffle, SEED, drop_last);
            let (counted, cut) = (shard_len(&s), shard(&s).len());
            // Name the function that got it wrong: a right count with a short
            // shard is epoch_shard's fault, not samples_per_rank's.
            let culprit = if counted != expected {
                format!("your samples_per_rank gave {counted}")
            } else {
                format!("your epoch_shard cut {cut} indices")
            };
            assert!(
                counted == expected && cut == expected,
                "{len} examples on {n} ranks (shuffle {shuffle}, drop_last {drop_last}), rank {rank}: {culprit}; \
                 samples_per_rank and the shard's length must both be {expected}, {rule}; unequal counts mean one \
                 rank makes fewer collectives than the others and the run deadlocks"
            );
        }
    }
}

#[test]
fn shards_cover_the_data_set_and_overlap_only_in_the_padding() {
    for (len, n, shuffle, drop_last) in grid() {
        let shards = all_shards(len, n, shuffle, drop_last, 1);
        let case = format!("{len} examples on {n} ranks (shuffle {shuffle}, drop_last {drop_last})");
        let all: Vec<i64> = shards.concat();
        assert!(
            all.iter().all(|&i| (0..len).contains(&i)),
            "{case}: your epoch_shard handed out an index outside 0..{len}: {shards:?}"
        );
        let distinct: BTreeSet<i64> = all.iter().copied().collect();
        if drop_last {
            assert_eq!(
                distinct.len(),
                all.len(),
                "{case}: your epoch_shard handed out an index twice; with drop_last none may repeat: {shards:?}"
            );
            assert!(
                len as usize - all.len() < n,
                "{case}: your epoch_shard left out {} examples; drop_last leaves out only those that cannot fill \
                 a round of {n} (fewer than {n}): {shards:?}",
                len as usize - all.len()
            );
        } else {
            assert_eq!(
                distinct.len(),
                len as usize,
                "{case}: your epoch_shard's shards together must cover 0..{len} without drop_last: {shards:?}"
            );
            // Repeats exist only to pad the last round: total - len of them.
            assert_eq!(
                all.len() - distinct.len(),
                all.len() - len as usize,
                "{case}: your epoch_shard repeated more indices than padding the last round needs: {shards:?}"
            );
        }
    }
}

#[test]
fn padding_repeats_the_start_and_rank_r_takes_every_nth_index_from_r() {
    // Without shuffling, the order is 0..len, so the shards can be spelled out.
    let cases: [(i64, usize, bool, Vec<Vec<i64>>); 4] = [
        // 10 on 4 ranks: padded with 0, 1 (the start), then strided.
        (10, 4, false, vec![vec![0, 4, 8], vec![1, 5, 9], vec![2, 6, 0], vec![3, 7, 1]]),
        // ... and with drop_last, 8 and 9 are dropped.
        (10, 4, true, vec![vec![0, 4], vec![1, 5], vec![2, 6], vec![3, 7]]),
        // 2 on 5 ranks: the padding wraps around twice.
        (2, 5, false, vec![vec![0], vec![1], vec![0], vec![1], vec![0]]),
        (6, 3, false, vec![vec![0, 3], vec![1, 4], vec![2, 5]]),
    ];
    for (len, n, drop_last, expected) in cases {
        assert_eq!(
            all_shards(len, n, false, drop_last, 0),
            expected,
            "your epoch_shard's shards (left) against the chapter's table (right), {len} examples on {n} ranks, drop_last \
             {drop_last}, no shuffle: read round by round (every rank's first index, then every rank's second, \
             ...), the shards must be the order from its start, going on from its start again where it runs \
             out (or leaving out the incomplete round with drop_last); a contiguous block per rank breaks this"
        );
    }
    // With shuffling, the same rule applies to the epoch's order.
    for (len, n, drop_last) in [(23, 3, false), (23, 3, true), (3, 4, false)] {
        let shards = all_shards(len, n, true, drop_last, 2);
        let mut s = sampler(len, n, 0, true, SEED, drop_last);
        s.set_epoch(2);
        let order = s.epoch_order();
        for (rank, shard) in shards.iter().enumerate() {
            let expected: Vec<i64> = (0..shard.len()).map(|i| order[(i * n + rank) % order.len()]).collect();
            assert_eq!(
                shard, &expected,
                "your epoch_shard (left) against the epoch's order dealt round by round (right): \
                 {len} shuffled examples on {n} ranks, rank {rank}, epoch 2. The unshuffled table above \
                 passed, so look at the order: the permutation drawn from seed + epoch, the same on every rank"
            );
        }
    }
}

#[test]
fn your_shards_are_the_ones_the_library_sampler_hands_out() {
    // The training run uses the library's sampler (`sampler.indices()`,
    // `sampler.len()`); cut by your functions, the shards must be the same.
    for (len, n, shuffle, drop_last) in grid() {
        for rank in 0..n {
            let mut s = sampler(len, n, rank, shuffle, SEED, drop_last);
            s.set_epoch(4);
            let case = format!("{len} examples, {n} ranks, rank {rank}, drop_last {drop_last}");
            assert_eq!(
                shard(&s),
                s.indices(),
                "{case}: your epoch_shard (left) against the library's (right)"
            );
            assert_eq!(shard_len(&s), s.len(), "{case}: your samples_per_rank (left) against the library's");
        }
    }
}
