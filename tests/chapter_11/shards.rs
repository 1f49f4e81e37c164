//! Chapter 11 tests, part 1: `shard_of`, which part of a flat buffer each
//! rank owns. Compiled into `cargo test --test chapter_11` (see
//! `tests/chapter_11.rs`).
//!
//! The contract, not a formula: the ranks agree on one shard length and one
//! padded length; the padded length is `world_size` shards, so that
//! `reduce_scatter` can cut it; rank r's shard is the r-th of them, the
//! chunk `reduce_scatter` leaves on rank r; the padded buffer holds every
//! element, with as little padding as that allows (fewer zeros than ranks).
//! Checked on every world size from 1 to 8 and every length from 0 to 50,
//! more ranks than elements included, then on the chapter's table by hand.
//! Last, the optimizer's own check: `ShardedAdamW::new` takes your shards,
//! and refuses, naming `offset == rank * len`, two wrong `shard_of`s made
//! from yours (every rank at offset 0; the ranks reversed) whose lengths
//! all agree, so that only the rule on the offset can catch them.

use ddp_workbook::ch11_zero::{learner, Shard};
use ddp_workbook::ddp::seams::{ZeroSteps, ZeroWithSteps};
use ddp_workbook::ddp::ShardedAdamW;
use ddp_workbook::dist::Group;
use ddp_workbook::models::{named_parameters, Mlp};
use ddp_workbook::tch::Kind;

use super::training::{BUCKET_NUMELS, CAPS, LR, SIZES, WEIGHT_DECAY};
use crate::common::run;

/// The rule `ShardedAdamW::new` enforces on every bucket, as its error
/// words it.
const OFFSET_RULE: &str = "offset == rank * len";

/// What is wrong with `shards`, every rank's `shard_of(numel, world_size,
/// rank)` in rank order, if anything.
fn broken_rule(numel: usize, world_size: usize, shards: &[Shard]) -> Option<String> {
    let Shard { padded_numel, len, .. } = shards[0];
    if let Some((rank, shard)) =
        shards.iter().enumerate().find(|(_, s)| s.padded_numel != padded_numel || s.len != len)
    {
        return Some(format!(
            "rank {rank} got {shard:?}, rank 0 {:?}: every rank must get the same len and padded_numel \
             (they depend only on numel and world_size)",
            shards[0]
        ));
    }
    if len * world_size != padded_numel {
        return Some(format!(
            "{world_size} shards of len {len} are {} elements, not padded_numel {padded_numel}: \
             reduce_scatter cuts the padded buffer into world_size equal shards",
            len * world_size
        ));
    }
    if let Some((rank, shard)) = shards.iter().enumerate().find(|(r, s)| s.offset != r * len) {
        return Some(format!(
            "rank {rank}'s shard starts at {}: it must be the chunk reduce_scatter leaves on rank {rank}, \
             the {rank}-th of the {world_size} equal chunks in rank order, which starts at {}",
            shard.offset,
            rank * len
        ));
    }
    if padded_numel < numel {
        return Some(format!("padded_numel {padded_numel} cannot hold the {numel} elements"));
    }
    if padded_numel - numel >= world_size {
        return Some(format!(
            "padding of {} element(s): a shorter len would hold the {numel} elements; the padding must be \
             fewer than one element per rank (< {world_size})",
            padded_numel - numel
        ));
    }
    None
}

#[test]
fn shard_of_keeps_its_contract_for_every_length_from_0_to_50_on_1_to_8_ranks() {
    for world_size in 1..=8 {
        for numel in 0..=50 {
            let shards: Vec<Shard> =
                (0..world_size).map(|rank| learner::shard_of(numel, world_size, rank)).collect();
            if let Some(rule) = broken_rule(numel, world_size, &shards) {
                panic!("shard_of({numel}, {world_size}, rank) for rank 0..{world_size} returned {shards:?}: {rule}");
            }
        }
    }
    println!("shard_of: the contract holds for 0 to 50 elements on 1 to 8 ranks");
}

