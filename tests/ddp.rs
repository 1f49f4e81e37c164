//! Tests of the finished DDP library (`src/ddp/`) beyond what the chapters
//! prove: the mistakes a user of the library can make, each caught with an
//! error that names the rank instead of replicas that silently drift apart.
//!
//! Run: `cargo test --test ddp`

mod common;

use common::{mse, spawn_options};
use ddp_workbook::data::Regression;
use ddp_workbook::ddp::{BucketCaps, SimpleDistributedDataParallelism};
use ddp_workbook::dist::{spawn_with, RankFailure};
use ddp_workbook::models::Mlp;
use ddp_workbook::tch::Kind;

const SIZES: &[i64] = &[4, 8, 1];
const SMALL: BucketCaps = BucketCaps { cap_bytes: 256, first_cap_bytes: 64 };

#[test]
fn no_sync_on_one_rank_only_fails_within_the_step_on_every_rank() {
    // Rank 1 wraps its first micro-batch in no_sync, rank 0 does not: rank
    // 0's first sync would pair with rank 1's second, and both would step
    // on averages of unrelated gradients.
    let result = spawn_with(spawn_options(2), |pg| {
        let (rank, data) = (pg.rank(), Regression::new(1, 8, 4, 1, Kind::Double));
        let (vs, model) = Mlp::seeded(2, SIZES, Kind::Double);
        let ddp = SimpleDistributedDataParallelism::with_bucket_caps(model, &vs, pg, SMALL)?;
        for micro_batch in 0..2 {
            let (x, y) = data.batch(4 * rank as i64 + 2 * micro_batch, 2);
            let loss = mse(&ddp.forward(&x), &y);
            if rank == 1 && micro_batch == 0 {
                let _no_sync = ddp.no_sync();
                ddp.backward(&loss)?;
            } else {
                ddp.backward(&loss)?;
            }
        }
        Ok(())
    });
    let error = result.expect_err("mis-paired syncs must not both succeed");
    println!("{error}");
    for rank in 0..2 {
        let Some(RankFailure::Error(failure)) = error.failure_of(rank) else {
            panic!("rank {rank} must fail with an error: {error}")
        };
        let message = format!("{failure:#}");
        assert!(
            message.contains("after 1 backward pass(es)") && message.contains("after 2 backward pass(es)"),
            "rank {rank}: the error must show the two ranks' different syncs: {message}"
        );
    }
}

#[test]
fn micro_batch_size_refuses_zero_ranks_and_overflow_instead_of_panicking() {
    use ddp_workbook::ddp::micro_batch_size;
    let zero_ranks = micro_batch_size(32, 0, 2).expect_err("zero ranks cannot share a batch").to_string();
    assert!(zero_ranks.contains("the world size") && zero_ranks.contains("got 0"), "{zero_ranks}");
    let overflow = micro_batch_size(i64::MAX, usize::MAX, 2).expect_err("the product overflows").to_string();
    assert!(overflow.contains("world size x accumulation steps"), "{overflow}");
    let negative = micro_batch_size(-1, 2, 2).expect_err("a negative batch").to_string();
    assert!(negative.contains("the global batch") && negative.contains("-1"), "{negative}");
    assert_eq!(micro_batch_size(32, 2, 2).expect("32 = 8 x 2 x 2"), 8);
}
