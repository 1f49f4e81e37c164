//! What sending the gradients as bfloat16 saves
//! (chapter 12). The tiny GPT on 2 in-process ranks behind the finished
//! wrapper, one micro-batch of 16 sequences per rank, over a simulated link
//! (50 µs, 1 Gbit/s by default), with the gradients sent in float32 (the
//! library's default) and as bf16 (`ddp::bf16_compress_hook`). Prints, for
//! each, the bytes one step hands to collectives and the median time spent
//! waiting for the sync after backward: the communication that overlap did
//! not hide, which halving the bytes shortens.
//!
//! Run: cargo run --release --example bench_bf16
//!      cargo run --release --example bench_bf16 -- --steps 40 --gbit 0.5
//!      cargo run --release --example bench_bf16 -- --table chapters/tables/bf16.md
//! (`--table` writes the table with the machine, its load and the command,
//! support/table_file.rs, for chapter 12 to include.)

use std::time::Duration;

use clap::Parser;
use ddp_workbook::data::{masked_cross_entropy, TokenTask};
use ddp_workbook::ddp::{bf16_compress_hook, BucketCaps, SimpleDistributedDataParallelism};
use ddp_workbook::dist::{spawn_with, Group, SimulatedLink, SpawnOptions};
use ddp_workbook::models::{Gpt, GptConfig};
use ddp_workbook::tch::{self, Kind};

#[path = "support/machine.rs"]
mod machine;
#[path = "support/median.rs"]
mod median;
#[path = "support/table_file.rs"]
mod table_file;
use median::median;

#[derive(Parser)]
#[command(about = "Wait after backward with f32 and with bf16 gradients, over a simulated link")]
struct Args {
    /// Timed steps per case and round, after 3 untimed ones.
    #[arg(long, default_value_t = 20)]
    steps: usize,
    /// Rounds: each case runs once per round, in a fresh group, alternating.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// The simulated link's latency per all-reduce, in microseconds.
    #[arg(long, default_value_t = 50.0)]
    latency_us: f64,
    /// The simulated link's bandwidth, in Gbit/s.
    #[arg(long, default_value_t = 1.0)]
    gbit: f64,
    /// Bucket cap in KiB (the first bucket gets at most a quarter of it).
    #[arg(long, default_value_t = 64)]
    bucket_kib: usize,
    /// Also write the table, the machine, its load and this command to this
    /// Markdown file (relative to the repository).
    #[arg(long)]
    table: Option<String>,
}

/// One case's steps: the bytes of one synced step, and each step's wait
/// after backward on the rank that waited least (the one whose backward
/// ended last: the others also wait for it, which is not communication).
fn measure(bf16: bool, args: &Args) -> anyhow::Result<(u64, Vec<Duration>)> {
    let link = SimulatedLink::new(Duration::from_secs_f64(args.latency_us * 1e-6), args.gbit);
    let per_rank = spawn_with(SpawnOptions::new(2).link(link), |pg: Group| {
        tch::set_num_threads(1);
        let task = TokenTask::standard(1, 512);
        let config =
            GptConfig { vocab_size: task.vocab_size(), block_size: task.seq_len(), ..GptConfig::tiny() };
        let (vs, gpt) = Gpt::seeded(1, &config, Kind::Float);
        let cap = args.bucket_kib * 1024;
        let caps = BucketCaps { cap_bytes: cap, first_cap_bytes: cap / 4 };
        let ddp = SimpleDistributedDataParallelism::with_bucket_caps(gpt, &vs, pg.clone(), caps)?;
        if bf16 {
            ddp.register_comm_hook(bf16_compress_hook);
        }
        let (mut waits, mut step_bytes) = (vec![], 0);
        for step in 0..args.steps + 3 {
            let (inputs, targets, mask) = task.batch((step * 32 + pg.rank() * 16) as i64 % 480, 16);
            vs.trainable_variables().iter_mut().for_each(|p| p.zero_grad());
            pg.barrier()?;
            let (waited, bytes) = (ddp.sync_time(), ddp.stats().collective_bytes);
            ddp.backward(&masked_cross_entropy(&ddp.forward(&inputs), &targets, &mask))?;
            if step >= 3 {
                waits.push(ddp.sync_time() - waited);
                step_bytes = ddp.stats().collective_bytes - bytes;
            }
        }
        Ok((step_bytes, waits))
    })?;
    let waits = (0..args.steps).map(|s| per_rank.iter().map(|(_, w)| w[s]).min().expect("ranks")).collect();
    Ok((per_rank[0].0, waits))
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        args.steps > 0 && args.rounds > 0 && args.gbit > 0.0 && args.bucket_kib > 0,
        "--steps, --rounds, --gbit and --bucket-kib must be positive"
    );
    let run = table_file::Run::start();
    let load_before = machine::load_average();
    let mut cases = [(0, vec![]), (0, vec![])]; // f32, bf16: bytes per step, waits
    for _round in 0..args.rounds {
        for (case, bf16) in [false, true].into_iter().enumerate() {
            let (bytes, waits) = measure(bf16, &args)?;
            cases[case].0 = bytes;
            cases[case].1.extend(waits);
        }
    }
    let settings = format!(
        "tiny GPT, 2 in-process ranks, 16 sequences per rank, buckets of {} KiB, link {} µs and {} Gbit/s, \
         median of {} steps ({} rounds of {})",
        args.bucket_kib,
        args.latency_us,
        args.gbit,
        args.steps * args.rounds,
        args.rounds,
        args.steps
    );
    let mut table =
        String::from("| gradients | bytes per step | wait after backward |\n| --- | ---: | ---: |\n");
    for (name, (bytes, waits)) in ["f32", "bf16"].iter().zip(cases) {
        table += &format!("| {name} | {bytes} | {:.2} ms |\n", median(waits).as_secs_f64() * 1e3);
    }
    println!("{settings}\n\n{table}");
    println!("load average (1 min): {load_before} before, {} after", machine::load_average());
    if let Some(path) = &args.table {
        let command = table_file::command_line("cargo run --release --example bench_bf16");
        let body = format!("{table}\n{}", run.caption(&[settings], &command));
        println!("wrote {}", table_file::write_table(path, &command, &body)?.display());
    }
    Ok(())
}