#[test]
fn shards_of_the_chapter_table_worked_by_hand() {
    // (numel, world size) -> (padded length, shard length); 1 element on 4
    // ranks leaves 3 ranks with nothing but padding.
    let table = [
        ((10, 3), (12, 4)),
        ((47, 4), (48, 12)),
        ((8, 4), (8, 2)),
        ((1, 4), (4, 1)),
        ((7, 2), (8, 4)),
        ((0, 3), (0, 0)),
    ];
    for ((numel, world_size), (padded_numel, len)) in table {
        for rank in 0..world_size {
            let expected = Shard { padded_numel, offset: rank * len, len };
            let got = learner::shard_of(numel, world_size, rank);
            assert_eq!(got, expected, "shard_of({numel}, {world_size}, {rank}), worked out by hand");
        }
    }
}

/// A `shard_of`, as `ZeroSteps` takes it.
type ShardOf = fn(usize, usize, usize) -> Shard;

/// Your shard, moved to offset 0 on every rank: the all-gather would then
/// write rank 0's shard into every slot.
fn every_rank_at_offset_0(numel: usize, world_size: usize, rank: usize) -> Shard {
    Shard { offset: 0, ..learner::shard_of(numel, world_size, rank) }
}

/// Your shards in reverse rank order: the all-gather would permute them.
fn ranks_reversed(numel: usize, world_size: usize, rank: usize) -> Shard {
    learner::shard_of(numel, world_size, world_size - 1 - rank)
}

/// What `ShardedAdamW::new` says on each rank when it runs `shard_of` (and
/// your `step_bucket`) on the chapter's MLP: `None` where it accepts.
fn refusals(world_size: usize, shard_of: ShardOf) -> Vec<Option<String>> {
    run(world_size, |pg: Group| {
        let (vs, _model) = Mlp::seeded(31, SIZES, Kind::Double);
        let steps = ZeroSteps { shard_of, step_bucket: learner::step_bucket };
        let built = ShardedAdamW::with_steps(&named_parameters(&vs), pg, CAPS, LR, WEIGHT_DECAY, steps);
        Ok(built.err().map(|error| error.to_string()))
    })
}

#[test]
fn the_optimizer_takes_only_the_shard_reduce_scatter_leaves_on_the_rank() {
    for world_size in [2, 3, 4] {
        let yours = refusals(world_size, learner::shard_of);
        for (rank, refusal) in yours.iter().enumerate() {
            assert!(refusal.is_none(), "ShardedAdamW::new refused your shard_of on rank {rank}: {refusal:?}");
        }
        let wrongs: [(&str, ShardOf); 2] =
            [("every rank at offset 0", every_rank_at_offset_0), ("the ranks reversed", ranks_reversed)];
        for (what, wrong) in wrongs {
            for (rank, refusal) in refusals(world_size, wrong).into_iter().enumerate() {
                // A rank whose wrong shard happens to be its own (rank 0 at
                // offset 0, the middle rank reversed) is rightly accepted.
                let misplaced = BUCKET_NUMELS.iter().any(|&numel| {
                    let len = learner::shard_of(numel, world_size, rank).len;
                    wrong(numel, world_size, rank).offset != rank * len
                });
                match (refusal, misplaced) {
                    (Some(error), true) => assert!(
                        error.contains(OFFSET_RULE),
                        "{what} on {world_size} ranks, rank {rank}: ShardedAdamW::new refused with a \
                         message that does not name the rule `{OFFSET_RULE}`: {error}"
                    ),
                    (Some(error), false) => panic!(
                        "{what} on {world_size} ranks: ShardedAdamW::new refused rank {rank}'s shard, \
                         which is at its own offset: {error}"
                    ),
                    (None, true) => panic!(
                        "{what} on {world_size} ranks: ShardedAdamW::new accepted rank {rank}'s shard \
                         at the wrong offset; it must enforce {OFFSET_RULE}, or the all-gather, which \
                         puts the shards back in rank order, duplicates or permutes parameters"
                    ),
                    (None, false) => {}
                }
            }
        }
    }
    println!("ShardedAdamW::new takes your shards and refuses misplaced ones, naming {OFFSET_RULE}");
}
