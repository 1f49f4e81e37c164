//! The training run's settings: [`TrainConfig`], what each one means, and
//! [`TrainConfig::validate`], which refuses a run that cannot work before
//! any rank starts, each error saying what to change. On `--resume` it also
//! checks that the checkpoint fits these settings ([`TrainConfig::fits`]).

use std::path::{Path, PathBuf};

use super::checkpoint::{self, Checkpoint, CheckpointError, LoopPosition, Setting};
use crate::ddp::{BucketCaps, MIB};

// ANCHOR: config
/// Everything that defines a training run. `TrainConfig::default()` is the
/// run of `cargo run --release --example train`.
#[derive(Clone, Debug)]
pub struct TrainConfig {
    /// Ranks (threads of this process, in-process backend).
    pub world_size: usize,
    /// Sequences per rank per micro-batch.
    pub batch_size: usize,
    /// Micro-batches per optimizer step: global batch = batch_size x accum_steps x world_size.
    pub accum_steps: usize,
    /// Bucket cap in MiB (PyTorch's `bucket_cap_mb`); the first bucket gets
    /// at most 1 MiB, as in PyTorch.
    pub bucket_cap_mb: f64,
    /// Optimizer steps of the whole run.
    pub steps: usize,
    /// Seeds the model, the data and the sampler's shuffles.
    pub seed: u64,
    /// Peak learning rate, reached after `warmup_steps`, then cosine decay to a tenth.
    pub lr: f64,
    pub warmup_steps: usize,
    /// AdamW's decoupled weight decay.
    pub weight_decay: f64,
    /// Sequences in the training set (an epoch), and in the held-out set.
    pub train_sequences: usize,
    pub eval_sequences: usize,
    /// Rank 0 logs the global batch's loss and accuracy every this many steps.
    pub log_every: usize,
    /// Where rank 0 writes checkpoints; `None`: no checkpoints.
    pub checkpoint: Option<PathBuf>,
    /// Write one every this many steps (and always at the end, or where
    /// `stop_after` stops the run); 0: only at the end.
    pub checkpoint_every: usize,
    /// Continue from the checkpoint file instead of starting afresh.
    pub resume: bool,
    /// Stop after this step as if the run had been interrupted (to try `resume`).
    pub stop_after: Option<usize>,
    /// libtorch's intra-op threads for each rank; `None` leaves libtorch's default.
    pub threads_per_rank: Option<usize>,
    /// This rank's device: the CPU, or a GPU (`Device::Cuda(i)`: with the
    /// NCCL backend each rank gets its own, rank r on `cuda:r`).
    pub device: tch::Device,
    /// Send the gradients as bfloat16, half the bytes (chapter 12's
    /// `ddp::bf16_compress_hook`); `false`: in their own dtype.
    pub bf16_gradients: bool,
    /// What each rank keeps of the model's state ([`ShardingStrategy`],
    /// `--shard`): everything (DDP), or its shard of AdamW's state (ZeRO-1),
    /// or of the parameters, gradients and state (FSDP's `FULL_SHARD`).
    pub shard: ShardingStrategy,
    /// The GPT's size (`GptSize::Tiny`, the model the chapters train; the
    /// larger ones are for the benchmarks): its layers, heads and width,
    /// fitted to the task's vocabulary and context.
    pub model: crate::models::GptSize,
}

// ANCHOR: sharding_strategy
/// What each rank keeps, named after PyTorch FSDP's `ShardingStrategy`
/// (and ZeRO's stages, which `--zero N` still selects).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShardingStrategy {
    /// `NO_SHARD`, ZeRO-0: plain DDP, every rank holds everything.
    NoShard,
    /// ZeRO-1: AdamW sharded over the ranks (`ddp::ShardedAdamW`, chapter
    /// 11): each keeps 1/world_size of the moments; the optimizer
    /// reduce-scatters the gradients instead of the wrapper all-reducing them.
    Optimizer,
    /// `SHARD_GRAD_OP`, ZeRO-2: gradients and optimizer state sharded
    /// (`ddp::ShardGradOp`, chapter 13): each bucket's gradients are
    /// reduce-scattered during backward; checkpoints gather the moments.
    ShardGradOp,
    /// `FULL_SHARD`, ZeRO-3: parameters, gradients and optimizer state
    /// sharded (`ddp::FullyShard`, each transformer block a unit);
    /// checkpoints are sharded too, one file per rank.
    FullShard,
}

