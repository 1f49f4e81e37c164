//! The command line of examples/train.rs:
//! its flags (`cargo run --release --example train -- --help` prints them)
//! and how they become the library's `TrainConfig`, a global batch that does
//! not split evenly refused with chapter 4's message. Included by train.rs.

use std::path::PathBuf;

use clap::Parser;
use ddp_workbook::ddp::micro_batch_size;
use ddp_workbook::dist;
use ddp_workbook::models::GptSize;
use ddp_workbook::train::{default_threads_per_rank, ShardingStrategy, TrainConfig};

use crate::backends;

// ANCHOR: flags
/// Train the tiny GPT on the sorting task with Distributed Data Parallel
/// (in-process ranks). Defaults reach the target accuracy in a few minutes
/// on two CPU cores.
#[derive(Parser, Debug)]
#[command(version, allow_negative_numbers = true)]
pub struct Args {
    /// in-process: the ranks are threads of this process; mpi: this process is
    /// one rank of a job that scripts/launch.sh (mpirun) started; nccl: one
    /// rank per GPU (threads, or processes under scripts/launch.sh)
    #[arg(long, value_enum, default_value_t = Backend::InProcess)]
    pub backend: Backend,
    /// Where the model trains; cuda: with nccl one GPU per rank, with
    /// in-process every rank thread on cuda:0 [default: cuda with nccl, else cpu]
    #[arg(long, value_enum)]
    pub device: Option<DeviceArg>,
    /// Number of ranks (in-process backend; nccl: at most one per GPU; under
    /// MPI the launcher's -np sets it) [default: 2; nccl: every GPU]
    #[arg(long)]
    pub world_size: Option<usize>,
    /// Sequences per rank per micro-batch
    #[arg(long, default_value_t = TrainConfig::default().batch_size, conflicts_with = "global_batch_size")]
    batch_size: usize,
    /// Sequences per optimizer step over all ranks, instead of --batch-size: it must
    /// divide into world-size x accum-steps equal micro-batches
    #[arg(long)]
    global_batch_size: Option<usize>,
    /// Micro-batches accumulated per optimizer step (no_sync on all but the last)
    #[arg(long, default_value_t = TrainConfig::default().accum_steps)]
    accum_steps: usize,
    /// Gradient bucket size in MiB (the first bucket gets at most 1 MiB)
    #[arg(long, default_value_t = TrainConfig::default().bucket_cap_mb)]
    bucket_cap_mb: f64,
    /// Optimizer steps of the whole run
    #[arg(long, default_value_t = TrainConfig::default().steps)]
    steps: usize,
    /// Seed of the model, the data and the shuffles
    #[arg(long, default_value_t = TrainConfig::default().seed)]
    seed: u64,
    /// Peak learning rate (after warm-up; cosine decay to a tenth at the end)
    #[arg(long, default_value_t = TrainConfig::default().lr)]
    lr: f64,
    #[arg(long, default_value_t = TrainConfig::default().warmup_steps)]
    warmup_steps: usize,
    /// AdamW's decoupled weight decay
    #[arg(long, default_value_t = TrainConfig::default().weight_decay)]
    weight_decay: f64,
    /// Sequences in the training set (one epoch)
    #[arg(long, default_value_t = TrainConfig::default().train_sequences)]
    train_sequences: usize,
    /// Write checkpoints to this file (rank 0 only, atomically)
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    /// Write a checkpoint every N steps (and always after the last step)
    #[arg(long, default_value_t = 0, requires = "checkpoint")]
    checkpoint_every: usize,
    /// Continue exactly from the --checkpoint file
    #[arg(long, requires = "checkpoint")]
    resume: bool,
    /// Stop after step N as if the run were interrupted (then try --resume)
    #[arg(long)]
    stop_after: Option<usize>,
    /// Log the loss, accuracy and speed every N steps
    #[arg(long, default_value_t = TrainConfig::default().log_every)]
    log_every: usize,
    /// libtorch threads per rank [default: cores / world size, at least 1]
    #[arg(long)]
    threads: Option<usize>,
    /// Held-out accuracy the finished run must reach, or it exits with status 1
    #[arg(long, default_value_t = 0.99)]
    pub target_accuracy: f64,
    /// The dtype the gradients travel in: bf16 sends half the bytes (chapter
    /// 12's communication hook); the optimizer still steps in f32
    #[arg(long, value_enum, default_value_t = GradDtype::F32)]
    grad_dtype: GradDtype,
    /// What each rank keeps (PyTorch FSDP's ShardingStrategy): none, all of
    /// it (NO_SHARD, DDP); optimizer, 1/N of AdamW's moments (ZeRO-1, chapter
    /// 11); grad-op, also of the gradients (SHARD_GRAD_OP, ZeRO-2, chapter
    /// 13); full, also of the parameters (FULL_SHARD, FSDP, ZeRO-3),
    /// with a sharded checkpoint that resumes on another world size
    #[arg(long, value_enum, default_value_t = ShardArg::None, conflicts_with = "zero")]
    shard: ShardArg,
    /// ZeRO stage, the same choice by number: 0 is --shard none, 1 optimizer,
    /// 2 grad-op, 3 full
    #[arg(long)]
    zero: Option<usize>,
    /// The GPT's size: tiny (104,192 parameters, the chapters' model), 2m,
    /// 10m or 25m (for the benchmarks; they train slowly on a CPU)
    #[arg(long, default_value_t = TrainConfig::default().model)]
    model: GptSize,
}
// ANCHOR_END: flags

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq)]
pub enum Backend {
    InProcess,
    Mpi,
    Nccl,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq)]
