//! The real training run: the tiny GPT learns to sort sequences on several
//! in-process ranks with the chapter-7 DDP wrapper, until its accuracy on
//! held-out sequences passes a target.
//!
//! Run it:   cargo run --release --example train
//! Flags:    cargo run --release --example train -- --help
//! As processes (MPI; `scripts/launch.sh` wraps mpirun):
//!           cargo build --release --features mpi --example train
//!           scripts/launch.sh -np 2 target/release/examples/train --backend mpi
//! On GPUs (NCCL; one rank per GPU, as threads, or as processes under mpirun):
//!           cargo run --release --features nccl --example train -- --backend nccl
//!
//! This file is only the command line: the flags, the progress bar and the
//! final report. The loop itself is `ddp_workbook::train` (src/train/).
//! Exit status: 0 when a finished run reached --target-accuracy on the
//! held-out set (or was stopped early on purpose by --stop-after), 1 when it
//! did not, 2 for bad flags or a failed run (the replicas ending in different
//! states included: the last line before the verdict says they did not).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use clap::Parser;
use ddp_workbook::ddp::micro_batch_size;
use ddp_workbook::dist;
use ddp_workbook::train::{self, default_threads_per_rank, Event, RankOutcome, TrainConfig};
use indicatif::{ProgressBar, ProgressStyle};

#[path = "support/train_backends.rs"]
mod backends;
use backends::{as_process, on_gpus};

// ANCHOR: flags
/// Train the tiny GPT on the sorting task with Distributed Data Parallel
/// (in-process ranks). Defaults reach the target accuracy in a few minutes
/// on two CPU cores.
#[derive(Parser, Debug)]
#[command(version, allow_negative_numbers = true)]
struct Args {
    /// in-process: the ranks are threads of this process; mpi: this process is
    /// one rank of a job that scripts/launch.sh (mpirun) started; nccl: one
    /// rank per GPU (threads, or processes under scripts/launch.sh)
    #[arg(long, value_enum, default_value_t = Backend::InProcess)]
    backend: Backend,
    /// Where the model trains; cuda: with nccl one GPU per rank, with
    /// in-process every rank thread on cuda:0 [default: cuda with nccl, else cpu]
    #[arg(long, value_enum)]
    device: Option<DeviceArg>,
    /// Number of ranks (in-process backend; nccl: at most one per GPU; under
    /// MPI the launcher's -np sets it) [default: 2; nccl: every GPU]
    #[arg(long)]
    world_size: Option<usize>,
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
    target_accuracy: f64,
    /// The dtype the gradients travel in: bf16 sends half the bytes (chapter
    /// 12's communication hook); the optimizer still steps in f32
    #[arg(long, value_enum, default_value_t = GradDtype::F32)]
    grad_dtype: GradDtype,
    /// ZeRO stage: 0, plain DDP; 1, AdamW sharded over the ranks (chapter 11):
    /// each keeps 1/N of its moments, the gradients are reduce-scattered
    #[arg(long, default_value_t = TrainConfig::default().zero_stage)]
    zero: usize,
}
// ANCHOR_END: flags

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq)]
enum Backend {
    InProcess,
    Mpi,
    Nccl,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq)]
enum GradDtype {
    F32,
    Bf16,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq)]
