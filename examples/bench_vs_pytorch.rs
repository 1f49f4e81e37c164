//! examples/bench_vs_pytorch.rs: the workbook's training run against PyTorch's
//! own DistributedDataParallel on the same work, in alternating rounds: the
//! tiny GPT on the sorting task, 2 ranks, 16 sequences per rank per
//! micro-batch, 2 micro-batches per step (no_sync on the first), AdamW, one
//! libtorch thread per rank. Ours runs as 2 MPI processes (started by
//! scripts/launch.sh, with the signature check on and off) and as 2 rank
//! threads of the in-process backend; PyTorch's as 2 processes on gloo
//! (`scripts/bench_torch_ddp.py`, with the project's `.venv`). Prints tokens
//! per second of each, median, min and max over the rounds, the ratios, and
//! the time of one all_reduce of 4 KiB, 0.4, 4 and 25 MiB on each backend.
//!
//! Run: cargo run --release --features mpi --example bench_vs_pytorch
//!      cargo run --release --features mpi --example bench_vs_pytorch -- --rounds 7 --steps 300

use std::process::Command;
use std::time::{Duration, Instant};

use clap::Parser;
use ddp_workbook::dist::{spawn, ProcessGroup, ReduceOp};
use ddp_workbook::tch::{Device, Kind, Tensor};
use ddp_workbook::train::{self, TrainConfig};

#[path = "support/machine.rs"]
mod machine;
use machine::load_average;

#[derive(Parser)]
#[command(about = "The workbook's training run against PyTorch DDP (gloo), alternating rounds")]
struct Args {
    /// Rounds; each runs every contender once.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Optimizer steps per run.
    #[arg(long, default_value_t = 200)]
    steps: usize,
    /// Set by this program when it starts itself under mpirun.
    #[arg(long, value_enum, hide = true)]
    worker: Option<Worker>,
}

#[derive(clap::ValueEnum, Clone, Copy)]
enum Worker {
    Train,
    AllReduce,
}

/// The all_reduce sizes, in MiB: a tiny message (where a signature
/// exchange shows), a small bucket, a medium one, PyTorch's default cap.
const SIZES_MIB: [f64; 4] = [0.004, 0.4, 4.0, 25.0];
const ALL_REDUCE_ROUNDS: usize = 30;

fn summary(values: &[f64]) -> (f64, f64, f64) {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    (sorted[sorted.len() / 2], sorted[0], sorted[sorted.len() - 1])
}

fn config(steps: usize) -> TrainConfig {
    TrainConfig {
        steps,
        log_every: steps,
        warmup_steps: steps.min(50),
        threads_per_rank: Some(1),
        ..TrainConfig::default()
    }
}

/// Rank 0's median time of one all_reduce of `mib`, each after a barrier.
fn time_all_reduce(pg: &dyn ProcessGroup, mib: f64) -> anyhow::Result<f64> {
    let mut tensor = Tensor::ones([(mib * 1024.0 * 1024.0 / 4.0) as i64], (Kind::Float, Device::Cpu));
    let mut times = vec![];
    for round in 0..ALL_REDUCE_ROUNDS + 5 {
        pg.barrier()?;
        let started = Instant::now();
        pg.all_reduce(&mut tensor, ReduceOp::Sum)?;
        if round >= 5 {
            times.push(started.elapsed().as_secs_f64());
        }
    }
    Ok(summary(&times).0)
}

/// Inside mpirun: one rank of a training run or of the all_reduce timings;
/// rank 0 prints the lines the coordinator reads.
#[cfg(feature = "mpi")]
fn worker(kind: Worker, steps: usize) {
    ddp_workbook::tch::set_num_threads(1);
    ddp_workbook::dist::mpi::run(|pg| {
        match kind {
            Worker::Train => {
                let outcome = train::train_as_process(pg.clone(), &config(steps), &|_| {})?;
                if pg.rank() == 0 {
                    println!("tokens_per_second {}", outcome.tokens_per_second);
                }
            }
            Worker::AllReduce => {
                for mib in SIZES_MIB {
                    let seconds = time_all_reduce(pg.as_ref(), mib)?;
                    if pg.rank() == 0 {
                        println!("allreduce {mib} {seconds}");
                    }
                }
            }
        }
        Ok(())
    })
}

#[cfg(not(feature = "mpi"))]
fn worker(_: Worker, _: usize) {
    unreachable!("the coordinator refuses to start without the mpi feature")
}

/// Runs a command and returns the `prefix` lines of its stdout, split.
fn lines_of(mut command: Command, prefix: &str) -> anyhow::Result<Vec<Vec<f64>>> {
    let output = command.output()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    anyhow::ensure!(
        output.status.success(),
        "{command:?} failed: {}{}",
        stdout,
        String::from_utf8_lossy(&output.stderr)
    );
    let values: Vec<Vec<f64>> = stdout
        .lines()
        .filter_map(|line| line.strip_prefix(prefix))
        .map(|rest| rest.split_whitespace().filter_map(|v| v.parse().ok()).collect())
        .collect();
    anyhow::ensure!(!values.is_empty(), "no `{prefix}` line in {stdout:?}");
    Ok(values)
}

