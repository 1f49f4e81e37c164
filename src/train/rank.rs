//! Which loop a rank runs: the replicated one (`run.rs`: plain DDP, or
//! ZeRO-1), ZeRO-2's (`run_grad_op.rs`, `--shard grad-op`) or FSDP's
//! (`run_fsdp.rs`, `--shard full`), in-process
//! ([`train_rank`]) or as one process of a launched job ([`train_as_process`]).

use super::config::{ShardingStrategy, TrainConfig};
use super::outcome::{Event, RankOutcome};
use super::resume::validate_as_process;
use super::run::train_replicated_rank;
use super::run_fsdp::train_rank_fsdp;
use super::run_grad_op::train_rank_grad_op;
use crate::dist::Group;

/// One rank's whole run, with `config.shard`'s loop.
pub fn train_rank(
    pg: Group,
    config: &TrainConfig,
    on_event: &(dyn Fn(Event) + Sync),
) -> anyhow::Result<RankOutcome> {
    if let Some(threads) = config.threads_per_rank {
        tch::set_num_threads(threads as i32); // ranks share the cores: do not oversubscribe them
    }
    match config.shard {
        ShardingStrategy::FullShard => train_rank_fsdp(pg, config, on_event),
        ShardingStrategy::ShardGradOp => train_rank_grad_op(pg, config, on_event),
        _ => train_replicated_rank(pg, config, on_event),
    }
}

/// One rank's run as a process of a launched job (the MPI backend): the
/// world size is the group's, whatever `config` says. Returns this rank's
/// outcome; rank 0 alone reports events and writes the whole checkpoints
/// (under `--shard full` every rank writes its shard).
pub fn train_as_process(
    pg: Group,
    config: &TrainConfig,
    on_event: &(dyn Fn(Event) + Sync),
) -> anyhow::Result<RankOutcome> {
    let config = TrainConfig { world_size: pg.world_size(), ..config.clone() };
    // The checkpoint file is rank 0's: the others may run on machines that
    // cannot see it. Every rank returns rank 0's verdict on it.
    validate_as_process(pg.as_ref(), &config)?;
    train_rank(pg, &config, on_event)
}
