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

use ddp_workbook::ch11_zero::{learner, Shard};

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
