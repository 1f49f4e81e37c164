//! The training run on 1, 2 and 4 ranks at the
//! same global batch (64 sequences per step), in alternating rounds: tokens
//! per second, the speed against one rank, and where a step's time goes
//! (data, forward, backward, gradient sync, optimizer). Prints two Markdown
//! tables; chapter 8 explains them. With `--data FILE` it also writes rank
//! 0's milliseconds per step in each phase, for each world size, with the
//! machine and its load (tab-separated), which chapter 8's figure draws
//! (`cargo run --example figures`).
//!
//! With `--layouts` it runs ranks × libtorch threads per rank instead
//! (`1x1,1x2,2x1,2x2`: four ways to use two cores), at the same global
//! batch, and prints tokens per second, the speed paired round by round
//! with the first layout, and every rank's share of time in the gradient
//! sync. `--table FILE` writes what it printed, with the machine, its load
//! and the command (support/table_file.rs), for chapter 8 to include.
//!
//! Run: cargo run --release --example bench_scaling
//!      cargo run --release --example bench_scaling -- --rounds 5 --steps 300
//!      cargo run --release --example bench_scaling -- --data chapters/figures/data/scaling.tsv
//!      cargo run --release --example bench_scaling -- --layouts 1x1,1x2,2x1,2x2 --rounds 10 --table chapters/tables/cores.md
//!
//! Without `--layouts`, each rank gets cores / ranks libtorch threads (at
//! least one), as the training example does; 4 ranks on a 2-core machine
//! oversubscribe it.

use std::time::Duration;

use clap::Parser;
use ddp_workbook::train::{self, default_threads_per_rank, RankOutcome, TrainConfig};

#[path = "support/machine.rs"]
mod machine;
#[path = "support/table_file.rs"]
mod table_file;
use machine::load_average;
use table_file::{summary, thousands};

#[derive(Parser)]
#[command(about = "The training run on 1, 2 and 4 ranks at the same global batch")]
struct Args {
    /// Rounds; each runs every world size (or layout) once, in turn.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Optimizer steps per run.
    #[arg(long, default_value_t = 200)]
    steps: usize,
    /// World sizes, comma-separated; each must divide 32 (64 sequences, 2 micro-batches).
    #[arg(long, value_delimiter = ',', default_values_t = [1, 2, 4])]
    world_sizes: Vec<usize>,
    /// Run these layouts instead of the world sizes: ranks x libtorch threads
    /// per rank, comma-separated (`1x1,1x2,2x1,2x2`); speeds are paired with
    /// the first one.
    #[arg(long, value_delimiter = ',', value_parser = parse_layout)]
    layouts: Vec<Layout>,
    /// Also write rank 0's phases per step (median round of each world size),
    /// the machine and its load to this tab-separated file, for the book's figure.
    #[arg(long, conflicts_with = "layouts")]
    data: Option<std::path::PathBuf>,
    /// Also write the printed tables, the machine, its load and this command
    /// to this Markdown file (relative to the repository).
    #[arg(long)]
    table: Option<String>,
}

/// Ranks, and libtorch threads on each.
#[derive(Clone, Copy, Debug)]
struct Layout {
    ranks: usize,
    threads: usize,
}

fn parse_layout(text: &str) -> Result<Layout, String> {
    let (ranks, threads) = text.split_once(['x', 'X']).ok_or(format!("{text:?} is not RANKSxTHREADS"))?;
    let number = |s: &str| s.trim().parse::<usize>().map_err(|e| format!("{text:?}: {e}"));
    Ok(Layout { ranks: number(ranks)?, threads: number(threads)? })
}

const GLOBAL_BATCH: usize = 64;
const ACCUM_STEPS: usize = 2;
const CARGO: &str = "cargo run --release --example bench_scaling";

