//! How fast the in-process backend's
//! all_reduce is, next to the fastest thing that could move the same bytes:
//! one memcpy of the tensor, measured in the same run. Prints a Markdown
//! table: time per all_reduce (median of the slowest rank) and algorithm
//! bandwidth (tensor bytes / time), for 0.4, 4 and 25 MiB of f32 on 1, 2 and
//! 4 ranks, and the all_reduce's bandwidth as a fraction of memcpy's.
//!
//! Run: cargo run --release --example bench_collectives
//!      cargo run --release --example bench_collectives -- --rounds 50 --world-sizes 2
//!
//! Chapter 1's α–β figure (chapters/figures/ch01-alpha-beta.svg) is drawn
//! from the points of this run, written with --data (its caption names the
//! machine and its load):
//!      cargo run --release --example bench_collectives -- --world-sizes 2,4 \
//!          --sizes-mib 0.00390625,0.0625,0.4,4,25 --data chapters/figures/data/collectives.tsv
//!
//! The MPI backend on 2 processes, through shared memory and through Open
//! MPI, next to memcpy (examples/support/mpi_collectives.rs):
//!      cargo run --release --features mpi --example bench_collectives -- --backend mpi
//!
//! Each round, every rank meets the others at a barrier, then times one
//! all_reduce (SUM) of its own tensor; the round takes as long as its
//! slowest rank. Next to each time: the spread of the ranks' times in a
//! round and how the ranks waited (examples/support/in_process_timing.rs).
//! `--scheme rank-order|split` forces one of the two algorithms (default:
//! chosen by size and rank count); `--sweep` times both and the choice on
//! 1 to 256 ranks, 4 B to 25 MiB:
//!      cargo run --release --example bench_collectives -- --sweep
//!
//! A sum of N tensors must read every byte N times and write
//! the result to every rank, so on one machine "memory speed" is the bound:
//! the ratio says how close the backend gets to it.

use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use ddp_workbook::dist::local::AllReduceScheme;
use ddp_workbook::tch::{self, Device, Kind, Tensor};

#[path = "support/in_process_timing.rs"]
mod in_process_timing;
#[path = "support/machine.rs"]
mod machine;
#[path = "support/median.rs"]
mod median;
#[path = "support/mpi_collectives.rs"]
mod mpi_collectives;
// The MPI run's table file (chapters/tables/mpi-all-reduce.md).
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
#[path = "support/table_file.rs"]
mod table_file;
use in_process_timing::{sweep, time_all_reduce};
use machine::load_average;
use median::median;

/// `--scheme`: the in-process all_reduce's algorithm.
#[derive(Clone, Copy, ValueEnum)]
enum Scheme {
    Auto,
    RankOrder,
    Split,
}

#[derive(Parser)]
#[command(about = "Time the in-process all_reduce against a memcpy of the same size")]
struct Args {
    /// Timed rounds per case (the median is reported).
    #[arg(long, default_value_t = 30)]
    rounds: usize,
    /// Untimed rounds before them (allocations, first-touch page faults).
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    /// World sizes to run, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 2, 4])]
    world_sizes: Vec<usize>,
    /// Tensor sizes in MiB, comma-separated. The default: a small bucket, a
    /// medium one, and PyTorch's default bucket cap.
    #[arg(long, value_delimiter = ',', default_values_t = [0.4, 4.0, 25.0])]
    sizes_mib: Vec<f64>,
    /// Also write every measured point to this file (tab-separated, with the
    /// command, the machine and its load in `#` lines), for the figures.
    #[arg(long)]
    data: Option<std::path::PathBuf>,
    /// The all_reduce's algorithm: chosen by size and rank count, or forced.
    #[arg(long, value_enum, default_value_t = Scheme::Auto)]
    scheme: Scheme,
    /// Instead of the table: 1 to 256 ranks, 4 B to 25 MiB, each scheme
    /// forced and the automatic choice (at most --rounds rounds a case).
    #[arg(long)]
    sweep: bool,
    /// The sweep's world sizes, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 2, 4, 8, 16, 32, 64, 128, 256])]
    sweep_ranks: Vec<usize>,
}

fn elements(mib: f64) -> i64 {
    (mib * 1024.0 * 1024.0 / 4.0) as i64 // f32
}

