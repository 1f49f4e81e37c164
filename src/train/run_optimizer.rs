//! The training run's optimizer: AdamW whole on every rank (plain DDP), or AdamW sharded over the ranks (`--shard optimizer`, the library's
//! `ShardedAdamW`, ZeRO stage 1). The run drives both the same way; what
//! differs is who averages the gradients (the wrapper's all-reduce, or the
//! optimizer's reduce-scatter) and who can see the whole state (every rank,
//! or no rank until the shards are gathered, a collective).

use tch::TchError;

use super::adamw::AdamW;
use super::config::{ShardingStrategy, TrainConfig};
use crate::ddp::{
    BucketCaps, Named, ShardedAdamW, SimpleDistributedDataParallelism, StepOptimizer, UnusedParameters,
};
use crate::dist::DistError;
use crate::models::Gpt;

/// AdamW, whole on every rank or sharded (ZeRO-1).
pub(super) enum RunOptimizer {
    Plain(AdamW),
    Sharded(ShardedAdamW),
}

impl RunOptimizer {
    /// `--shard none`: AdamW whole on every rank. `optimizer`: AdamW sharded
    /// over the ranks, on buckets planned with the same caps.
    pub(super) fn new(
        ddp: &SimpleDistributedDataParallelism<Gpt>,
        config: &TrainConfig,
        caps: BucketCaps,
    ) -> Result<RunOptimizer, DistError> {
        let (lr, decay) = (config.lr, config.weight_decay);
        Ok(match config.shard {
            ShardingStrategy::NoShard => RunOptimizer::Plain(AdamW::new(ddp.parameters(), lr, decay)),
            _ => {
                let pg = ddp.process_group().clone();
                RunOptimizer::Sharded(ShardedAdamW::new(ddp.parameters(), pg, caps, lr, decay)?)
            }
        })
    }

    /// Whether the gradients are averaged by the optimizer's step (ZeRO-1):
    /// then the wrapper must send nothing, every backward inside `no_sync`.
    pub(super) fn syncs_gradients(&self) -> bool {
        matches!(self, RunOptimizer::Sharded(_))
    }

    pub(super) fn lr(&self) -> f64 {
        match self {
            RunOptimizer::Plain(adamw) => adamw.lr,
            RunOptimizer::Sharded(sharded) => sharded.lr,
        }
    }

    pub(super) fn set_lr(&mut self, lr: f64) {
        match self {
            RunOptimizer::Plain(adamw) => adamw.lr = lr,
            RunOptimizer::Sharded(sharded) => sharded.lr = lr,
        }
    }

    /// The whole state, as `AdamW::state` names it, on every rank. Sharded,
    /// it is a collective: every rank must call it, at the same step.
    pub(super) fn state(&self) -> Result<Vec<Named>, DistError> {
        match self {
            RunOptimizer::Plain(adamw) => Ok(adamw.state()),
            RunOptimizer::Sharded(sharded) => sharded.gathered_state(),
        }
    }

    /// Restores a saved state (either kind saves the same names, so a
    /// checkpoint of one resumes the other), or says what is wrong with it.
    pub(super) fn load_state(&mut self, state: &[Named]) -> Result<(), String> {
        match self {
            RunOptimizer::Plain(adamw) => adamw.load_state(state),
            RunOptimizer::Sharded(sharded) => sharded.load_state(state).map_err(|error| error.to_string()),
        }
    }
}

impl StepOptimizer for RunOptimizer {
    fn zero_grad(&mut self) {
        match self {
            RunOptimizer::Plain(adamw) => StepOptimizer::zero_grad(adamw),
            RunOptimizer::Sharded(sharded) => StepOptimizer::zero_grad(sharded),
        }
    }

    fn step(&mut self) -> Result<(), TchError> {
        match self {
            RunOptimizer::Plain(adamw) => StepOptimizer::step(adamw),
            RunOptimizer::Sharded(sharded) => StepOptimizer::step(sharded),
        }
    }

    fn skip_unused(&mut self, unused: &UnusedParameters) {
        match self {
            RunOptimizer::Plain(adamw) => adamw.skip_unused(unused),
            RunOptimizer::Sharded(sharded) => sharded.skip_unused(unused),
        }
    }
}
