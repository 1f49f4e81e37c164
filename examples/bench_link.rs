//! What a real network link costs the gradient
//! sync. The tiny GPT, one rank per node, micro-batches of 16, buckets of
//! 16 KiB (as bench_overlap); the naive, bucketed and overlapped syncs.
//! Under mpirun on 2 nodes (`--backend mpi`) it measures tokens/s and the
//! time after backward over the real link, and the link's latency α (a
//! 4-byte all-reduce) and bandwidth (a 4 MiB one). Then, in one process
//! (`--compare FILE`, FILE being that output), it prints the measurements
//! next to what chapter 5's α–β model and chapter 6's simulated link (the
//! in-process backend, with the measured α and the cap as β) predict.
//!
//! Run it all (root: it makes the nodes; writes chapters/tables/multinode-link.md):
//!      scripts/bench_nodes.sh
//! By hand, on a cluster of 2 nodes of 1 slot (scripts/nodes.sh up --slots 1 --rate 1gbit):
//!      scripts/launch.sh -np 2 --hostfile /run/ddpwb/main/hosts \
//!          target/release/examples/bench_link --backend mpi > measured.txt
//!      target/release/examples/bench_link --compare measured.txt --gbit 1

use std::time::{Duration, Instant};

use clap::Parser;
use ddp_workbook::data::{masked_cross_entropy, TokenTask};
use ddp_workbook::ddp::{naive, BucketCaps, GradientBuckets, Reducer};
use ddp_workbook::dist::{spawn_with, tagged, Group, ReduceOp, SimulatedLink, SpawnOptions};
use ddp_workbook::models::{named_parameters, Gpt, GptConfig};
use ddp_workbook::tch::nn::Module;
use ddp_workbook::tch::{self, Device, Kind, Tensor};

#[path = "support/median.rs"]
mod median;
use median::median;

#[derive(Parser)]
#[command(
    about = "Tokens/s and time after backward of the three syncs over a real link, against the α–β model and the simulated link"
)]
struct Args {
    /// mpi: one rank of a job over real nodes (prints `measured ...` lines);
    /// without it, --compare runs the simulated link in this process
    #[arg(long)]
    backend: Option<String>,
    /// The output of the MPI run to compare with
    #[arg(long)]
    compare: Option<std::path::PathBuf>,
    /// The link's cap in Gbit/s, β of the model and of the simulated link
    #[arg(long, default_value_t = 1.0)]
    gbit: f64,
    /// Timed steps per sync and round, after 3 untimed ones
    #[arg(long, default_value_t = 20)]
    steps: usize,
    /// Rounds: the three syncs run once per round, in turn
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Bucket cap in KiB (the first bucket gets a quarter of it)
    #[arg(long, default_value_t = 16)]
    bucket_kib: usize,
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Sync {
    Naive,
    Bucketed,
    Overlapped,
}
const SYNCS: [Sync; 3] = [Sync::Naive, Sync::Bucketed, Sync::Overlapped];
const SEQUENCES_PER_RANK: i64 = 16;

fn tiny_gpt() -> (tch::nn::VarStore, Gpt, TokenTask) {
    let task = TokenTask::standard(1, 512);
    let config = GptConfig { vocab_size: task.vocab_size(), block_size: task.seq_len(), ..GptConfig::tiny() };
    let (vs, gpt) = Gpt::seeded(1, &config, Kind::Float);
    (vs, gpt, task)
}

fn caps(args: &Args) -> BucketCaps {
    let cap = args.bucket_kib * 1024;
    BucketCaps { cap_bytes: cap, first_cap_bytes: cap / 4 }
}

// ANCHOR: measure
/// Per timed step of `sync` on this group: the step (forward, backward,
/// sync) and the part after backward, each the slowest rank's, counted on
/// every rank from the barrier that starts the step (one machine's clock is
/// never compared with another's).
fn measure(pg: &Group, sync: Sync, args: &Args) -> anyhow::Result<Vec<(Duration, Duration)>> {
    tch::set_num_threads(1);
    let (vs, gpt, task) = tiny_gpt();
    let params = named_parameters(&vs);
    let buckets = GradientBuckets::plan(pg.as_ref(), &params, caps(args))?;
    let overlapped = match sync {
        Sync::Overlapped => {
            Some(Reducer::new(pg.clone(), &params, GradientBuckets::plan(pg.as_ref(), &params, caps(args))?)?)
        }
        _ => None,
    };
    let mut times = vec![]; // [backward ended, synced] in seconds from the step's start
    for step in 0..args.steps + 3 {
        let first = (step as i64 * 32 + pg.rank() as i64 * SEQUENCES_PER_RANK) % 480;
        let (inputs, targets, mask) = task.batch(first, SEQUENCES_PER_RANK);
        for (_, p) in &params {
            let _ = p.grad().defined().then(|| p.grad().zero_());
        }
        pg.barrier()?;
        let started = Instant::now();
        let tag = format!("step {step}");
        if let Some(o) = &overlapped {
            o.arm(tag.clone());
        }
        let loss = masked_cross_entropy(&gpt.forward(&inputs), &targets, &mask);
        loss.backward();
        let backward_ended = started.elapsed().as_secs_f64();
        match &overlapped {
            Some(o) => {
                o.finish(false, Ok(()))?;
            }
            None if sync == Sync::Naive => tagged(tag, || naive::sync_gradients(pg.as_ref(), &params))?,
            None => tagged(tag, || buckets.sync(pg.as_ref(), &params))?,
        }
        if step >= 3 {
            times.extend([backward_ended, started.elapsed().as_secs_f64()]);
        }
    }
    let mut slowest = Tensor::from_slice(&times);
    pg.all_reduce(&mut slowest, ReduceOp::Max)?;
    let slowest = Vec::<f64>::try_from(&slowest)?;
    let per_step = slowest.chunks(2).map(|t| (secs(t[1]), secs(t[1] - t[0]))).collect();
    Ok(per_step)
}
// ANCHOR_END: measure

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s.max(0.0))
}

