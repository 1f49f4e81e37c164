//! How bench_collectives times the
//! in-process all_reduce, and its `--sweep` of world sizes and sizes with
//! each algorithm forced and the one chosen. Included by
//! examples/bench_collectives.rs (`#[path]`); run with
//! `cargo run --release --example bench_collectives -- --sweep`.
//!
//! Besides the time, each measurement says what the ranks' waiting cost:
//! the spread of the ranks' times in a round (a rank that was woken late)
//! and, per round, how often a rank watched successfully, watched in vain,
//! slept, and how many wake-ups were sent (`dist::local::WaitCounts`); for
//! the split, which share of the blocks the busiest rank did: near 1/N when
//! the ranks worked at once, 100% when the others never got a core.

use std::time::{Duration, Instant};

use ddp_workbook::dist::local::{split_wins, wait_counts, AllReduceScheme, WaitCounts};
use ddp_workbook::dist::{spawn_with, ReduceOp, SpawnOptions};
use ddp_workbook::tch::{Device, Kind, Tensor};

use crate::median::median;

/// One case's result: medians over the timed rounds.
pub struct Measured {
    /// The slowest rank's all_reduce time.
    pub time: Duration,
    /// The slowest rank's time minus the fastest one's.
    pub spread: Duration,
    /// Summed over the rounds, barrier included (divide by `rounds`).
    pub waits: WaitCounts,
    pub rounds: usize,
}

impl Measured {
    /// The wait counts per round, as "won/lost/slept/woke", and for a
    /// split the busiest rank's share of the blocks (1/N: all ranks worked).
    pub fn waits_per_round(&self) -> String {
        let per = |n: u64| n as f64 / self.rounds as f64;
        let w = &self.waits;
        let waits = format!(
            "{:.1}/{:.1}/{:.1}/{:.1}",
            per(w.spins_won),
            per(w.spins_lost),
            per(w.sleeps),
            per(w.wake_ups)
        );
        match w.blocks {
            0 => waits,
            blocks => {
                let share = 100.0 * w.blocks_by_busiest_rank as f64 / blocks as f64;
                format!("{waits}; busiest rank {share:.0}% of {blocks} blocks")
            }
        }
    }
}

/// Each round, every rank meets the others at a barrier, then times one
/// all_reduce (SUM) of its own f32 tensor of `numel` elements.
pub fn time_all_reduce(
    world_size: usize,
    numel: i64,
    scheme: AllReduceScheme,
    warmup: usize,
    rounds: usize,
) -> anyhow::Result<Measured> {
    let options = SpawnOptions::new(world_size).all_reduce_scheme(scheme).timeout(Duration::from_secs(600));
    let counts_before = std::sync::OnceLock::new();
    let per_rank = spawn_with(options, |pg| {
        let mut tensor = Tensor::full([numel], pg.rank() as f64, (Kind::Float, Device::Cpu));
        let mut times = Vec::with_capacity(rounds);
        for round in 0..warmup + rounds {
            pg.barrier()?; // start together
            if round == warmup && pg.rank() == 0 {
                // Every rank has passed the barrier above; the counts of the
                // rounds before it are in (a rank's late watch may spill over).
                _ = counts_before.set(wait_counts());
            }
            let started = Instant::now();
            pg.all_reduce(&mut tensor, ReduceOp::Sum)?;
            if round >= warmup {
                times.push(started.elapsed());
            }
        }
        Ok(times)
    });
    let counts = wait_counts();
    let per_rank = per_rank?;
    let round = |i: usize| per_rank.iter().map(move |t: &Vec<Duration>| t[i]);
    let slowest = (0..rounds).map(|i| round(i).max().unwrap_or_default()).collect();
    let spread = (0..rounds).map(|i| round(i).max().unwrap_or_default() - round(i).min().unwrap_or_default());
    let waits = counts - counts_before.get().copied().unwrap_or(counts);
    Ok(Measured { time: median(slowest), spread: median(spread.collect()), waits, rounds })
}

/// `world_sizes` (1 to 256 by default) and sizes 4 B to 25 MiB: each case with the
/// rank-order sum forced, the split forced, and the automatic choice; the
/// automatic time against the better forced one. Rounds are fewer where a
/// call is long (many ranks, large tensors) so that the sweep takes minutes.
pub fn sweep(world_sizes: &[usize], max_rounds: usize) -> anyhow::Result<()> {
    const SIZES: [i64; 9] = [4, 64, 1 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 25 << 20];
    println!(
        "sweep: ms per all_reduce (median of the slowest rank); waits per round (barrier included): \
         watches won/lost/sleeps/wake-ups\n"
    );
    println!("| ranks | size | rounds | rank order ms | split ms | auto ms | faster forced | auto picks | auto / best | waits (rank order) | waits (split) |");
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | :--- | :--- | ---: | :--- | :--- |");
    for &world_size in world_sizes {
        for &bytes in &SIZES {
            // A guess at one call: every rank's tensor read once at ~5 GB/s,
            // and a wake-up per rank; aim at about 0.3 s of timed calls.
            let guess = world_size as f64 * (bytes as f64 / 5e9 + 20e-6);
            let rounds = ((0.3 / guess) as usize).clamp(3, max_rounds.max(3));
            let warmup = (rounds / 5).max(1);
            let numel = bytes / 4;
            let time = |scheme| time_all_reduce(world_size, numel, scheme, warmup, rounds);
            let (by_rank_order, split, auto) = (
                time(AllReduceScheme::RankOrder)?,
                time(AllReduceScheme::Split)?,
                time(AllReduceScheme::Auto)?,
            );
            let best = by_rank_order.time.min(split.time);
            let name = |split: bool| if split { "split" } else { "rank order" };
            let (faster, picks) =
                (name(split.time < by_rank_order.time), name(split_wins(bytes as usize, world_size)));
            let ms = |m: &Measured| format!("{:.3}", m.time.as_secs_f64() * 1e3);
            println!(
                "| {world_size} | {} | {rounds} | {} | {} | {} | {faster} | {picks} | {:.2} | {} | {} |",
                human(bytes),
                ms(&by_rank_order),
                ms(&split),
                ms(&auto),
                auto.time.as_secs_f64() / best.as_secs_f64(),
                by_rank_order.waits_per_round(),
                split.waits_per_round()
            );
        }
    }
    Ok(())
}

fn human(bytes: i64) -> String {
    match bytes {
        b if b >= 1 << 20 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}