pub enum ShardArg {
    None,
    Optimizer,
    GradOp,
    Full,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq)]
pub enum GradDtype {
    F32,
    Bf16,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq)]
pub enum DeviceArg {
    Cpu,
    Cuda,
}

impl Args {
    /// How many ranks share this machine's cores: under MPI, the launcher's
    /// processes on this machine (LOCAL_WORLD_SIZE).
    fn ranks_here(&self) -> usize {
        match (self.backend, dist::LaunchEnv::from_env()) {
            (Backend::Mpi | Backend::Nccl, Ok(Some(env))) => env.local_world_size.unwrap_or(env.world_size),
            _ => self.world_size(),
        }
    }

    /// The flag, or under MPI the launcher's count (`train_as_process`
    /// takes the group's in the end; this one splits --global-batch-size).
    fn world_size(&self) -> usize {
        match (self.backend, dist::LaunchEnv::from_env()) {
            (Backend::Mpi | Backend::Nccl, Ok(Some(env))) => env.world_size,
            (Backend::Mpi, _) => 1, // started without a launcher: a world of one
            (Backend::Nccl, _) => self.world_size.unwrap_or_else(backends::gpu_count),
            _ => self.world_size.unwrap_or(TrainConfig::default().world_size),
        }
    }

    /// The library's settings from the flags; a global batch that does not
    /// split evenly is refused here with chapter 4's message.
    pub fn config(&self) -> anyhow::Result<TrainConfig> {
        let batch_size = match self.global_batch_size {
            Some(global) => {
                // Counts past i64 are refused in words, not wrapped to negative.
                let as_i64 = |what: &str, n: usize| {
                    i64::try_from(n)
                        .map_err(|_| anyhow::anyhow!("{what} {n} is too large (at most {})", i64::MAX))
                };
                let (global, steps) =
                    (as_i64("--global-batch-size", global)?, as_i64("--accum-steps", self.accum_steps)?);
                micro_batch_size(global, self.world_size(), steps)? as usize
            }
            None => self.batch_size,
        };
        Ok(TrainConfig {
            world_size: self.world_size(),
            batch_size,
            accum_steps: self.accum_steps,
            bucket_cap_mb: self.bucket_cap_mb,
            steps: self.steps,
            seed: self.seed,
            lr: self.lr,
            warmup_steps: self.warmup_steps,
            weight_decay: self.weight_decay,
            train_sequences: self.train_sequences,
            log_every: self.log_every,
            checkpoint: self.checkpoint.clone(),
            checkpoint_every: self.checkpoint_every,
            resume: self.resume,
            stop_after: self.stop_after,
            bf16_gradients: self.grad_dtype == GradDtype::Bf16,
            shard: match (self.zero, self.shard) {
                (Some(stage), _) => ShardingStrategy::from_zero_stage(stage)?,
                (None, ShardArg::None) => ShardingStrategy::NoShard,
                (None, ShardArg::Optimizer) => ShardingStrategy::Optimizer,
                (None, ShardArg::GradOp) => ShardingStrategy::ShardGradOp,
                (None, ShardArg::Full) => ShardingStrategy::FullShard,
            },
            model: self.model,
            // The rank threads of the in-process backend share one GPU: on
            // its one default stream, each collective's kernels queue after
            // the backward kernels that wrote its gradients.
            device: match (self.backend, self.device) {
                (Backend::InProcess, Some(DeviceArg::Cuda)) => ddp_workbook::tch::Device::Cuda(0),
                _ => ddp_workbook::tch::Device::Cpu,
            },
            threads_per_rank: Some(
                self.threads.unwrap_or_else(|| default_threads_per_rank(self.ranks_here())),
            ),
            ..TrainConfig::default()
        })
    }
}