/// One training run of `steps` steps on `layout`, at the global batch: 32
/// sequences per micro-batch on 1 rank, 16 on 2, 8 on 4.
fn run(layout: Layout, steps: usize) -> anyhow::Result<Vec<RankOutcome>> {
    let config = TrainConfig {
        world_size: layout.ranks,
        batch_size: GLOBAL_BATCH / (ACCUM_STEPS * layout.ranks),
        accum_steps: ACCUM_STEPS,
        steps,
        log_every: steps,
        warmup_steps: steps.min(50),
        threads_per_rank: Some(layout.threads),
        ..TrainConfig::default()
    };
    train::train(&config, &|_| {})
}

fn share(part: Duration, whole: Duration) -> String {
    format!("{:.1}%", 100.0 * part.as_secs_f64() / whole.as_secs_f64())
}

/// Runs every layout once per round, in turn, printing each run's speed;
/// returns `runs[layout][round]`: every rank's outcome.
fn rounds(layouts: &[Layout], args: &Args) -> anyhow::Result<Vec<Vec<Vec<RankOutcome>>>> {
    let mut runs: Vec<Vec<Vec<RankOutcome>>> = layouts.iter().map(|_| vec![]).collect();
    for round in 1..=args.rounds {
        for (l, &layout) in layouts.iter().enumerate() {
            let outcome = run(layout, args.steps)?;
            println!(
                "round {round}, {} x {}: {:.0} tokens/s (load {})",
                layout.ranks,
                layout.threads,
                outcome[0].tokens_per_second,
                load_average()
            );
            runs[l].push(outcome);
        }
    }
    Ok(runs)
}

/// The layouts' table: tokens/s, the speed paired with the first layout
/// round by round, and the sync share of every rank of every round.
fn layouts_table(layouts: &[Layout], runs: &[Vec<Vec<RankOutcome>>]) -> String {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut out = String::from(
        "| ranks × libtorch threads per rank | tokens/s, median (min – max) | speed, paired with the first \
         row, median (min – max) | gradient sync share of every rank, median (min – max) |\n\
         | --- | --- | --- | --- |\n",
    );
    for (layout, rounds) in layouts.iter().zip(runs) {
        let rates: Vec<f64> = rounds.iter().map(|r| r[0].tokens_per_second).collect();
        let (median, min, max) = summary(&rates);
        let paired: Vec<f64> =
            rates.iter().zip(&runs[0]).map(|(rate, first)| rate / first[0].tokens_per_second).collect();
        let (speed, slowest, fastest) = summary(&paired);
        let shares: Vec<f64> = rounds
            .iter()
            .flatten()
            .map(|o| 100.0 * o.sync_time.as_secs_f64() / o.train_time.as_secs_f64())
            .collect();
        let (share, least, most) = summary(&shares);
        out += &format!(
            "| {} × {} ({} on {cores} cores) | {} ({} – {}) | {speed:.2} ({slowest:.2} – {fastest:.2}) | \
             {share:.1}% ({least:.1} – {most:.1}) |\n",
            layout.ranks,
            layout.threads,
            match layout.ranks * layout.threads {
                1 => "1 thread".to_string(),
                n => format!("{n} threads"),
            },
            thousands(median),
            thousands(min),
            thousands(max)
        );
    }
    out
}

