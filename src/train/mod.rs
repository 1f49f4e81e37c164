//! A real training run: the tiny GPT learns the sorting task on several
//! in-process ranks with the chapter-7 DDP wrapper, logs and checkpoints on
//! rank 0 alone, and can resume exactly where a checkpoint left off.
//!
//! Run it:      `cargo run --release --example train` (flags: `-- --help`)
//! Its tests:   `cargo test --test train`
//!
//! - this file: [`train`], which spawns the ranks;
//! - `config.rs`: the run's settings ([`TrainConfig`]) and their checks;
//! - `rank.rs`: which loop a rank runs ([`train_rank`]), and one rank of a
//!   launched job ([`train_as_process`]);
//! - `run.rs`: what every rank does, step by step, when each holds the whole model;
//! - `adamw.rs`: AdamW with its state in named tensors, so it can be saved;
//! - `run_optimizer.rs`: that AdamW, or with `--shard optimizer` the library's sharded one (ZeRO-1);
//! - `run_grad_op.rs`: a rank of the run with `--shard grad-op`: ZeRO-2 (`ShardGradOp`);
//! - `run_fsdp.rs`: a rank of the run with `--shard full`: FSDP (ZeRO-3), sharded checkpoints;
//! - `checkpoint/`: the checkpoint file, how it is read and how it is written
//!   (checked first, atomically, the previous one kept);
//! - `resume.rs`: on `--resume`, rank 0 reads it and the others receive it;
//! - `outcome.rs`: what rank 0 reports while it trains, what every rank returns;
//! - `agreement.rs`: that every rank starts with the same settings, and
//!   holds the same state before each checkpoint and at the end;
//! - `phases.rs`: where the steps spend their time.

use crate::dist::{spawn, SpawnError};

mod adamw;
mod agreement;
pub mod checkpoint;
mod config;
#[cfg(feature = "nccl")]
mod gpu;
mod outcome;
mod phases;
mod rank;
mod resume;
mod run;
mod run_fsdp;
mod run_grad_op;
mod run_optimizer;
mod step_log;

pub use crate::ddp::AdamWUpdate; // the AdamW arithmetic, in the library for its ZeRO-1 optimizer
pub use adamw::AdamW;
pub use agreement::{check_replicas_agree, check_settings_agree, ReplicasDiffer, SettingsDifferAcrossRanks};
pub use checkpoint::{Checkpoint, CheckpointError, LoopPosition, SaveStep, Setting};
pub use config::{default_threads_per_rank, ConfigError, ShardingStrategy, TrainConfig};
#[cfg(feature = "nccl")]
pub use gpu::{train_as_gpu_process, train_on_gpus};
pub use outcome::{Evaluation, Event, RankOutcome};
pub use phases::StepPhases;
pub use rank::{train_as_process, train_rank};
pub use run::{build_model, evaluate, lr_at, wrap_model};

// ANCHOR: train
/// Runs `config` on `config.world_size` in-process ranks and returns every
/// rank's outcome, in rank order. `on_event` is called by rank 0 only.
pub fn train(config: &TrainConfig, on_event: &(dyn Fn(Event) + Sync)) -> anyhow::Result<Vec<RankOutcome>> {
    config.validate()?; // bad settings or a bad checkpoint: one clear error, before any rank starts
    let outcomes = spawn(config.world_size, |pg| train_rank(pg, config, on_event)).map_err(explain)?;
    Ok(outcomes)
}
// ANCHOR_END: train

/// A spawn failure as an error whose first line is the first rank's cause.
/// Running out of memory gets its own advice: what to lower.
fn explain(error: SpawnError) -> anyhow::Error {
    let text = error.to_string();
    if text.contains("can't allocate memory") || text.contains("out of memory") {
        let cause = text.split(" (then rank").next().unwrap_or(&text);
        return anyhow::anyhow!(
            "training failed: out of memory: {cause}. Each rank holds its data set, model and the \
             activations of one micro-batch: lower --batch-size (raise --accum-steps to keep the \
             global batch), use fewer --train-sequences, or run fewer ranks"
        );
    }
    anyhow::anyhow!("training failed: {error}")
}
