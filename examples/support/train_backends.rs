//! How examples/train.rs starts its
//! ranks other than as threads on the CPU: as MPI processes (`--backend
//! mpi`), on GPUs as threads (`--backend nccl`), or on GPUs as processes
//! (`--backend nccl` under scripts/launch.sh). Included by train.rs.

use std::process::ExitCode;
use std::time::Instant;

#[cfg(feature = "mpi")]
use ddp_workbook::dist;
#[cfg(any(feature = "mpi", feature = "nccl"))]
use ddp_workbook::train;
use ddp_workbook::train::{RankOutcome, TrainConfig};
use indicatif::ProgressBar;

#[cfg(feature = "mpi")]
use super::{report, summarise};

/// The GPUs NCCL can use here (1 where it can use none: the run then says why).
pub fn gpu_count() -> usize {
    #[cfg(feature = "nccl")]
    return ddp_workbook::dist::nccl::available().unwrap_or(1);
    #[cfg(not(feature = "nccl"))]
    1
}

/// One rank per GPU, as threads of this process.
#[cfg(feature = "nccl")]
pub fn on_gpus(config: &TrainConfig, bar: &ProgressBar) -> anyhow::Result<Vec<RankOutcome>> {
    train::train_on_gpus(config, &|event| super::report(bar, event))
}

#[cfg(not(feature = "nccl"))]
pub fn on_gpus(_: &TrainConfig, _: &ProgressBar) -> anyhow::Result<Vec<RankOutcome>> {
    anyhow::bail!("this build has no NCCL backend: build with `--features nccl`")
}

// ANCHOR: as_process
/// This process is one rank of an MPI job: `run` joins it (and ends the
/// whole job, naming this rank, if the run fails); rank 0 reports. With
/// `gpu`, MPI only hands out NCCL's id, and the run goes through NCCL on
/// GPU `cuda:local_rank`.
#[cfg(feature = "mpi")]
pub fn as_process(
    config: &TrainConfig,
    bar: &ProgressBar,
    started: Instant,
    target: f64,
    gpu: bool,
) -> ExitCode {
    let (rank, world_size, outcome) = super::while_ranks_run(|| {
        dist::mpi::run(|pg| {
            let on_event = |event: train::Event<'_>| report(bar, event);
            let outcome = match gpu {
                false => train::train_as_process(pg.clone(), config, &on_event)?,
                true => on_gpu(&pg, config, &on_event)?,
            };
            Ok((pg.rank(), pg.world_size(), outcome))
        })
    });
    bar.finish_and_clear();
    if rank != 0 {
        return ExitCode::SUCCESS; // rank 0 speaks for the job
    }
    let config = TrainConfig { world_size, ..config.clone() };
    summarise(&config, &[outcome], started.elapsed().as_secs_f64(), target)
}
// ANCHOR_END: as_process

#[cfg(all(feature = "mpi", feature = "nccl"))]
fn on_gpu(
    pg: &dist::Group,
    config: &TrainConfig,
    on_event: &(dyn Fn(train::Event) + Sync),
) -> anyhow::Result<RankOutcome> {
    // The launcher's local rank picks this process's GPU, or, where it names
    // none, the world rank (right on one machine). A process that sees one
    // GPU only (a scheduler set CUDA_VISIBLE_DEVICES per process) uses it.
    let local_rank = dist::LaunchEnv::from_env().ok().flatten().and_then(|env| env.local_rank);
    let ordinal = match ddp_workbook::dist::nccl::available() {
        Ok(1) => 0,
        _ => local_rank.unwrap_or(pg.rank()),
    };
    train::train_as_gpu_process(pg, ordinal, config, on_event)
}

#[cfg(all(feature = "mpi", not(feature = "nccl")))]
fn on_gpu(
    _: &dist::Group,
    _: &TrainConfig,
    _: &(dyn Fn(train::Event) + Sync),
) -> anyhow::Result<RankOutcome> {
    anyhow::bail!("this build has no NCCL backend: build with `--features mpi,nccl`")
}

#[cfg(not(feature = "mpi"))]
pub fn as_process(_: &TrainConfig, _: &ProgressBar, _: Instant, _: f64, _: bool) -> ExitCode {
    eprintln!("error: this build has no MPI backend: build with `--features mpi` (scripts/setup.sh installs Open MPI)");
    ExitCode::from(2)
}
