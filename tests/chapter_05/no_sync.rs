//! Chapter 05 tests, chapter 4's capability kept: this stage's `backward`
//! accumulates inside `no_sync` and syncs the sums, bucket by bucket, on the
//! first backward after it. Two micro-batches of half the rows per step must
//! train like one process on the global batch, with one all-reduce per bucket
//! per step, as many as without accumulation.
//!
//! Compiled into `cargo test --test chapter_05` (see `tests/chapter_05.rs`).

use super::common::{assert_matches_one_process, Hints};
use super::training::*;

#[test]
fn no_sync_then_backward_syncs_the_sums_once_per_bucket_and_equals_one_process() {
    for (world_size, optim) in [(2, Optim::Sgd), (3, Optim::Adam)] {
        let runs = train(world_size, optim, Sync::Accumulated, TINY_CAPS, mlp);
        for (rank, run) in runs.iter().enumerate() {
            assert_eq!(
                run.all_reduces,
                vec![run.buckets.len() as u64; STEPS],
                "rank {rank}: two micro-batches, the first under no_sync, must make one all-reduce per \
                 bucket and step: your sync_bucket ran more or less often than that"
            );
        }
        let per_rank: Vec<_> = runs.into_iter().map(|run| run.after_each_step).collect();
        let hints = Hints { replicas: HINT_REPLICAS, reference: HINT_MEAN };
        let case = format!("{optim:?}, {world_size} ranks, 2 micro-batches per step");
        assert_matches_one_process(&case, &per_rank, &one_process(optim, mlp), TOLERANCE, &hints);
    }
}
