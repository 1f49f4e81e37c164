//! examples/bench_collectives.rs: how fast the in-process backend's
//! all_reduce is, next to the fastest thing that could move the same bytes:
//! one memcpy of the tensor, measured in the same run. Prints a Markdown
//! table: time per all_reduce (median of the slowest rank) and algorithm
//! bandwidth (tensor bytes / time), for 0.4, 4 and 25 MiB of f32 on 1, 2 and
//! 4 ranks, and the all_reduce's bandwidth as a fraction of memcpy's.
//!
//! Run: cargo run --release --example bench_collectives
//!      cargo run --release --example bench_collectives -- --rounds 50 --world-sizes 2
//!
//! Each round, every rank meets the others at a barrier, then times one
//! all_reduce (SUM) of its own tensor; the round takes as long as its
//! slowest rank. A sum of N tensors must read every byte N times and write
//! the result to every rank, so on one machine "memory speed" is the bound:
//! the ratio says how close the backend gets to it.

use std::time::{Duration, Instant};

use clap::Parser;
use ddp_workbook::dist::{spawn, ReduceOp};
use ddp_workbook::tch::{self, Device, Kind, Tensor};

#[path = "support/machine.rs"]
mod machine;
use machine::load_average;

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
}

/// The tensor sizes of the table, in MiB: a small bucket, a medium one, and
/// PyTorch's default bucket cap.
const SIZES_MIB: [f64; 3] = [0.4, 4.0, 25.0];

fn elements(mib: f64) -> i64 {
    (mib * 1024.0 * 1024.0 / 4.0) as i64 // f32
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

/// One memcpy of `mib` MiB, the median over `rounds`.
fn memcpy_time(mib: f64, args: &Args) -> Duration {
    let source = Tensor::ones([elements(mib)], (Kind::Float, Device::Cpu));
    let mut target = Tensor::zeros([elements(mib)], (Kind::Float, Device::Cpu));
    let times = (0..args.warmup + args.rounds)
        .map(|_| {
            let started = Instant::now();
            target.copy_(&source);
            started.elapsed()
        })
        .skip(args.warmup)
        .collect();
    median(times)
}

/// The median over rounds of the slowest rank's all_reduce time.
fn all_reduce_time(world_size: usize, mib: f64, args: &Args) -> anyhow::Result<Duration> {
    let per_rank = spawn(world_size, |pg| {
        let mut tensor = Tensor::full([elements(mib)], pg.rank() as f64, (Kind::Float, Device::Cpu));
        let mut times = Vec::with_capacity(args.rounds);
        for round in 0..args.warmup + args.rounds {
            pg.barrier()?; // start together
            let started = Instant::now();
            pg.all_reduce(&mut tensor, ReduceOp::Sum)?;
            if round >= args.warmup {
                times.push(started.elapsed());
            }
        }
        Ok(times)
    })?;
    let slowest = (0..args.rounds).map(|i| per_rank.iter().map(|t| t[i]).max().unwrap_or_default()).collect();
    Ok(median(slowest))
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.rounds > 0, "--rounds must be at least 1");
    anyhow::ensure!(args.world_sizes.iter().all(|&n| n > 0), "every world size must be at least 1");
    tch::set_num_threads(1); // the rank threads are the parallelism; libtorch's pool would oversubscribe
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let load_before = load_average();
    println!(
        "in-process all_reduce (sum, f32), {cores} cores, {} warm-up + {} timed rounds, median of the slowest rank\n",
        args.warmup, args.rounds
    );
    println!("| size | ranks | all_reduce ms | algbw GB/s | memcpy ms | memcpy GB/s | all_reduce / memcpy bandwidth |");
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for mib in SIZES_MIB {
        let bytes = (elements(mib) * 4) as f64;
        let copy = memcpy_time(mib, &args);
        for &world_size in &args.world_sizes {
            let reduce = all_reduce_time(world_size, mib, &args)?;
            let gbps = |t: Duration| bytes / t.as_secs_f64() / 1e9;
            println!(
                "| {mib} MiB | {world_size} | {:.3} | {:.2} | {:.3} | {:.2} | {:.2}x |",
                reduce.as_secs_f64() * 1e3,
                gbps(reduce),
                copy.as_secs_f64() * 1e3,
                gbps(copy),
                gbps(reduce) / gbps(copy)
            );
        }
    }
    println!("\nload average before: {load_before}, after: {}", load_average());
    Ok(())
}
