//! The workbook's training run against PyTorch's
//! own DistributedDataParallel on the same work, in alternating rounds: the
//! tiny GPT on the sorting task, 16 sequences per rank per micro-batch, 2
//! micro-batches per step (no_sync on the first), AdamW, one libtorch thread
//! per rank. Each round runs, on 2 ranks: PyTorch DDP on gloo at its defaults
//! and at its best CPU settings (`scripts/bench_torch_ddp.py --setting best`:
//! fused AdamW, gradient_as_bucket_view, no buffer broadcast), ours as 2 MPI
//! processes (started by scripts/launch.sh) and as 2 rank threads; on 1 rank,
//! the same per-rank work: PyTorch in one process without DDP (default and
//! fused AdamW) and ours on a 1-rank group. Every run times its steps after
//! --warmup-steps untimed ones. Prints tokens per second (median, min, max
//! over the rounds), the ratios per round, and the cost of distribution of
//! each side: a 2-rank step's time minus a 1-rank step's time. Then one
//! all_reduce of 4 KiB, 0.4, 4 and 25 MiB on each backend. Writes both tables
//! to chapters/tables/vs-pytorch.md and vs-pytorch-all-reduce.md (the book
//! includes them, README links one), with the machine and its load. The all_reduce
//! table is examples/support/vs_pytorch_all_reduce.rs.
//!
//! Run: cargo run --release --features mpi --example bench_vs_pytorch
//!      cargo run --release --features mpi --example bench_vs_pytorch -- --rounds 7 --steps 300
//! (5 rounds of 200 steps: about 5 minutes on a quiet 2-core machine.)

use std::process::Command;

use clap::Parser;
use ddp_workbook::train::{self, TrainConfig};

#[path = "support/vs_pytorch_all_reduce.rs"]
mod all_reduce;
#[path = "support/bench_commands.rs"]
mod commands;
#[path = "support/machine.rs"]
mod machine;
#[path = "support/table_file.rs"]
mod table_file;
#[path = "support/vs_pytorch_tables.rs"]
mod tables;
#[path = "support/train_rates.rs"]
mod train_rates;
use all_reduce::{all_reduce_rows, ALL_REDUCE_ROUNDS};
use commands::{python, root};
use machine::load_average;
use tables::{Column, Rate};
use train_rates::{logged, rate_of, timed_rate};

#[derive(Parser)]
#[command(about = "The workbook's training run against PyTorch DDP (gloo), alternating rounds")]
pub struct Args {
    /// Rounds; each runs every contender once.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Timed optimizer steps per run.
    #[arg(long, default_value_t = 200)]
    steps: usize,
    /// Untimed steps before them (buckets, optimizer state, caches).
    #[arg(long, default_value_t = 20)]
    warmup_steps: usize,
    /// Set by this program when it starts itself under mpirun.
    #[arg(long, value_enum, hide = true)]
    worker: Option<Worker>,
}

#[derive(clap::ValueEnum, Clone, Copy)]
enum Worker {
    Train,
    AllReduce,
}

const COMMAND: &str = "cargo run --release --features mpi --example bench_vs_pytorch";

/// The training run's settings, on `world_size` ranks; it logs every
/// `--warmup-steps` steps, so that the first log closes the untimed window.
fn config(world_size: usize, args: &Args) -> TrainConfig {
    TrainConfig {
        world_size,
        steps: args.warmup_steps + args.steps,
        log_every: args.warmup_steps,
        threads_per_rank: Some(1),
        ..TrainConfig::default()
    }
}

/// Inside mpirun: one rank of a training run or of the all_reduce timings;
/// rank 0 prints the lines the coordinator reads.
#[cfg(feature = "mpi")]
fn worker(kind: Worker, args: &Args) {
    ddp_workbook::tch::set_num_threads(1);
    ddp_workbook::dist::mpi::run(|pg| {
        match kind {
            Worker::Train => {
                let config = config(pg.world_size(), args);
                let logs = logged(&|_| {}, |on_event| {
                    train::train_as_process(pg.clone(), &config, on_event).map(|_| ())
                })?;
                if pg.rank() == 0 {
                    let rate = timed_rate(&logs, &config)?;
                    println!("tokens_per_second {}\nstep_ms {}", rate.tokens_per_second, rate.step_ms);
                }
            }
            Worker::AllReduce => {
                for mib in all_reduce::SIZES_MIB {
                    let plain = all_reduce::time_all_reduce(pg.as_ref(), mib, false)?;
                    let in_place = all_reduce::time_all_reduce(pg.as_ref(), mib, true)?;
                    if pg.rank() == 0 {
                        println!("allreduce {mib} {plain} {in_place}");
                    }
                }
            }
        }
        Ok(())
    })
}

#[cfg(not(feature = "mpi"))]
fn worker(_: Worker, _: &Args) {
    unreachable!("the coordinator refuses to start without the mpi feature")
}

