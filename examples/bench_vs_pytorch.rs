//! examples/bench_vs_pytorch.rs: the workbook's training run against PyTorch's
//! own DistributedDataParallel on the same work, in alternating rounds: the
//! tiny GPT on the sorting task, 2 ranks, 16 sequences per rank per
//! micro-batch, 2 micro-batches per step (no_sync on the first), AdamW, one
//! libtorch thread per rank. Ours runs as 2 rank threads of the in-process
//! backend; PyTorch's as 2 processes on gloo (`scripts/bench_torch_ddp.py`,
//! with the project's `.venv`). Prints tokens per second of each, median, min
//! and max over the rounds, and their ratio.
//!
//! Run: cargo run --release --example bench_vs_pytorch
//!      cargo run --release --example bench_vs_pytorch -- --rounds 7 --steps 300

use std::process::Command;

use clap::Parser;
use ddp_workbook::train::{self, TrainConfig};

#[path = "support/machine.rs"]
mod machine;
use machine::load_average;

#[derive(Parser)]
#[command(about = "The workbook's training run against PyTorch DDP (gloo), alternating rounds")]
struct Args {
    /// Rounds; each runs ours, then PyTorch's.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Optimizer steps per run.
    #[arg(long, default_value_t = 200)]
    steps: usize,
}

/// Median, min and max.
fn summary(values: &[f64]) -> (f64, f64, f64) {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    (sorted[sorted.len() / 2], sorted[0], sorted[sorted.len() - 1])
}

/// One run of ours: rank 0's tokens per second over its training steps.
fn ours(steps: usize) -> anyhow::Result<f64> {
    let config =
        TrainConfig { steps, log_every: steps, warmup_steps: steps.min(50), ..TrainConfig::default() };
    let outcomes = train::train(&config, &|_| {})?;
    Ok(outcomes[0].tokens_per_second)
}

/// One run of PyTorch's, through the Python script.
fn pytorch(steps: usize) -> anyhow::Result<f64> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = root.join(".venv/bin/python");
    anyhow::ensure!(python.is_file(), "{} is missing: run scripts/setup.sh", python.display());
    let output = Command::new(python)
        .arg(root.join("scripts/bench_torch_ddp.py"))
        .args(["--steps", &steps.to_string()])
        .output()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    anyhow::ensure!(
        output.status.success(),
        "the PyTorch run failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let value = stdout.lines().find_map(|line| line.strip_prefix("tokens_per_second "));
    Ok(value.ok_or_else(|| anyhow::anyhow!("no tokens_per_second line in {stdout:?}"))?.trim().parse()?)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.rounds > 0 && args.steps > 0, "--rounds and --steps must be at least 1");
    let load_before = load_average();
    let (mut ours_rates, mut torch_rates) = (vec![], vec![]);
    for round in 1..=args.rounds {
        ours_rates.push(ours(args.steps)?);
        torch_rates.push(pytorch(args.steps)?);
        println!(
            "round {round}: ours {:.0} tokens/s, PyTorch DDP {:.0} tokens/s",
            ours_rates[round - 1],
            torch_rates[round - 1]
        );
    }
    let ratios: Vec<f64> = ours_rates.iter().zip(&torch_rates).map(|(a, b)| a / b).collect();
    println!(
        "\n2 ranks x 16 sequences x 2 micro-batches, {} steps per run, {} alternating rounds\n",
        args.steps, args.rounds
    );
    println!("| run | tokens/s median | min | max |");
    println!("| --- | ---: | ---: | ---: |");
    for (name, rates) in [
        ("ours (in-process, 2 rank threads)", &ours_rates),
        ("PyTorch DDP (gloo, 2 processes)", &torch_rates),
    ] {
        let (median, min, max) = summary(rates);
        println!("| {name} | {median:.0} | {min:.0} | {max:.0} |");
    }
    let (median, min, max) = summary(&ratios);
    println!("| ratio, ours / PyTorch, per round | {median:.2}x | {min:.2}x | {max:.2}x |");
    println!("\nload average before: {load_before}, after: {}", load_average());
    Ok(())
}
