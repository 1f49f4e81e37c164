//! Chapter 11 tests, part 1: `shard_of`, which part of a flat buffer each
//! rank owns. Compiled into `cargo test --test chapter_11` (see
//! `tests/chapter_11.rs`).

use ddp_workbook::ch11_zero::{learner, Shard};

#[test]
fn shards_of_the_chapter_table_worked_by_hand() {
    // (numel, world size) -> (padded length, shard length): round the shard
    // up, pad at the end.
    let table =
        [((10, 3), (12, 4)), ((47, 4), (48, 12)), ((8, 4), (8, 2)), ((1, 4), (4, 1)), ((7, 2), (8, 4))];
    for ((numel, world_size), (padded_numel, len)) in table {
        for rank in 0..world_size {
            let expected = Shard { padded_numel, offset: rank * len, len };
            let got = learner::shard_of(numel, world_size, rank);
            assert_eq!(got, expected, "shard_of({numel}, {world_size}, {rank})");
        }
    }
}

#[test]
fn shards_tile_the_padded_buffer_with_less_than_one_element_per_rank_of_padding() {
    for world_size in 1..=6 {
        for numel in 1..=50 {
            let shards: Vec<Shard> =
                (0..world_size).map(|r| learner::shard_of(numel, world_size, r)).collect();
            let padded = shards[0].padded_numel;
            let case = format!("{numel} elements on {world_size} ranks: {shards:?}");
            assert!(padded >= numel && padded - numel < world_size, "{case}: padding is not minimal");
            let mut next = 0; // where the next rank's shard must start
            for shard in &shards {
                assert_eq!(shard.padded_numel, padded, "{case}: the ranks disagree on the padded length");
                assert_eq!(shard.len, shards[0].len, "{case}: shards of different lengths");
                assert_eq!(shard.offset, next, "{case}: the shards do not follow each other in rank order");
                next += shard.len;
            }
            assert_eq!(next, padded, "{case}: the shards do not cover the padded buffer");
        }
    }
}