/// This program as 2 MPI processes in `worker` mode.
pub fn mpi_job(kind: &str, args: &Args, debug: &str) -> anyhow::Result<Command> {
    let mut command = Command::new("bash");
    command.arg(root().join("scripts/launch.sh")).args(["-np", "2"]).arg(std::env::current_exe()?);
    command.args(["--worker", kind, "--steps", &args.steps.to_string()]);
    command.args(["--warmup-steps", &args.warmup_steps.to_string()]).env("DDP_DEBUG", debug);
    Ok(command)
}

/// scripts/bench_torch_ddp.py with `extra` arguments, the same steps as ours.
fn torch_run(args: &Args, extra: &[&str]) -> anyhow::Result<Rate> {
    let (steps, warmup) = (args.steps.to_string(), args.warmup_steps.to_string());
    let mut script_args = vec!["--steps", &steps, "--warmup-steps", &warmup];
    script_args.extend(extra);
    Ok(rate_of(python("scripts/bench_torch_ddp.py", &script_args)?)?.0)
}

/// The contenders, in the order each round runs them.
const NAMES: [&str; 7] = [
    "PyTorch DDP, defaults (2 processes, gloo)",
    "PyTorch DDP, best settings (2 processes, gloo)",
    "PyTorch, 1 process, no DDP, default AdamW",
    "PyTorch, 1 process, no DDP, fused AdamW",
    "ours, MPI (2 processes)",
    "ours, in-process (2 threads)",
    "ours, 1 rank",
];
/// Ratios of tokens/s (numerator, denominator), and the cost of
/// distribution (2 ranks, 1 rank on the same per-rank work), by index in NAMES.
const RATIOS: [(usize, usize); 4] = [(4, 1), (4, 0), (5, 1), (6, 3)];
const COSTS: [(usize, usize); 4] = [(0, 2), (1, 3), (4, 6), (5, 6)];

fn run_contender(index: usize, args: &Args) -> anyhow::Result<Rate> {
    let one_process = ["--world-size", "1", "--no-ddp"];
    match index {
        0 => torch_run(args, &["--setting", "defaults"]),
        1 => torch_run(args, &["--setting", "best"]),
        2 => torch_run(args, &[&one_process[..], &["--setting", "defaults"]].concat()),
        3 => torch_run(args, &[&one_process[..], &["--setting", "best"]].concat()),
        4 => Ok(rate_of(mpi_job("train", args, "detail")?)?.0),
        5 | 6 => {
            let config = config(if index == 5 { 2 } else { 1 }, args);
            timed_rate(&logged(&|_| {}, |on_event| train::train(&config, on_event).map(|_| ()))?, &config)
        }
        _ => unreachable!("{} contenders", NAMES.len()),
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(kind) = args.worker {
        worker(kind, &args);
        return Ok(());
    }
    anyhow::ensure!(cfg!(feature = "mpi"), "build with the MPI backend: {COMMAND}");
    anyhow::ensure!(
        args.rounds > 0 && args.steps > 0 && args.warmup_steps > 0,
        "--rounds, --steps and --warmup-steps must be at least 1"
    );
    let mut run = table_file::Run::start();
    let mut rates: Vec<Vec<Rate>> = vec![vec![]; NAMES.len()];
    for round in 1..=args.rounds {
        let mut line = vec![];
        for (index, name) in NAMES.iter().enumerate() {
            let rate = run_contender(index, &args)?;
            line.push(format!("{name} {:.0}", rate.tokens_per_second));
            rates[index].push(rate);
        }
        println!("round {round}: {} tokens/s (load {})", line.join(", "), load_average());
    }
    let columns: Vec<Column> = NAMES.iter().zip(&rates).map(|(name, rates)| Column { name, rates }).collect();
    let training = tables::training_tables(&columns, &RATIOS, &COSTS);
    run.note_load("after the training runs");
    let all_reduce = all_reduce_rows()?;
    let setup = format!(
        "16 sequences per rank per micro-batch, 2 micro-batches per step, {} timed steps after {} untimed \
         ones per run, {} alternating rounds; one libtorch thread per rank",
        args.steps, args.warmup_steps, args.rounds
    );
    // One caption for both tables: the all_reduce table has no settings of its own.
    let command = table_file::command_line(COMMAND);
    let machine = run.caption(&[], &command);
    let training = format!("{training}\n- {setup}\n{machine}");
    let all_reduce = format!(
        "One all_reduce (sum, f32, 2 ranks), median of {ALL_REDUCE_ROUNDS} after 5 untimed, rank 0, after a \
         barrier:\n\n{all_reduce}\n{machine}"
    );
    println!("\n{training}\n{all_reduce}");
    for (path, body) in [
        ("chapters/tables/vs-pytorch.md", &training),
        ("chapters/tables/vs-pytorch-all-reduce.md", &all_reduce),
    ] {
        println!("wrote {}", table_file::write_table(path, &command, body)?.display());
    }
    Ok(())
}
