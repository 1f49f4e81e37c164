//! The training run on GPUs, with the NCCL backend (the
//! `nccl` feature): one rank per GPU, as threads of this process or as
//! processes that `mpirun` started. The run itself is `train_rank`, the
//! same as on the CPU; only the device and the process group differ.
//!
//! Run it:   cargo run --release --features nccl --example train -- --backend nccl
//! As processes, one per GPU:
//!           cargo build --release --features mpi,nccl --example train
//!           scripts/launch.sh -np 2 target/release/examples/train --backend nccl

use std::sync::Arc;

use tch::Device;

use super::config::TrainConfig;
use super::outcome::{Event, RankOutcome};
use super::rank::{train_as_process, train_rank};
use crate::dist::{nccl, Group};

/// Runs `config` on `config.world_size` ranks, rank r on GPU `cuda:r`,
/// all threads of this process; every rank's outcome, in rank order.
pub fn train_on_gpus(
    config: &TrainConfig,
    on_event: &(dyn Fn(Event) + Sync),
) -> anyhow::Result<Vec<RankOutcome>> {
    config.validate()?;
    let outcomes = nccl::spawn_on_gpus(config.world_size, |pg| {
        let config = TrainConfig { device: Device::Cuda(pg.rank()), ..config.clone() };
        train_rank(pg, &config, on_event)
    });
    outcomes.map_err(|why| anyhow::anyhow!("training on GPUs failed: {why}"))
}

/// This process's rank of a launched job, on GPU `cuda:local_rank`: the
/// launcher's group (`over`, MPI's) hands out NCCL's id, and the run's
/// collectives go through NCCL.
pub fn train_as_gpu_process(
    over: &Group,
    local_rank: usize,
    config: &TrainConfig,
    on_event: &(dyn Fn(Event) + Sync),
) -> anyhow::Result<RankOutcome> {
    let pg: Group = Arc::new(nccl::bootstrap(over.as_ref(), local_rank)?);
    let config = TrainConfig { device: Device::Cuda(local_rank), ..config.clone() };
    train_as_process(pg, &config, on_event)
}
