//! Chapter 07 tests, part 3: the controls, which never run your code.
//! Compiled into `cargo test --test chapter_07` (see `tests/chapter_07.rs`;
//! libtest names them `controls::...`); the loop they run and the
//! single-process reference are in `training.rs`.
//!
//! Each control makes one of the chapter's mistakes on purpose and shows
//! what it costs: every rank on the same shard, unequal shards. The first
//! fails silently in real training; the test measures how far the result
//! lands from the run that was meant. (The third mistake, no `set_epoch`,
//! runs your shards, so its test is in `training.rs`.) A control passes on
//! the untouched stubs too; `cargo xtask test --only teeth` checks that it
//! does, and that every test outside a `mod controls` reaches your code.

use std::time::Instant;

use ddp_workbook::ch07_sharding::{rows, train_step, SimpleDistributedDataParallelism};
use ddp_workbook::dist::{spawn_with, Group};
use ddp_workbook::models::Mlp;
use ddp_workbook::tch::nn::{self, OptimizerConfig};
use ddp_workbook::tch::Kind;

use super::training::*;
use crate::common::{mse, spawn_options, TIMEOUT, TOLERANCE};

#[test]
fn negative_control_every_rank_on_the_same_shard_just_repeats_the_work() {
    for world_size in [2, 3] {
        let runs = train_ddp(world_size, Sharding::EveryRankIsRank0);
        // The replicas still agree (they all computed the same gradient)...
        let true_reference = one_process(&global_batches(world_size, false));
        let off = replicas_match_and_differ_from(&runs, &true_reference);
        // ...but they trained on 1/N of the data: one process on rank 0's part.
        let rank0_only = one_process(&global_batches(world_size, true));
        let same_as_one_rank = replicas_match_and_differ_from(&runs, &rank0_only);
        println!("{world_size} ranks on rank 0's shard: {off:e} from the global batch, {same_as_one_rank:e} from rank 0's part alone");
        assert!(
            off > 1e6 * TOLERANCE,
            "{world_size} ranks on one shard still match the global batch to {off:e}"
        );
        assert!(
            same_as_one_rank <= TOLERANCE,
            "{world_size} ranks on one shard: {same_as_one_rank:e} from rank 0's part alone"
        );
    }
}

#[test]
fn unequal_shards_fail_with_an_error_instead_of_hanging() {
    // Contiguous halves of 23 examples, no padding: 12 rows and 11 rows. With
    // 6 rows per step, rank 0 takes 2 steps and rank 1 only 1: rank 0's
    // second sync waits for a rank that has already finished.
    let started = Instant::now();
    let result = spawn_with(spawn_options(2), |pg: Group| {
        let data = data();
        let (vs, model) = Mlp::seeded(MODEL_SEED, SIZES, Kind::Double);
        let rank = pg.rank() as i64;
        let ddp = SimpleDistributedDataParallelism::with_bucket_caps(model, &vs, pg, CAPS)?;
        let mut optimizer = nn::Sgd::default().build(&vs, LR)?;
        let shard: Vec<i64> = (rank * 12..((rank + 1) * 12).min(DATASET_LEN)).collect();
        for step_indices in shard.chunks_exact(6) {
            let micro_batches: Vec<&[i64]> = step_indices.chunks_exact(3).collect();
            train_step(&ddp, &mut optimizer, &micro_batches, |i| {
                mse(&ddp.forward(&rows(&data.x, i)), &rows(&data.y, i))
            })?;
        }
        Ok(())
    });
    let error = result.expect_err("ranks with unequal step counts cannot all succeed").to_string();
    println!("unequal shards: {error}");
    assert!(error.contains("rank 0") && error.contains("rank 1"), "the error must name the ranks: {error}");
    assert!(
        started.elapsed() < TIMEOUT,
        "it must fail promptly (the finished rank is noticed), not wait {TIMEOUT:?}"
    );
}