enum DeviceArg {
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
    fn config(&self) -> anyhow::Result<TrainConfig> {
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
            zero_stage: self.zero,
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

// ANCHOR: on_event
/// Rank 0's reports, drawn as a progress bar with log lines above it.
fn report(bar: &ProgressBar, event: Event) {
    match event {
        Event::Started { first_step, last_step, parameters, buckets, config } => {
            bar.set_length(last_step as u64);
            bar.set_position(first_step as u64 - 1);
            bar.suspend(|| {
                println!(
                    "tiny GPT, {parameters} parameters in {buckets} bucket(s); {} rank(s) x {} sequences x {} \
                     micro-batch(es) = global batch {}; libtorch threads per rank: {}",
                    config.world_size, config.batch_size, config.accum_steps, config.global_batch(),
                    config.threads_per_rank.map_or("default".to_string(), |t| t.to_string())
                );
                if config.zero_stage == 1 {
                    println!("ZeRO-1: AdamW's moments sharded over the {} rank(s)", config.world_size);
                }
                if first_step > 1 {
                    println!("resuming after step {} from the checkpoint", first_step - 1);
                }
            });
        }
        Event::Stepped { step } => bar.set_position(step as u64),
        Event::Logged { step, loss, accuracy, lr, tokens_per_second } => bar.suspend(|| {
            println!("step {step:>5} | loss {loss:.4} | accuracy {accuracy:.3} | lr {lr:.2e} | {tokens_per_second:>7.0} tokens/s")
        }),
        Event::Checkpointed { step, path } => bar.set_message(format!("checkpoint at step {step}: {}", path.display())),
    }
}
// ANCHOR_END: on_event

/// Set while the ranks run. `spawn`, `spawn_on_gpus` and `dist::mpi::run`
/// catch a rank's panic and report it in the run's error, printed once; a
/// line per rank before it would only repeat it (running out of memory, every
/// rank panics in libtorch's allocator at once).
static RANKS_RUNNING: AtomicBool = AtomicBool::new(false);

/// Runs `ranks` (which starts the ranks and returns when they are done)
/// with the panic hook silent.
fn while_ranks_run<T>(ranks: impl FnOnce() -> T) -> T {
    RANKS_RUNNING.store(true, Ordering::SeqCst);
    let result = ranks();
    RANKS_RUNNING.store(false, Ordering::SeqCst);
    result
}

fn main() -> ExitCode {
    // A panic outside the ranks reports once, in one line (no stack).
    std::panic::set_hook(Box::new(|info| {
        if RANKS_RUNNING.load(Ordering::SeqCst) {
            return;
        }
        let thread = std::thread::current();
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("(no message)");
        eprintln!("{} panicked: {}", thread.name().unwrap_or("a thread"), dist::panic_in_words(message));
    }));
    let args = Args::parse();
    let launched = matches!(dist::LaunchEnv::from_env(), Ok(Some(_)));
    if (args.backend == Backend::Mpi || args.backend == Backend::Nccl && launched)
        && args.world_size.is_some()
    {
        eprintln!("error: under MPI the launcher sets the number of ranks: drop --world-size and pass -np N to scripts/launch.sh");
        return ExitCode::from(2);
    }
    match (args.backend, args.device) {
        (Backend::Nccl, Some(DeviceArg::Cpu)) => {
            eprintln!(
                "error: NCCL moves GPU tensors only: drop --device cpu, or pick --backend in-process or mpi"
            );
            return ExitCode::from(2);
        }
        (Backend::Mpi, Some(DeviceArg::Cuda)) => {
            eprintln!("error: MPI processes train on the CPU: for GPUs pass --backend nccl (under scripts/launch.sh too), or --backend in-process to share one GPU between rank threads");
            return ExitCode::from(2);
        }
        (Backend::InProcess, Some(DeviceArg::Cuda)) if !ddp_workbook::tch::Cuda::is_available() => {
            eprintln!("error: --device cuda: libtorch sees no GPU here (check nvidia-smi and CUDA_VISIBLE_DEVICES), or drop --device cuda to train on the CPU");
            return ExitCode::from(2);
        }
        _ => {}
    }
    let config = match args.config() {
        Ok(config) => config,
        Err(error) => {
            eprintln!("error: {error:#}");
            return ExitCode::from(2);
        }
    };
    let bar = ProgressBar::new(config.steps as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} steps [{elapsed_precise}<{eta_precise}] {msg}")
            .unwrap(),
    );
    let started = Instant::now();
    let outcomes = match (args.backend, launched) {
        (Backend::Mpi, _) => return as_process(&config, &bar, started, args.target_accuracy, false),
        (Backend::Nccl, true) => return as_process(&config, &bar, started, args.target_accuracy, true),
        (Backend::Nccl, false) => while_ranks_run(|| on_gpus(&config, &bar)),
        (Backend::InProcess, _) => while_ranks_run(|| train::train(&config, &|event| report(&bar, event))),
    };
    bar.finish_and_clear();
    match outcomes {
        Ok(outcomes) => summarise(&config, &outcomes, started.elapsed().as_secs_f64(), args.target_accuracy),
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::from(2)
        }
    }
}

// ANCHOR: summary
/// The final lines: speed, communication share, the replicas' agreement, and the verdict.
fn summarise(config: &TrainConfig, outcomes: &[RankOutcome], wall_seconds: f64, target: f64) -> ExitCode {
    let rank0 = &outcomes[0];
    let sync_shares: Vec<String> = outcomes
        .iter()
        .map(|o| format!("{:.1}%", 100.0 * o.sync_time.as_secs_f64() / o.train_time.as_secs_f64().max(1e-9)))
        .collect();
    // Under MPI this process knows its own share only: rank 0's.
    let ranks = if outcomes.len() > 1 { format!("ranks 0..{}", outcomes.len()) } else { "rank 0".into() };
    let sync = match config.zero_stage {
        0 => format!("gradient sync took {} of the step time ({ranks})", sync_shares.join(", ")),
        // The wrapper sent nothing: the optimizer's step reduce-scatters.
        _ => "gradients reduce-scattered inside the optimizer's step (ZeRO-1, not timed apart)".into(),
    };
    println!(
        "{} steps in {wall_seconds:.1} s ({:.1} s in training steps) on {} rank(s): {:.0} tokens/s; {sync}",
        rank0.losses.len(),
        rank0.train_time.as_secs_f64(),
        config.world_size,
        rank0.tokens_per_second,
    );
    // The run compared every rank's final state before it returned (it fails otherwise).
    println!(
        "replicas: bitwise equal on all {} rank(s), fingerprint {:#018x} (the final checkpoint's checksum: \
         weights, optimizer state, progress, settings)",
        config.world_size, rank0.fingerprint
    );
    let eval = rank0.evaluation.expect("rank 0 evaluates");
    if rank0.last_step < config.steps {
        println!(
            "stopped after step {} of {} as asked (held-out accuracy {:.3} so far); continue with --resume",
            rank0.last_step, config.steps, eval.accuracy
        );
        return ExitCode::SUCCESS;
    }
    let verdict = if eval.accuracy >= target { "PASS: reached" } else { "FAIL: missed" };
    println!(
        "{verdict} held-out accuracy {:.4} {} target {target} in {} steps (held-out loss {:.4})",
        eval.accuracy,
        if eval.accuracy >= target { ">=" } else { "<" },
        config.steps,
        eval.loss
    );
    if eval.accuracy >= target {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
// ANCHOR_END: summary
