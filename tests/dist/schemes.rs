//! The in-process all_reduce's two algorithms (`src/dist/local/scheme.rs`):
//! the rank-order sum and the split, each forced and chosen automatically,
//! give on every rank bitwise the sum in rank order computed here in one
//! thread: around the size where the choice changes, at sizes that do not
//! divide into blocks, on 1 rank and on up to 256.
//! Run: `cargo test --test dist schemes`

use ddp_workbook::dist::local::{split_wins, AllReduceScheme, SPLIT_FROM_BYTES};
use ddp_workbook::dist::{spawn_with, ReduceOp, SpawnOptions};
use ddp_workbook::tch::{Kind, Tensor};

use super::{bytes, input, GENEROUS};

const SCHEMES: [AllReduceScheme; 3] =
    [AllReduceScheme::RankOrder, AllReduceScheme::Split, AllReduceScheme::Auto];

/// x_0 + x_1 + ... + x_{N-1}, added in this order in one thread.
fn rank_order_sum(world_size: usize, kind: Kind, numel: i64) -> Tensor {
    let mut sum = input(0, kind, &[numel]);
    for rank in 1..world_size {
        sum = &sum + &input(rank, kind, &[numel]);
    }
    sum
}

/// Runs a sum all_reduce of `numel` elements on `world_size` ranks with
/// `scheme` and fails unless every rank holds `rank_order_sum`'s bits.
fn check(scheme: AllReduceScheme, world_size: usize, kind: Kind, numel: i64) {
    let options = SpawnOptions::new(world_size).timeout(GENEROUS).all_reduce_scheme(scheme);
    let results = spawn_with(options, |pg| {
        let mut t = input(pg.rank(), kind, &[numel]);
        pg.all_reduce(&mut t, ReduceOp::Sum)?;
        Ok(bytes(&t))
    })
    .unwrap_or_else(|e| panic!("{scheme:?} on {world_size} ranks, {numel} elements: {e}"));
    let expected = bytes(&rank_order_sum(world_size, kind, numel));
    for (rank, got) in results.iter().enumerate() {
        assert!(
            *got == expected,
            "{scheme:?} on {world_size} ranks, {numel} {kind:?} elements: rank {rank} differs from the \
             rank-order sum"
        );
    }
}

#[test]
fn both_schemes_and_the_choice_give_the_rank_order_sum_around_the_threshold() {
    let at = (SPLIT_FROM_BYTES / 4) as i64; // f32 elements where 2 ranks on 2 cores start to split
    for numel in [at - 1, at, at + 1, 4 * at + 3] {
        for world_size in [2, 3, 5] {
            for scheme in SCHEMES {
                check(scheme, world_size, Kind::Float, numel);
            }
        }
    }
}

#[test]
fn sizes_that_do_not_divide_into_blocks_and_tiny_ones() {
    // 1 element (fewer than ranks), a prime, and 4 MB + 3 bytes of f32 (8 blocks
    // of unequal length), in f32 and f64.
    for numel in [1, 7, 1009, 1_000_003] {
        for kind in [Kind::Float, Kind::Double] {
            check(AllReduceScheme::Split, 3, kind, numel);
            check(AllReduceScheme::RankOrder, 3, kind, numel);
        }
    }
}

#[test]
fn one_rank_keeps_its_tensor_under_every_scheme() {
    for scheme in SCHEMES {
        for numel in [1, 100_000] {
            check(scheme, 1, Kind::Float, numel);
        }
    }
}

#[test]
fn many_ranks_small_and_above_their_threshold() {
    for scheme in SCHEMES {
        check(scheme, 256, Kind::Float, 16);
        check(scheme, 64, Kind::Float, 1001);
    }
    // The first size that 64 ranks split on this machine, and one element more.
    let from = (1..).map(|k| k * 1024).find(|&b| split_wins(b, 64)).unwrap_or(0) as i64 / 4;
    for numel in [from, from + 1] {
        check(AllReduceScheme::Auto, 64, Kind::Float, numel);
    }
}

#[test]
fn control_the_inputs_sum_differently_in_another_order() {
    // Otherwise the tests above could not tell rank order from any order.
    let (world_size, numel) = (5, 1009);
    let mut reversed = input(world_size - 1, Kind::Float, &[numel]);
    for rank in (0..world_size - 1).rev() {
        reversed = &reversed + &input(rank, Kind::Float, &[numel]);
    }
    assert!(bytes(&reversed) != bytes(&rank_order_sum(world_size, Kind::Float, numel)));
}
