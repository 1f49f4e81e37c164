//! The small training run that the training run's tests share (a module of
//! `tests/train_bf16.rs` and `tests/train_zero.rs`, not a test of its own):
//! its settings, running it, and a scratch folder for its checkpoints.

use std::path::PathBuf;

use ddp_workbook::train::{self, RankOutcome, TrainConfig};

/// A run small enough for a debug build: 2 ranks, micro-batches of 4, 2 of
/// them per step, 12 steps, and 40 sequences, so every rank's shard lasts
/// 2.5 steps; 0.1 MiB bucket caps, so the 0.4 MB model needs several buckets.
pub fn small_run() -> TrainConfig {
    TrainConfig {
        world_size: 2,
        batch_size: 4,
        accum_steps: 2,
        bucket_cap_mb: 0.1,
        steps: 12,
        warmup_steps: 3,
        train_sequences: 40,
        eval_sequences: 16,
        log_every: 4,
        threads_per_rank: Some(1),
        ..TrainConfig::default()
    }
}

/// Every rank's outcome, in rank order; a failed run fails the test with its error.
pub fn run(config: &TrainConfig) -> Vec<RankOutcome> {
    train::train(config, &|_| {}).unwrap_or_else(|e| panic!("the training run failed: {e:#}"))
}

/// A fresh folder for one test's files (removed first if a previous run left it).
#[allow(dead_code)] // not every test file writes checkpoints
pub fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ddp-workbook-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("cannot create a scratch folder");
    dir
}
