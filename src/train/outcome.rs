//! What the training run reports while it trains
//! ([`Event`], to rank 0's `on_event`) and what each rank returns at its end
//! ([`RankOutcome`]). `cargo run --release --example train` prints them.

use std::time::Duration;

use super::config::TrainConfig;
use super::phases::StepPhases;
use crate::ddp::Named;

/// What rank 0 reports while it trains; the other ranks report nothing.
#[derive(Debug)]
pub enum Event<'a> {
    /// Training starts (or resumes) at `first_step`, for steps up to `last_step`.
    Started {
        first_step: usize,
        last_step: usize,
        parameters: i64,
        /// The DDP wrapper's buckets; under `--shard full`, FSDP's units.
        buckets: usize,
        config: &'a TrainConfig,
    },
    /// Optimizer step `step` (counted from 1) is done.
    Stepped {
        step: usize,
    },
    /// The global batch's mean loss and accuracy at `step`, and the speed since the last log.
    Logged {
        step: usize,
        loss: f64,
        accuracy: f64,
        lr: f64,
        tokens_per_second: f64,
    },
    Checkpointed {
        step: usize,
        path: &'a std::path::Path,
    },
}

/// How the held-out set fares: mean masked loss and accuracy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Evaluation {
    pub loss: f64,
    pub accuracy: f64,
}

/// What one rank returns when the run ends.
#[derive(Debug)]
pub struct RankOutcome {
    pub rank: usize,
    /// The step reached (== steps unless `stop_after` interrupted the run).
    pub last_step: usize,
    /// This rank's loss (mean over its micro-batches) at each step it ran.
    pub losses: Vec<f64>,
    /// The trained parameters and buffers, detached copies, by `VarStore` name.
    pub weights: Vec<Named>,
    /// Rank 0 only: the model on the held-out set after the last step.
    pub evaluation: Option<Evaluation>,
    /// Time in the training steps (checkpoints and evaluation not counted),
    /// and the part of it spent in gradient syncs (chapter 7's clock).
    pub train_time: Duration,
    pub sync_time: Duration,
    /// Input tokens of all ranks per second of `train_time`.
    pub tokens_per_second: f64,
    /// `train_time` split into the phases of a step.
    pub phases: StepPhases,
    /// The fingerprint of the run's final state ([`fingerprint`](super::checkpoint::fingerprint):
    /// the checksum its final checkpoint stores), the same on every rank:
    /// the run fails with [`ReplicasDiffer`](super::ReplicasDiffer) otherwise.
    pub fingerprint: i64,
}