/// The median of `calls` timed all-reduces of `numel` f32 values.
fn time_all_reduce(pg: &Group, numel: i64, calls: usize) -> anyhow::Result<Duration> {
    let mut tensor = Tensor::ones([numel], (Kind::Float, Device::Cpu));
    let mut times = vec![];
    for _ in 0..calls + 3 {
        pg.barrier()?;
        let started = Instant::now();
        pg.all_reduce(&mut tensor, ReduceOp::Sum)?;
        times.push(started.elapsed());
    }
    Ok(median(times.split_off(3)))
}

/// Every sync's medians over all rounds: (step, after backward).
fn medians(
    mut run: impl FnMut(Sync) -> anyhow::Result<Vec<(Duration, Duration)>>,
    rounds: usize,
) -> anyhow::Result<Vec<(Duration, Duration)>> {
    let mut samples = vec![(vec![], vec![]); SYNCS.len()];
    for _ in 0..rounds {
        for (i, &sync) in SYNCS.iter().enumerate() {
            for (step, after) in run(sync)? {
                samples[i].0.push(step);
                samples[i].1.push(after);
            }
        }
    }
    Ok(samples.into_iter().map(|(steps, after)| (median(steps), median(after))).collect())
}

/// One rank of the job over real nodes; rank 0 prints what it measured.
fn over_mpi(args: &Args) {
    #[cfg(feature = "mpi")]
    ddp_workbook::dist::mpi::run(|pg| {
        let latency = time_all_reduce(&pg, 1, 100)?;
        let big = time_all_reduce(&pg, 1 << 20, 10)?; // 4 MiB
        let rows = medians(|sync| measure(&pg, sync, args), args.rounds)?;
        if pg.rank() == 0 {
            let gbit = (4 << 20) as f64 * 8.0 / (big - latency.min(big)).as_secs_f64().max(1e-9) / 1e9;
            println!("measured link latency_us={:.1} gbit={gbit:.2}", latency.as_secs_f64() * 1e6);
            for (sync, (step, after)) in SYNCS.iter().zip(rows) {
                println!("measured {sync:?} step_ms={:.3} after_ms={:.3}", ms(step), ms(after));
            }
        }
        Ok(())
    });
    #[cfg(not(feature = "mpi"))]
    {
        let _ = args;
        eprintln!("error: this build has no MPI backend: build with --features mpi");
        std::process::exit(2);
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The value of `key=` on the line of `file` that starts with `prefix`.
fn value(file: &str, prefix: &str, key: &str) -> anyhow::Result<f64> {
    let line = file.lines().find(|line| line.starts_with(prefix));
    let line = line.ok_or_else(|| anyhow::anyhow!("no line `{prefix} ...` in the MPI run's output"))?;
    let word = line.split_whitespace().find_map(|w| w.strip_prefix(&format!("{key}=")));
    Ok(word.ok_or_else(|| anyhow::anyhow!("no {key}= on `{line}`"))?.parse()?)
}

/// The measurements in `file`, the α–β model and the simulated link, as
/// the rows of a Markdown table.
fn compare(file: &std::path::Path, args: &Args) -> anyhow::Result<()> {
    let measured = std::fs::read_to_string(file)?;
    let latency_us = value(&measured, "measured link", "latency_us")?;
    let link = SimulatedLink::new(Duration::from_secs_f64(latency_us * 1e-6), args.gbit);
    // The sizes the model needs: every parameter's gradient (naive: one
    // all-reduce each), every bucket's (bucketed; overlapped: at least the last).
    let (parameter_bytes, bucket_bytes) = spawn_with(SpawnOptions::new(1), |pg: Group| {
        let (vs, _, _) = tiny_gpt();
        let params = named_parameters(&vs);
        let buckets = GradientBuckets::plan(pg.as_ref(), &params, caps(args))?;
        let bytes = |numel: usize| (numel * 4) as u64; // f32
        let parameter_bytes: Vec<u64> = params.iter().map(|(_, p)| bytes(p.numel())).collect();
        Ok((parameter_bytes, buckets.layout().iter().map(|b| b.bytes() as u64).collect::<Vec<_>>()))
    })?
    .remove(0);
    // Chapter 5's model for a link: per sync, the all-reduces after backward.
    let model_for = |link: SimulatedLink| {
        let time = |bytes: u64| link.all_reduce_time(bytes, 2);
        let naive: Duration = parameter_bytes.iter().map(|&b| time(b)).sum();
        let bucketed: Duration = bucket_bytes.iter().map(|&b| time(b)).sum();
        let last_bucket = time(*bucket_bytes.last().expect("a bucket")); // overlap cannot hide it
        [naive, bucketed, last_bucket]
    };
    let measured_gbit = value(&measured, "measured link", "gbit")?;
    let model = model_for(link);
    let model_measured = model_for(SimulatedLink::new(link.latency, measured_gbit));
    let simulated = medians(
        |sync| {
            Ok(spawn_with(SpawnOptions::new(2).link(link), |pg: Group| measure(&pg, sync, args))?.remove(0))
        },
        args.rounds,
    )?;
    let tokens_per_step = (2 * SEQUENCES_PER_RANK * tiny_gpt().2.seq_len()) as f64;
    for (i, sync) in SYNCS.iter().enumerate() {
        let (step, after) = (
            value(&measured, &format!("measured {sync:?} "), "step_ms")?,
            value(&measured, &format!("measured {sync:?} "), "after_ms")?,
        );
        let (sim_step, sim_after) = simulated[i];
        let at_least = if *sync == Sync::Overlapped { "≥ " } else { "" };
        println!(
            "| {} Gbit/s | {sync:?} | {:.0} | {after:.2} ms | {at_least}{:.2} ms | {at_least}{:.2} ms | {:.2} ms | {:.0} |",
            args.gbit,
            tokens_per_step / (step / 1e3),
            ms(model[i]),
            ms(model_measured[i]),
            ms(sim_after),
            tokens_per_step / sim_step.as_secs_f64(),
        );
    }
    println!(
        "{} Gbit/s cap: α = {latency_us:.0} µs (a 4-byte all-reduce), {measured_gbit:.2} Gbit/s through a 4 MiB all-reduce",
        args.gbit
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        args.steps > 0 && args.rounds > 0 && args.gbit > 0.0,
        "--steps, --rounds and --gbit must be positive"
    );
    match (args.backend.as_deref(), &args.compare) {
        (Some("mpi"), _) => over_mpi(&args),
        (None, Some(file)) => compare(file, &args)?,
        _ => anyhow::bail!(
            "give --backend mpi (under scripts/launch.sh) or --compare FILE (see the top of this file)"
        ),
    }
    Ok(())
}
