//! The NCCL backend's all_reduce on this machine's
//! GPUs: one rank per GPU, a float32 tensor of 4, 25 and 256 MiB, one SUM
//! per round after a barrier; prints the median time of the slowest rank and
//! the algorithm bandwidth (tensor bytes / time) and bus bandwidth
//! (x 2(N-1)/N, what nccl-tests reports). With one GPU (a world of one) an
//! in-place sum moves nothing, so the times are the call's own cost and no
//! bandwidth is printed. Needs a GPU; elsewhere it says why and exits 2.
//!
//! Run: cargo run --release --features nccl --example bench_nccl
//!      cargo run --release --features nccl --example bench_nccl -- --ranks 1 --rounds 50

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use ddp_workbook::dist::{nccl, ReduceOp};
use ddp_workbook::tch::{Device, Kind, Tensor};

#[derive(Parser)]
#[command(about = "Time the NCCL backend's all_reduce on this machine's GPUs")]
struct Args {
    /// Timed rounds per size (the median is reported), after 5 untimed ones.
    #[arg(long, default_value_t = 20)]
    rounds: usize,
    /// Ranks, one per GPU [default: every GPU].
    #[arg(long)]
    ranks: Option<usize>,
    /// Sizes in MiB, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [4.0, 25.0, 256.0])]
    mib: Vec<f64>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.rounds == 0 || args.mib.iter().any(|&mib| mib.is_nan() || mib <= 0.0) {
        eprintln!("error: --rounds and every --mib must be positive");
        return ExitCode::from(2);
    }
    let gpus = match nccl::available() {
        Ok(gpus) => gpus,
        Err(why) => {
            eprintln!("error: no GPU for NCCL here: {why}");
            return ExitCode::from(2);
        }
    };
    let world = args.ranks.unwrap_or(gpus);
    println!(
        "NCCL {}, {world} rank(s), one per GPU, median of {} rounds\n",
        nccl::version().unwrap_or_default(),
        args.rounds
    );
    println!("| MiB | time | algorithm bandwidth | bus bandwidth |\n| ---: | ---: | ---: | ---: |");
    let timed = nccl::spawn_on_gpus(world, |pg| {
        let mut medians = vec![];
        for &mib in &args.mib {
            let numel = (mib * 1024.0 * 1024.0 / 4.0) as i64;
            let mut tensor = Tensor::ones([numel], (Kind::Float, Device::Cuda(pg.rank())));
            let mut times = vec![];
            for round in 0..args.rounds + 5 {
                pg.barrier()?;
                let started = Instant::now();
                pg.all_reduce(&mut tensor, ReduceOp::Sum)?; // waits on the GPU's event
                if round >= 5 {
                    times.push(started.elapsed());
                }
            }
            times.sort();
            medians.push(times[times.len() / 2]);
        }
        Ok(medians)
    });
    let per_rank: Vec<Vec<Duration>> = match timed {
        Ok(times) => times,
        Err(why) => {
            eprintln!("error: {why}");
            return ExitCode::from(2);
        }
    };
    for (i, &mib) in args.mib.iter().enumerate() {
        let slowest = per_rank.iter().map(|times| times[i]).max().expect("ranks");
        let time = slowest.as_secs_f64() * 1e3;
        if world == 1 {
            println!("| {mib} | {time:.3} ms | (one rank: nothing moves) | |");
            continue;
        }
        let algorithm = mib * 1024.0 * 1024.0 / slowest.as_secs_f64() / 1e9;
        let bus = algorithm * 2.0 * (world as f64 - 1.0) / world as f64;
        println!("| {mib} | {time:.3} ms | {algorithm:.1} GB/s | {bus:.1} GB/s |");
    }
    ExitCode::SUCCESS
}
