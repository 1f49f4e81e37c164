//! The training run on 1, 2 and 4 ranks at the
//! same global batch (64 sequences per step), in alternating rounds: tokens
//! per second, the speed against one rank, and where a step's time goes
//! (data, forward, backward, gradient sync, optimizer). Prints two Markdown
//! tables; chapter 8 explains them. With `--data FILE` it also writes rank
//! 0's milliseconds per step in each phase, for each world size, with the
//! machine and its load (tab-separated), which chapter 8's figure draws
//! (`cargo run --example figures`).
//!
//! Run: cargo run --release --example bench_scaling
//!      cargo run --release --example bench_scaling -- --rounds 5 --steps 300
//!      cargo run --release --example bench_scaling -- --data chapters/figures/data/scaling.tsv
//!
//! Each rank gets cores / ranks libtorch threads (at least one), as the
//! training example does; 4 ranks on a 2-core machine oversubscribe it.

use std::time::Duration;

use clap::Parser;
use ddp_workbook::train::{self, default_threads_per_rank, RankOutcome, TrainConfig};

#[path = "support/machine.rs"]
mod machine;
use machine::load_average;

#[derive(Parser)]
#[command(about = "The training run on 1, 2 and 4 ranks at the same global batch")]
struct Args {
    /// Rounds; each runs every world size once, in turn.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Optimizer steps per run.
    #[arg(long, default_value_t = 200)]
    steps: usize,
    /// World sizes, comma-separated; each must divide 32 (64 sequences, 2 micro-batches).
    #[arg(long, value_delimiter = ',', default_values_t = [1, 2, 4])]
    world_sizes: Vec<usize>,
    /// Also write rank 0's phases per step (median round of each world size),
    /// the machine and its load to this tab-separated file, for the book's figure.
    #[arg(long)]
    data: Option<std::path::PathBuf>,
}

const GLOBAL_BATCH: usize = 64;
const ACCUM_STEPS: usize = 2;

fn run(world_size: usize, steps: usize) -> anyhow::Result<Vec<RankOutcome>> {
    let config = TrainConfig {
        world_size,
        batch_size: GLOBAL_BATCH / (ACCUM_STEPS * world_size),
        accum_steps: ACCUM_STEPS,
        steps,
        log_every: steps,
        warmup_steps: steps.min(50),
        threads_per_rank: Some(default_threads_per_rank(world_size)),
        ..TrainConfig::default()
    };
    train::train(&config, &|_| {})
}

fn share(part: Duration, whole: Duration) -> String {
    format!("{:.1}%", 100.0 * part.as_secs_f64() / whole.as_secs_f64())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.rounds > 0 && args.steps > 0, "--rounds and --steps must be at least 1");
    for &n in &args.world_sizes {
        anyhow::ensure!(
            n > 0 && (GLOBAL_BATCH / ACCUM_STEPS).is_multiple_of(n),
            "world size {n} does not divide 32"
        );
    }
    let load_before = load_average();
    // runs[w][round]: every rank's outcome.
    let mut runs: Vec<Vec<Vec<RankOutcome>>> = args.world_sizes.iter().map(|_| vec![]).collect();
    for round in 1..=args.rounds {
        for (w, &world_size) in args.world_sizes.iter().enumerate() {
            runs[w].push(run(world_size, args.steps)?);
            println!(
                "round {round}, {world_size} rank(s): {:.0} tokens/s",
                runs[w][round - 1][0].tokens_per_second
            );
        }
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("\n{cores} cores; global batch {GLOBAL_BATCH} sequences ({ACCUM_STEPS} micro-batches per rank per step), {} steps per run, {} rounds\n", args.steps, args.rounds);
    println!("| ranks x threads | tokens/s, median (min - max) | speed vs 1 rank | gradient sync share, max over ranks |");
    println!("| --- | --- | ---: | ---: |");
    let median_round = |w: usize| {
        let mut order: Vec<usize> = (0..args.rounds).collect();
        order.sort_by(|&a, &b| runs[w][a][0].tokens_per_second.total_cmp(&runs[w][b][0].tokens_per_second));
        order[args.rounds / 2]
    };
    let base = runs[0][median_round(0)][0].tokens_per_second;
    for (w, &world_size) in args.world_sizes.iter().enumerate() {
        let rates: Vec<f64> = runs[w].iter().map(|r| r[0].tokens_per_second).collect();
        let (min, max) = rates.iter().fold((f64::MAX, 0.0f64), |(lo, hi), &r| (lo.min(r), hi.max(r)));
        let median = &runs[w][median_round(w)];
        let sync = median
            .iter()
            .map(|o| o.phases.sync.as_secs_f64() / o.train_time.as_secs_f64())
            .fold(0.0, f64::max);
        println!(
            "| {world_size} x {} | {:.0} ({min:.0} - {max:.0}) | {:.2} | {:.1}% |",
            default_threads_per_rank(world_size),
            median[0].tokens_per_second,
            median[0].tokens_per_second / base,
            100.0 * sync
        );
    }
    // Rank 0's milliseconds per step in each phase, one row per world size.
    let mut rows = vec![];
    println!("\nWhere rank 0's step time goes (the median round of each):\n");
    println!("| ranks | data | forward | backward | gradient sync | optimizer |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    for (w, &world_size) in args.world_sizes.iter().enumerate() {
        let rank0 = &runs[w][median_round(w)][0];
        let (p, t) = (rank0.phases, rank0.train_time);
        println!(
            "| {world_size} | {} | {} | {} | {} | {} |",
            share(p.data, t),
            share(p.forward, t),
            share(p.backward, t),
            share(p.sync, t),
            share(p.optimizer, t)
        );
        let per_step = |d: Duration| 1e3 * d.as_secs_f64() / rank0.last_step as f64;
        rows.push(format!(
            "{world_size}\t{}\t{:.0}\t{:.3}\t{:.3}\t{:.3}\t{:.3}\t{:.3}\n",
            default_threads_per_rank(world_size),
            rank0.tokens_per_second,
            per_step(p.data),
            per_step(p.forward),
            per_step(p.backward),
            per_step(p.sync),
            per_step(p.optimizer)
        ));
    }
    let load_after = load_average();
    println!("\nload average before: {load_before}, after: {load_after}");
    if let Some(path) = &args.data {
        let command = format!(
            "cargo run --release --example bench_scaling -- --rounds {} --steps {} --world-sizes {}",
            args.rounds,
            args.steps,
            args.world_sizes.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(",")
        );
        let about = format!(
            "# command\t{command}\n# cores\t{cores}\n# load_before\t{load_before}\n# load_after\t{load_after}\n\
             # global_batch\t{GLOBAL_BATCH}\n"
        );
        let header = "ranks\tthreads_per_rank\ttokens_per_second\tdata\tforward\tbackward\tsync\toptimizer\n";
        std::fs::write(path, about + header + &rows.concat())?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