/// The world sizes' two tables (speed and sync share; rank 0's phases, from
/// the median round of each), and the figure's data rows.
fn world_size_tables(layouts: &[Layout], runs: &[Vec<Vec<RankOutcome>>], rounds: usize) -> (String, String) {
    let mut out = String::from(
        "| ranks x threads | tokens/s, median (min - max) | speed vs 1 rank | gradient sync share, max over ranks |\n\
         | --- | --- | ---: | ---: |\n",
    );
    let median_round = |w: usize| {
        let mut order: Vec<usize> = (0..rounds).collect();
        order.sort_by(|&a, &b| runs[w][a][0].tokens_per_second.total_cmp(&runs[w][b][0].tokens_per_second));
        order[rounds / 2]
    };
    let base = runs[0][median_round(0)][0].tokens_per_second;
    for (w, layout) in layouts.iter().enumerate() {
        let rates: Vec<f64> = runs[w].iter().map(|r| r[0].tokens_per_second).collect();
        let (_, min, max) = summary(&rates);
        let median = &runs[w][median_round(w)];
        let sync = median
            .iter()
            .map(|o| o.phases.sync.as_secs_f64() / o.train_time.as_secs_f64())
            .fold(0.0, f64::max);
        out += &format!(
            "| {} x {} | {:.0} ({min:.0} - {max:.0}) | {:.2} | {:.1}% |\n",
            layout.ranks,
            layout.threads,
            median[0].tokens_per_second,
            median[0].tokens_per_second / base,
            100.0 * sync
        );
    }
    // Rank 0's milliseconds per step in each phase, one row per world size.
    let mut rows = vec![];
    out += "\nWhere rank 0's step time goes (the median round of each):\n\n\
            | ranks | data | forward | backward | gradient sync | optimizer |\n\
            | --- | ---: | ---: | ---: | ---: | ---: |\n";
    for (w, layout) in layouts.iter().enumerate() {
        let rank0 = &runs[w][median_round(w)][0];
        let (p, t) = (rank0.phases, rank0.train_time);
        out += &format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            layout.ranks,
            share(p.data, t),
            share(p.forward, t),
            share(p.backward, t),
            share(p.sync, t),
            share(p.optimizer, t)
        );
        let per_step = |d: Duration| 1e3 * d.as_secs_f64() / rank0.last_step as f64;
        rows.push(format!(
            "{}\t{}\t{:.0}\t{:.3}\t{:.3}\t{:.3}\t{:.3}\t{:.3}\n",
            layout.ranks,
            layout.threads,
            rank0.tokens_per_second,
            per_step(p.data),
            per_step(p.forward),
            per_step(p.backward),
            per_step(p.sync),
            per_step(p.optimizer)
        ));
    }
    (out, rows.concat())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.rounds > 0 && args.steps > 0, "--rounds and --steps must be at least 1");
    let by_layout = !args.layouts.is_empty();
    let layouts: Vec<Layout> = if by_layout {
        args.layouts.clone()
    } else {
        let threads = |n| default_threads_per_rank(n);
        args.world_sizes.iter().map(|&n| Layout { ranks: n, threads: threads(n) }).collect()
    };
    for layout in &layouts {
        anyhow::ensure!(
            layout.ranks > 0 && (GLOBAL_BATCH / ACCUM_STEPS).is_multiple_of(layout.ranks),
            "{} rank(s) do not divide 32",
            layout.ranks
        );
        anyhow::ensure!(layout.threads > 0, "a layout needs at least one thread per rank");
    }
    let started = table_file::Run::start();
    let load_before = load_average();
    let runs = rounds(&layouts, &args)?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let settings = format!(
        "global batch {GLOBAL_BATCH} sequences ({ACCUM_STEPS} micro-batches per rank per step), {} steps per \
         run, {} alternating rounds; tokens/s of the global batch over the time in training steps",
        args.steps, args.rounds
    );
    let (table, data_rows) = if by_layout {
        (layouts_table(&layouts, &runs), String::new())
    } else {
        world_size_tables(&layouts, &runs, args.rounds)
    };
    println!("\n{cores} cores; {settings}\n\n{table}");
    let load_after = load_average();
    println!("load average before: {load_before}, after: {load_after}");
    let command = table_file::command_line(CARGO);
    if let Some(path) = &args.table {
        let body = format!("{table}\n{}", started.caption(&[settings], &command));
        println!("wrote {}", table_file::write_table(path, &command, &body)?.display());
    }
    if let Some(path) = &args.data {
        let about = format!(
            "# command\t{command}\n# cores\t{cores}\n# load_before\t{load_before}\n# load_after\t{load_after}\n\
             # global_batch\t{GLOBAL_BATCH}\n"
        );
        let header = "ranks\tthreads_per_rank\ttokens_per_second\tdata\tforward\tbackward\tsync\toptimizer\n";
        std::fs::write(path, about + header + &data_rows)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
