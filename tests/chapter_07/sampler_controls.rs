//! Chapter 07 tests, the sampler's controls: they check the library's
//! `DistributedSampler` (its shuffle and its refusal of bad input), whose
//! fields your functions read, and never run your code. Compiled into
//! `cargo test --test chapter_07` as `sampler::controls::...` (see
//! `tests/chapter_07/sampler.rs`). A control passes on the untouched stubs
//! too; `cargo xtask test --only teeth` checks that it does, and that every
//! test outside a `mod controls` reaches your code.

use ddp_workbook::ch07_sharding::{DistributedSampler, SamplerError};

use super::{sampler, SEED};

#[test]
fn the_shuffle_is_not_biased() {
    // Over many seeds, each of 4 examples comes first about 1/4 of the time.
    // Deterministic (fixed seeds); the bound is about 5 standard deviations.
    let mut first = [0usize; 4];
    for seed in 0..8000 {
        first[sampler(4, 1, 0, true, seed, false).epoch_order()[0] as usize] += 1;
    }
    assert!(first.iter().all(|&c| c.abs_diff(2000) < 200), "first element counts over 8000 seeds: {first:?}");
}

#[test]
fn bad_input_is_refused_with_a_clear_error() {
    // ((dataset_len, num_replicas, rank, drop_last), the error, advice its message gives)
    let cases = [
        ((10, 0, 0, false), SamplerError::NoReplicas, "pg.world_size()"),
        ((10, 3, 3, false), SamplerError::RankOutOfRange { rank: 3, num_replicas: 3 }, "pg.rank()"),
        ((-1, 2, 0, false), SamplerError::NegativeLength { dataset_len: -1 }, "negative"),
        (
            (0, 2, 0, false),
            SamplerError::EmptyShards { dataset_len: 0, num_replicas: 2, drop_last: false },
            "empty",
        ),
        (
            (2, 3, 1, true),
            SamplerError::EmptyShards { dataset_len: 2, num_replicas: 3, drop_last: true },
            "drop_last = false",
        ),
    ];
    for ((len, n, rank, drop_last), expected, advice) in cases {
        let error = DistributedSampler::new(len, n, rank, true, SEED, drop_last)
            .expect_err(&format!("new({len}, {n}, {rank}, drop_last {drop_last}) must be refused"));
        assert_eq!(error, expected);
        assert!(error.to_string().contains(advice), "the message should mention `{advice}`: {error}");
    }
}