/// One memcpy of `numel` f32 (libtorch's copy_, on this thread), the
/// median over `rounds` after `warmup`: the yardstick of both tables, the
/// in-process one and the MPI one (`support/mpi_collectives.rs`).
fn memcpy_time(numel: i64, warmup: usize, rounds: usize) -> Duration {
    let source = Tensor::ones([numel], (Kind::Float, Device::Cpu));
    let mut target = Tensor::zeros([numel], (Kind::Float, Device::Cpu));
    let times = (0..warmup + rounds)
        .map(|_| {
            let started = Instant::now();
            target.copy_(&source);
            started.elapsed()
        })
        .skip(warmup)
        .collect();
    median(times)
}

fn main() -> anyhow::Result<()> {
    if let Some(code) = mpi_collectives::main_if_asked() {
        std::process::exit(code); // --backend mpi: examples/support/mpi_collectives.rs
    }
    let args = Args::parse();
    anyhow::ensure!(args.rounds > 0, "--rounds must be at least 1");
    anyhow::ensure!(args.world_sizes.iter().all(|&n| n > 0), "every world size must be at least 1");
    anyhow::ensure!(
        args.sizes_mib.iter().all(|&mib| elements(mib) > 0),
        "every size must hold at least one f32: --sizes-mib 0.00390625 is 4 KiB"
    );
    tch::set_num_threads(1); // the rank threads are the parallelism; libtorch's pool would oversubscribe
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let load_before = load_average();
    if args.sweep {
        println!("in-process all_reduce (sum, f32), {cores} cores, load average before: {load_before}");
        sweep(&args.sweep_ranks, args.rounds)?;
        println!("\nload average after: {}", load_average());
        return Ok(());
    }
    let scheme = match args.scheme {
        Scheme::Auto => AllReduceScheme::Auto,
        Scheme::RankOrder => AllReduceScheme::RankOrder,
        Scheme::Split => AllReduceScheme::Split,
    };
    println!(
        "in-process all_reduce (sum, f32, scheme {scheme:?}), {cores} cores, {} warm-up + {} timed rounds, \
         median of the slowest rank; spread: slowest rank's time minus the fastest's; waits per round \
         (barrier included): watches won/lost/sleeps/wake-ups\n",
        args.warmup, args.rounds
    );
    println!("| size | ranks | all_reduce ms | algbw GB/s | memcpy ms | memcpy GB/s | all_reduce / memcpy bandwidth | spread ms | waits |");
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | :--- |");
    let mut points = String::from("bytes\tranks\tall_reduce_s\tmemcpy_s\n");
    for &mib in &args.sizes_mib {
        let bytes = (elements(mib) * 4) as f64;
        let copy = memcpy_time(elements(mib), args.warmup, args.rounds);
        for &world_size in &args.world_sizes {
            let measured = time_all_reduce(world_size, elements(mib), scheme, args.warmup, args.rounds)?;
            let reduce = measured.time;
            let gbps = |t: Duration| bytes / t.as_secs_f64() / 1e9;
            println!(
                "| {mib} MiB | {world_size} | {:.3} | {:.2} | {:.3} | {:.2} | {:.2}x | {:.3} | {} |",
                reduce.as_secs_f64() * 1e3,
                gbps(reduce),
                copy.as_secs_f64() * 1e3,
                gbps(copy),
                gbps(reduce) / gbps(copy),
                measured.spread.as_secs_f64() * 1e3,
                measured.waits_per_round()
            );
            points.push_str(&format!(
                "{bytes}\t{world_size}\t{:e}\t{:e}\n",
                reduce.as_secs_f64(),
                copy.as_secs_f64()
            ));
        }
    }
    let load_after = load_average();
    println!("\nload average before: {load_before}, after: {load_after}");
    if let Some(path) = &args.data {
        let command: Vec<String> = std::env::args().skip(1).collect();
        let header = format!(
            "# cargo run --release --example bench_collectives -- {}\n\
             # machine: {cores} cores; load average before: {load_before}, after: {load_after}\n\
             # {} warm-up + {} timed rounds, median of the slowest rank\n",
            command.join(" "),
            args.warmup,
            args.rounds
        );
        std::fs::write(path, header + &points)
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
        println!("points written to {}", path.display());
    }
    Ok(())
}