impl ShardingStrategy {
    /// The word of `--shard` (and of the checkpoint's `shard` setting).
    pub fn name(self) -> &'static str {
        match self {
            ShardingStrategy::NoShard => "none",
            ShardingStrategy::Optimizer => "optimizer",
            ShardingStrategy::ShardGradOp => "grad-op",
            ShardingStrategy::FullShard => "full",
        }
    }

    /// `--zero N`, the older flag: ZeRO stage N.
    pub fn from_zero_stage(stage: usize) -> Result<ShardingStrategy, ConfigError> {
        match stage {
            0 => Ok(ShardingStrategy::NoShard),
            1 => Ok(ShardingStrategy::Optimizer),
            2 => Ok(ShardingStrategy::ShardGradOp),
            3 => Ok(ShardingStrategy::FullShard),
            other => Err(ConfigError::ZeroStage(other)),
        }
    }
}
// ANCHOR_END: sharding_strategy

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            world_size: 2,
            batch_size: 16,
            accum_steps: 2,
            bucket_cap_mb: 25.0,
            steps: 600,
            seed: 1337,
            lr: 3e-3,
            warmup_steps: 50,
            weight_decay: 0.0,
            train_sequences: 20_000,
            eval_sequences: 2_000,
            log_every: 50,
            checkpoint: None,
            checkpoint_every: 0,
            resume: false,
            stop_after: None,
            threads_per_rank: Some(default_threads_per_rank(2)),
            device: tch::Device::Cpu,
            bf16_gradients: false,
            shard: ShardingStrategy::NoShard,
            model: crate::models::GptSize::Tiny,
        }
    }
}
// ANCHOR_END: config

/// The cores of this machine shared out among `world_size` ranks, at least
/// one each. All ranks share one libtorch, whose thread pool would otherwise
/// give every rank's ops all the cores, and the ranks would fight over them.
pub fn default_threads_per_rank(world_size: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / world_size.max(1)).max(1)
}

/// A setting that cannot make a run. Each message says what to change.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{name} must be at least 1, got 0")]
    Zero { name: &'static str },
    #[error("{name} must be a positive, finite number, got {value}")]
    NotPositive { name: &'static str, value: f64 },
    #[error("weight_decay must be a finite number >= 0, got {0}")]
    NegativeDecay(f64),
    #[error(
        "{train_sequences} training sequences over {world_size} rank(s) leave each rank {shard}, fewer \
         than one micro-batch of {batch_size}: use more sequences, fewer ranks or a smaller batch"
    )]
    TooLittleData { train_sequences: usize, world_size: usize, shard: usize, batch_size: usize },
    #[error("{0} needs a checkpoint file: add --checkpoint PATH")]
    NoCheckpointPath(&'static str),
    #[error("stop_after ({stop_after}) must lie between 1 and steps ({steps}) - 1 to interrupt the run")]
    StopAfter { stop_after: usize, steps: usize },
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error("{0}")]
    Timeout(String),
    #[error(
        "there is no ZeRO stage {0}: use --zero 0 (plain DDP), 1 (AdamW sharded over the ranks), 2 \
         (gradients too) or 3 (FSDP), or --shard none|optimizer|grad-op|full"
    )]
    ZeroStage(usize),
    #[error(
        "--shard {0} and --grad-dtype bf16 do not go together: bf16 is a hook on the DDP wrapper's \
         all-reduce, and when sharded the gradients are reduce-scattered instead; drop one of the two"
    )]
    ZeroWithBf16(&'static str),
    #[error(
        "--shard full runs on the CPU only (FSDP frees a unit's parameters by resizing their \
         storage, which this library does on the CPU): drop --device cuda or use another --shard"
    )]
    FullShardOnGpu,
}

impl TrainConfig {
    /// Sequences per optimizer step over all ranks.
    pub fn global_batch(&self) -> usize {
        self.batch_size * self.accum_steps * self.world_size
    }

    /// The gradient buckets' caps: `bucket_cap_mb`, and the first bucket at
    /// most PyTorch's 1 MiB.
    pub fn bucket_caps(&self) -> BucketCaps {
        let cap_bytes = ((self.bucket_cap_mb * MIB as f64) as usize).max(1);
        BucketCaps { cap_bytes, first_cap_bytes: cap_bytes.min(BucketCaps::default().first_cap_bytes) }
    }

