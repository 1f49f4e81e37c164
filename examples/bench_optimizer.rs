//! How long one AdamW step takes on the tiny
//! GPT of the training run (29 parameter tensors, 104,192 numbers), against
//! the fastest it could be here: the same update on one flat tensor of the
//! same size, a handful of libtorch calls; and against `torch.optim.AdamW`
//! (default, foreach and fused) from the project's `.venv`, on the same
//! shapes, through `scripts/bench_torch_adamw.py`. Prints a Markdown table.
//!
//! Run: cargo run --release --example bench_optimizer
//!      cargo run --release --example bench_optimizer -- --steps 2000
//!
//! Both run on one thread of libtorch (as each rank of the training run
//! does), with gradients of ones set once, so that only the update is timed,
//! and alternately, step by step, so that both meet the same machine.

use std::time::{Duration, Instant};

use clap::Parser;
use ddp_workbook::data::TokenTask;
use ddp_workbook::models::{named_parameters, Gpt, GptConfig};
use ddp_workbook::tch::{self, Kind, Tensor};
use ddp_workbook::train::AdamW;

#[path = "support/machine.rs"]
mod machine;
#[path = "support/median.rs"]
mod median;
use machine::load_average;
use median::median;

#[derive(Parser)]
#[command(about = "Time an AdamW step of the tiny GPT against the same update on one flat tensor")]
struct Args {
    /// Timed steps (the median is reported).
    #[arg(long, default_value_t = 500)]
    steps: usize,
    /// Untimed steps before them.
    #[arg(long, default_value_t = 50)]
    warmup: usize,
}

/// Runs `a` and `b` alternately, `warmup + steps` times each, so that both
/// meet the same machine (caches, the allocator's state, other load), and
/// returns the median time of each over the timed steps.
fn time_alternately(args: &Args, mut a: impl FnMut(), mut b: impl FnMut()) -> (Duration, Duration) {
    let (mut times_a, mut times_b) = (vec![], vec![]);
    for round in 0..args.warmup + args.steps {
        let started = Instant::now();
        a();
        let between = Instant::now();
        b();
        if round >= args.warmup {
            times_a.push(between - started);
            times_b.push(between.elapsed());
        }
    }
    (median(times_a), median(times_b))
}

/// One AdamW update on flat tensors, the same operations as `AdamW::step`.
fn flat_adamw(p: &mut Tensor, g: &Tensor, m: &mut Tensor, v: &mut Tensor, step: i64) {
    let (lr, beta1, beta2, eps, decay) = (3e-3, 0.9, 0.999, 1e-8, 0.01);
    let t = step as f64;
    let (bias_correction1, bias_correction2) = (1.0 - f64::powf(beta1, t), 1.0 - f64::powf(beta2, t));
    tch::no_grad(|| -> Result<(), tch::TchError> {
        let _ = p.f_mul_scalar_(1.0 - lr * decay)?;
        let _ = m.f_mul_scalar_(beta1)?.f_add_(&(g * (1.0 - beta1)))?;
        let _ = v.f_mul_scalar_(beta2)?.f_addcmul_(&(g * (1.0 - beta2)), g)?;
        let denom = (v.f_sqrt()? / bias_correction2.sqrt()).f_add_scalar_(eps)?;
        let _ = p.f_addcdiv_(&(&*m * -(lr / bias_correction1)), &denom)?;
        Ok(())
    })
    .expect("the flat update runs");
}

/// `torch.optim.AdamW`'s three implementations on `shapes`, timed by
/// `scripts/bench_torch_adamw.py` with the project's Python.
fn torch_adamw(shapes: &[Vec<i64>], args: &Args) -> Result<Vec<(String, Duration)>, String> {
    let python = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    if !python.is_file() {
        return Err(format!("{} is missing: run scripts/setup.sh", python.display()));
    }
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/bench_torch_adamw.py");
    let shapes = format!("{shapes:?}");
    let output = std::process::Command::new(python)
        .arg(script)
        .args([shapes, args.steps.to_string(), args.warmup.to_string()])
        .output()
        .map_err(|e| format!("cannot run the Python script: {e}"))?;
    if !output.status.success() {
        return Err(format!("the Python script failed: {}", String::from_utf8_lossy(&output.stderr)));
    }
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| {
            let (name, ms) = line.split_once(' ').ok_or(format!("unexpected line {line:?}"))?;
            let ms: f64 = ms.trim().parse().map_err(|_| format!("unexpected line {line:?}"))?;
            Ok((format!("torch.optim.AdamW ({name})"), Duration::from_secs_f64(ms / 1e3)))
        })
        .collect()
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.steps > 0, "--steps must be at least 1");
    tch::set_num_threads(1);
    let task = TokenTask::standard(0, 1);
    let config = GptConfig { vocab_size: task.vocab_size(), block_size: task.seq_len(), ..GptConfig::tiny() };
    let (vs, _gpt) = Gpt::seeded(0, &config, Kind::Float);
    let params = named_parameters(&vs);
    let numel: i64 = params.iter().map(|(_, p)| p.numel() as i64).sum();
    for (_, p) in &params {
        let mut grad = p.grad();
        if !grad.defined() {
            (p * 1.0).sum(Kind::Float).backward(); // a gradient of ones
            grad = p.grad();
        }
        anyhow::ensure!(grad.defined(), "every parameter has a gradient");
    }
    let mut ours = AdamW::new(&params, 3e-3, 0.01);
    let zeros = || Tensor::zeros([numel], (Kind::Float, tch::Device::Cpu));
    let (mut p, g, mut m, mut v) = (zeros() + 1.0, zeros() + 1.0, zeros(), zeros());
    let mut step = 0;
    let (ours_time, flat_time) = time_alternately(
        &args,
        || ours.step().expect("the AdamW step runs"),
        || {
            step += 1;
            flat_adamw(&mut p, &g, &mut m, &mut v, step);
        },
    );

    println!(
        "AdamW step of the tiny GPT ({} tensors, {numel} numbers, f32), 1 libtorch thread, median of {} steps\n",
        params.len(),
        args.steps
    );
    let mut rows = vec![
        ("ours (train::AdamW)".to_string(), ours_time),
        ("the same update on one flat tensor".to_string(), flat_time),
    ];
    let shapes: Vec<Vec<i64>> = params.iter().map(|(_, p)| p.size()).collect();
    match torch_adamw(&shapes, &args) {
        Ok(torch_rows) => rows.extend(torch_rows),
        Err(why) => println!("(no torch.optim.AdamW rows: {why})\n"),
    }
    println!("| optimizer | ms / step | vs one flat tensor |");
    println!("| --- | ---: | ---: |");
    for (name, t) in rows {
        let ratio = t.as_secs_f64() / flat_time.as_secs_f64();
        println!("| {name} | {:.3} | {ratio:.1}x |", t.as_secs_f64() * 1e3);
    }
    println!("\n(torch.optim.AdamW runs in its own process, after ours, on the same machine.)");
    println!("\nload average: {}", load_average());
    Ok(())
}
