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
//! This example is only the command line: this file checks the flags that
//! do not go together and starts the ranks; the flags are
//! examples/support/train_flags.rs, the progress bar and the final report
//! examples/support/train_output.rs. The loop itself is
//! `ddp_workbook::train` (src/train/).
//! Exit status: 0 when a finished run reached --target-accuracy on the
//! held-out set (or was stopped early on purpose by --stop-after), 1 when it
//! did not, 2 for bad flags or a failed run (the replicas ending in different
//! states included: the last line before the verdict says they did not).

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use clap::Parser;
use ddp_workbook::dist;
use ddp_workbook::train;
use indicatif::{ProgressBar, ProgressStyle};

#[path = "support/train_backends.rs"]
mod backends;
#[path = "support/train_flags.rs"]
mod flags;
#[path = "support/train_output.rs"]
mod output;
use backends::{as_process, on_gpus};
use flags::{Args, Backend, DeviceArg};
use output::{report, summarise};

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