    /// Checks every setting, and on `resume` the checkpoint file (it exists,
    /// is intact, and was written with these settings).
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_reading(true)
    }

    /// [`validate`](Self::validate); with `read_checkpoint` false, on
    /// `resume` only that the file exists: for a caller that reads and
    /// checks it next anyway (a launched job's rank 0, `resume.rs`), so that
    /// the file is read once.
    pub(super) fn validate_reading(&self, read_checkpoint: bool) -> Result<(), ConfigError> {
        for (name, value) in [
            ("world_size", self.world_size),
            ("batch_size", self.batch_size),
            ("accum_steps", self.accum_steps),
            ("steps", self.steps),
            ("log_every", self.log_every),
            ("eval_sequences", self.eval_sequences),
        ] {
            if value == 0 {
                return Err(ConfigError::Zero { name });
            }
        }
        // A bad DDP_TIMEOUT_SECS is refused now, not after the set-up.
        crate::dist::timeout_from_env().map_err(ConfigError::Timeout)?;
        if self.threads_per_rank == Some(0) {
            return Err(ConfigError::Zero { name: "threads_per_rank" });
        }
        for (name, value) in [("lr", self.lr), ("bucket_cap_mb", self.bucket_cap_mb)] {
            if !(value.is_finite() && value > 0.0) {
                return Err(ConfigError::NotPositive { name, value });
            }
        }
        match (self.shard, self.bf16_gradients) {
            (ShardingStrategy::NoShard, _) => {}
            (other, true) => return Err(ConfigError::ZeroWithBf16(other.name())),
            (_, false) => {}
        }
        if self.shard == ShardingStrategy::FullShard && self.device != tch::Device::Cpu {
            return Err(ConfigError::FullShardOnGpu);
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return Err(ConfigError::NegativeDecay(self.weight_decay));
        }
        // The sampler pads every shard to ceil(n / world_size) sequences.
        let shard = self.train_sequences.div_ceil(self.world_size);
        if self.train_sequences == 0 || shard < self.batch_size {
            let (train_sequences, world_size, batch_size) =
                (self.train_sequences, self.world_size, self.batch_size);
            return Err(ConfigError::TooLittleData { train_sequences, world_size, shard, batch_size });
        }
        if let Some(stop_after) = self.stop_after {
            if stop_after == 0 || stop_after >= self.steps {
                return Err(ConfigError::StopAfter { stop_after, steps: self.steps });
            }
        }
        match &self.checkpoint {
            None if self.resume => Err(ConfigError::NoCheckpointPath("--resume")),
            None if self.checkpoint_every > 0 => Err(ConfigError::NoCheckpointPath("--checkpoint-every")),
            Some(path) => {
                if self.resume && read_checkpoint {
                    self.fits(&checkpoint::load(path)?, path)?;
                } else if self.resume && !path.is_file() {
                    return Err(CheckpointError::Missing { path: path.to_path_buf() }.into());
                }
                // Found now, not after the whole run has trained.
                checkpoint::check_writable(path)?;
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// The settings that fix the run's numbers, to the last bit, by name.
    /// A checkpoint stores them and a resume must match them all; the ranks
    /// of a run compare them before the first step (`agreement.rs`). The
    /// others (log and checkpoint intervals, stop_after, the held-out set)
    /// change what is printed and saved, never a weight.
    ///
    /// Some change the bits only on some backends, and are here all the
    /// same: the bucket cap and the ZeRO stage leave every element's sum in
    /// rank order on the in-process backend (`cargo test --test train_zero`),
    /// but NCCL's ring and Open MPI's algorithms split each message into
    /// chunks whose sums start at different ranks, so on 3 or more ranks
    /// another bucket layout, or a reduce-scatter in place of an
    /// all-reduce, rounds differently.
    pub fn settings(&self) -> Vec<(String, Setting)> {
        // Every field named: a new one does not compile until it is sorted
        // into what changes the numbers and what does not.
        let TrainConfig {
            world_size,
            batch_size,
            accum_steps,
            bucket_cap_mb,
            steps,
            seed,
            lr,
            warmup_steps,
            weight_decay,
            train_sequences,
            eval_sequences: _,
            log_every: _,
            checkpoint: _,
            checkpoint_every: _,
            resume: _,
            stop_after: _,
            threads_per_rank,
            device,
            bf16_gradients,
            shard,
            model,
        } = self;
        let int = |name: &str, v: usize| (name.to_string(), Setting::Int(v as i64));
        let float = |name: &str, v: f64| (name.to_string(), Setting::Float(v));
        let text = |name: &str, v: &str| (name.to_string(), Setting::Text(v.to_string()));
        // libtorch splits sums over its threads: another count rounds
        // differently. Unset, libtorch's own count, which the cores decide.
        let threads = threads_per_rank.unwrap_or_else(|| tch::get_num_threads().max(1) as usize);
        let device = match device {
            tch::Device::Cuda(_) => "cuda".to_string(), // other kernels; which GPU does not matter
            other => format!("{other:?}").to_lowercase(),
        };
        vec![
            int("world_size", *world_size),
            int("batch_size", *batch_size),
            int("accum_steps", *accum_steps),
            float("bucket_cap_mb", *bucket_cap_mb),
            int("steps", *steps),
            ("seed".to_string(), Setting::Int(*seed as i64)),
            float("lr", *lr),
            int("warmup_steps", *warmup_steps),
            float("weight_decay", *weight_decay),
            int("train_sequences", *train_sequences),
            int("threads_per_rank", threads),
            text("device", &device),
            // The gradients' dtype on the wire: the comm hook the run registers.
            text("grad_dtype", if *bf16_gradients { "bf16" } else { "f32" }),
            text("shard", shard.name()),
            text("model", model.name()),
        ]
    }

    /// Whether a checkpoint fits this run: written with the same settings,
    /// and before the run's end. A checkpoint of the last step is refused:
    /// the run has finished, and a resume would run no step and succeed on
    /// whatever the file holds.
    pub fn fits(&self, saved: &Checkpoint, path: &Path) -> Result<(), CheckpointError> {
        let mut expected = self.settings();
        if self.shard == ShardingStrategy::FullShard {
            // A sharded checkpoint is put back together and resharded: it
            // may resume on another world size, with the same global batch.
            expected.retain(|(name, _)| name != "world_size" && name != "batch_size");
        }
        saved.check_settings(path, &expected)?;
        self.resumed_position(saved, path)?;
        let step = saved.progress.step;
        if step as usize == self.steps {
            return Err(CheckpointError::Finished { path: path.to_path_buf(), step: self.steps });
        }
        if step as usize > self.steps {
            let detail = format!("it is at step {step}, past this run's {} steps", self.steps);
            return Err(CheckpointError::Invalid { path: path.to_path_buf(), detail });
        }
        if let Some(stop_after) = self.stop_after.filter(|&s| s as i64 <= step) {
            let detail = format!("it is at step {step}, already past --stop-after {stop_after}");
            return Err(CheckpointError::Invalid { path: path.to_path_buf(), detail });
        }
        Ok(())
    }

    /// Where this run's ranks continue in their shards of the data after
    /// `saved`: its own position, or, resumed on another world size, the
    /// same place in the epoch's order (rank r's shard holds every
    /// world_size-th index of it, so `position` rows of each of W shards
    /// are the first `position x W` of the epoch). That needs the same
    /// global batch per step, and a data set that no world size pads.
    pub fn resumed_position(&self, saved: &Checkpoint, path: &Path) -> Result<LoopPosition, CheckpointError> {
        let int = |name: &str| match saved.settings.iter().find(|(n, _)| n == name) {
            Some((_, Setting::Int(v))) => Ok(*v as usize),
            _ => Err(CheckpointError::Invalid {
                path: path.to_path_buf(),
                detail: format!("it has no `{name}` setting"),
            }),
        };
        let (world, batch) = (int("world_size")?, int("batch_size")?);
        if (world, batch) == (self.world_size, self.batch_size) {
            return Ok(saved.progress);
        }
        let differ = |detail: String| CheckpointError::SettingsDiffer { path: path.to_path_buf(), detail };
        let saved_global = world * batch * self.accum_steps;
        if saved_global != self.global_batch() {
            let per_rank = saved_global / (self.accum_steps * self.world_size).max(1);
            return Err(differ(format!(
                "global batch: checkpoint {saved_global} ({world} rank(s) x batch {batch} x {} \
                 micro-batches), this run {}; on {} rank(s) keep it with --batch-size {per_rank}, \
                 or --global-batch-size {saved_global}",
                self.accum_steps,
                self.global_batch(),
                self.world_size
            )));
        }
        let n = self.train_sequences;
        if !n.is_multiple_of(world) || !n.is_multiple_of(self.world_size) {
            return Err(differ(format!(
                "train_sequences {n} is not a multiple of both world sizes ({world} and {}): the \
                 sampler pads each epoch to a multiple of the world size, so the epochs would hold \
                 other sequences; resume on {world} rank(s)",
                self.world_size
            )));
        }
        let taken = saved.progress.position as usize * world; // of this epoch's order
        if !taken.is_multiple_of(self.world_size) {
            return Err(differ(format!(
                "the checkpoint stopped {taken} sequences into its epoch, which {} rank(s) cannot \
                 split evenly; resume on {world} rank(s)",
                self.world_size
            )));
        }
        Ok(LoopPosition { position: (taken / self.world_size) as i64, ..saved.progress })
    }
}
