//! Chapter 07 tests, part 1 (continued): the order the `DistributedSampler`
//! deals its shards from: a new permutation every epoch, drawn from seed +
//! epoch as PyTorch's, the same on every rank and in every run, and the
//! same order every epoch when `set_epoch` is never called. Compiled into
//! `cargo test --test chapter_07` (a module of `sampler.rs`, whose helpers it
//! uses; see `tests/chapter_07.rs`).

use ddp_workbook::ch07_sharding::{shard, DistributedSampler};
use ddp_workbook::tch::{self, Tensor};
use ddp_workbook::with_seed;

use super::{all_shards, sampler, SEED};
use crate::common::run;

#[test]
fn every_epoch_is_a_new_permutation_of_the_data_set() {
    // 20 examples on 2 ranks: no padding, so the shards read round by round
    // (rank 0's first index, rank 1's first, then the second ones, ...) are
    // the epoch's whole order, as YOUR epoch_shard dealt it.
    let (len, n) = (20, 2);
    let mut orders: Vec<Vec<i64>> = vec![];
    for epoch in 0..6 {
        let shards = all_shards(len, n, true, false, epoch);
        let dealt: Vec<i64> = (0..shards[0].len()).flat_map(|i| shards.iter().map(move |s| s[i])).collect();
        let mut seen = dealt.clone();
        seen.sort_unstable();
        assert_eq!(
            seen,
            (0..len).collect::<Vec<_>>(),
            "epoch {epoch}: your epoch_shard's shards must together be a permutation of 0..{len}: {shards:?}"
        );
        orders.push(dealt);
    }
    for a in 0..orders.len() {
        for b in a + 1..orders.len() {
            assert_ne!(
                orders[a], orders[b],
                "epochs {a} and {b}: your epoch_shard dealt the same order both times; the order must be \
                 drawn anew each epoch, from seed + epoch"
            );
        }
    }
}

#[test]
fn without_set_epoch_every_epoch_repeats_the_same_order() {
    // The failure the chapter warns about: the sampler is built once and
    // set_epoch is never called, so each "epoch" visits the same order.
    let s = sampler(30, 3, 1, true, SEED, false);
    let first = shard(&s);
    for _epoch in 1..4 {
        assert_eq!(
            shard(&s),
            first,
            "your epoch_shard (left) against epoch 0's (right): without set_epoch the order must stay"
        );
    }
    let mut reshuffled = s.clone();
    reshuffled.set_epoch(1);
    assert_ne!(shard(&reshuffled), first, "set_epoch(1) must change rank 1's indices");
    // Without shuffling there is nothing to reshuffle.
    let mut fixed = sampler(30, 3, 1, false, SEED, false);
    let epoch0 = shard(&fixed);
    fixed.set_epoch(5);
    assert_eq!(
        shard(&fixed),
        epoch0,
        "your epoch_shard (left) against epoch 0's (right): shuffle = false visits 0..len every epoch"
    );
}

#[test]
fn the_same_seed_and_epoch_give_the_same_order_on_every_rank_and_every_run() {
    let (len, epoch) = (50, 3);
    // Three rank threads each build their own sampler and compare orders.
    let per_rank = run(3, |pg| {
        let mut s = DistributedSampler::for_group(pg.as_ref(), len, true, SEED, false)?;
        s.set_epoch(epoch);
        let orders = pg.all_gather(&Tensor::from_slice(&s.epoch_order()))?; // 3 x [len]
        let orders: Vec<Vec<i64>> = orders.iter().map(Vec::<i64>::try_from).collect::<Result<_, _>>()?;
        Ok((orders, shard(&s)))
    });
    let (orders, _) = &per_rank[0];
    for (rank, order) in orders.iter().enumerate() {
        assert_eq!(
            order, &orders[0],
            "rank {rank} shuffled differently from rank 0 with the same seed and epoch"
        );
    }
    assert_ne!(orders[0], (0..len).collect::<Vec<_>>(), "shuffle = true must shuffle");

    // Another "run": a fresh sampler, after libtorch's global generator has
    // been reseeded and used. The order depends on seed + epoch alone.
    // (with_seed, not manual_seed: other tests build seeded models meanwhile.)
    let _ = with_seed(987, || Tensor::randn([100], (tch::Kind::Float, tch::Device::Cpu)));
    let mut again = sampler(len, 3, 2, true, SEED, false);
    again.set_epoch(epoch);
    assert_eq!(
        again.epoch_order(),
        orders[0],
        "the same seed and epoch must give the same order in every run"
    );
    assert_eq!(shard(&again), per_rank[2].1, "rank 2's shard must be the same in every run");
}

#[test]
fn the_epoch_order_is_the_permutation_of_seed_plus_epoch_as_in_pytorch() {
    // The rule the doc comment and the chapter state: the order of epoch e
    // is drawn from seed + e, so it is new every epoch and shared by every
    // rank; without shuffling it is 0, 1, 2, ...
    for (seed, epoch) in [(0, 0), (SEED, 3), (u64::MAX, 2)] {
        let mut s = sampler(30, 1, 0, true, seed, false);
        s.set_epoch(epoch);
        let expected = ddp_workbook::ddp::permutation(30, seed.wrapping_add(epoch));
        assert_eq!(
            shard(&s),
            expected,
            "seed {seed}, epoch {epoch}: your epoch_shard's order (left) against permutation(30, seed + epoch)"
        );
    }
    let mut plain = sampler(7, 1, 0, false, SEED, false);
    plain.set_epoch(5);
    assert_eq!(
        shard(&plain),
        (0..7).collect::<Vec<i64>>(),
        "shuffle = false: the order is 0..len every epoch"
    );
}

#[test]
fn different_seeds_give_different_orders() {
    // On one replica, the shard is the whole epoch's order.
    let orders: Vec<Vec<i64>> = (0..8).map(|seed| shard(&sampler(40, 1, 0, true, seed, false))).collect();
    for a in 0..orders.len() {
        for b in a + 1..orders.len() {
            assert_ne!(orders[a], orders[b], "seeds {a} and {b} give the same order");
        }
    }
}