fn root() -> &'static std::path::Path {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// This program as 2 MPI processes in `worker` mode.
fn mpi_job(kind: &str, steps: usize, debug: &str) -> anyhow::Result<Command> {
    let mut command = Command::new("bash");
    command.arg(root().join("scripts/launch.sh")).args(["-np", "2"]).arg(std::env::current_exe()?);
    command.args(["--worker", kind, "--steps", &steps.to_string()]).env("DDP_DEBUG", debug);
    Ok(command)
}

fn python(script: &str, args: &[&str]) -> anyhow::Result<Command> {
    let python = root().join(".venv/bin/python");
    anyhow::ensure!(python.is_file(), "{} is missing: run scripts/setup.sh", python.display());
    let mut command = Command::new(python);
    command.arg(root().join(script)).args(args);
    Ok(command)
}

fn ours_in_process(steps: usize) -> anyhow::Result<f64> {
    Ok(train::train(&config(steps), &|_| {})?[0].tokens_per_second)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(kind) = args.worker {
        worker(kind, args.steps);
        return Ok(());
    }
    anyhow::ensure!(
        cfg!(feature = "mpi"),
        "build with the MPI backend: cargo run --release --features mpi --example bench_vs_pytorch"
    );
    anyhow::ensure!(args.rounds > 0 && args.steps > 0, "--rounds and --steps must be at least 1");
    let load_before = load_average();
    let started = Instant::now();
    let steps = args.steps.to_string();
    let names = [
        "ours, MPI (2 processes)",
        "ours, MPI, DDP_DEBUG=off",
        "ours, in-process (2 threads)",
        "PyTorch DDP, gloo (2 processes)",
    ];
    let mut rates: [Vec<f64>; 4] = Default::default();
    for round in 1..=args.rounds {
        rates[0].push(lines_of(mpi_job("train", args.steps, "detail")?, "tokens_per_second")?[0][0]);
        rates[1].push(lines_of(mpi_job("train", args.steps, "off")?, "tokens_per_second")?[0][0]);
        rates[2].push(ours_in_process(args.steps)?);
        rates[3].push(
            lines_of(python("scripts/bench_torch_ddp.py", &["--steps", &steps])?, "tokens_per_second")?[0][0],
        );
        let line: Vec<String> =
            names.iter().zip(&rates).map(|(n, r)| format!("{n} {:.0}", r[round - 1])).collect();
        println!("round {round}: {} tokens/s", line.join(", "));
    }
    println!(
        "\n2 ranks x 16 sequences x 2 micro-batches, {} steps per run, {} alternating rounds\n",
        args.steps, args.rounds
    );
    println!("| run | tokens/s median | min | max |\n| --- | ---: | ---: | ---: |");
    for (name, rates) in names.iter().zip(&rates) {
        let (median, min, max) = summary(rates);
        println!("| {name} | {median:.0} | {min:.0} | {max:.0} |");
    }
    for (i, name) in [(0, "MPI"), (2, "in-process")] {
        let ratios: Vec<f64> = rates[i].iter().zip(&rates[3]).map(|(a, b)| a / b).collect();
        let (median, min, max) = summary(&ratios);
        println!("| ratio, ours ({name}) / PyTorch, per round | {median:.2}x | {min:.2}x | {max:.2}x |");
    }

    let in_process = spawn(2, |pg| {
        SIZES_MIB.iter().map(|&mib| time_all_reduce(pg.as_ref(), mib)).collect::<Result<Vec<_>, _>>()
    })?;
    let mpi_on = lines_of(mpi_job("all-reduce", 0, "detail")?, "allreduce")?;
    let mpi_off = lines_of(mpi_job("all-reduce", 0, "off")?, "allreduce")?;
    let sizes: Vec<String> = SIZES_MIB.iter().map(f64::to_string).collect();
    let mut gloo_args = vec!["--sizes"];
    gloo_args.extend(sizes.iter().map(String::as_str));
    let gloo = lines_of(python("scripts/bench_torch_allreduce.py", &gloo_args)?, "allreduce")?;
    println!(
        "\nOne all_reduce (sum, f32, 2 ranks), median of {ALL_REDUCE_ROUNDS}, rank 0, after a barrier:\n"
    );
    println!("| MiB | in-process | MPI | MPI, DDP_DEBUG=off | gloo |\n| ---: | ---: | ---: | ---: | ---: |");
    let ms = |s: f64| format!("{:.3} ms", s * 1e3);
    for (i, mib) in SIZES_MIB.iter().enumerate() {
        println!(
            "| {mib} | {} | {} | {} | {} |",
            ms(in_process[0][i]),
            ms(mpi_on[i][1]),
            ms(mpi_off[i][1]),
            ms(gloo[i][1])
        );
    }
    let took = Duration::from_secs(started.elapsed().as_secs());
    println!("\ntook {took:?}; load average before: {load_before}, after: {}", load_average());
    Ok(())
}
