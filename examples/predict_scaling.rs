//! Scaling past this 2-core machine, on paper: the step time of DDP,
//! ZeRO-1, ZeRO-2 and FSDP at 2 to 64 ranks, one rank per device and the
//! same work per rank (weak scaling), over links of 10 and 100 Gbit/s.
//!
//! Each table also comes with the compute made faster by a factor
//! (`--speedup`, 100 by default: a GPU's order against one core), a what-if
//! that shows where the communication stops hiding.
//!
//! Two things are measured here, and nothing else:
//! - each GPT size's compute per step on one rank (the training run's own
//!   phases: forward, backward, optimizer, the rest), 1 libtorch thread;
//! - as a check on the model, DDP's step on 2 rank threads over the
//!   simulated link (`SimulatedLink`, as `bench_link` uses it), which
//!   delays each all-reduce by the link's time.
//!
//! The rest is chapter 1's α–β model of a ring (an all-reduce of n bytes
//! costs 2(N-1)(α + n/(N·B)); a reduce-scatter or an all-gather half of
//! that), laid on each strategy's schedule as the library runs it: one
//! queue of collectives per rank, in the order they are started; DDP's and
//! ZeRO-2's buckets started as backward makes them ready in the last
//! micro-batch; ZeRO-1 and ZeRO-2 all-gather the parameters after the step;
//! FSDP gathers the root, then each block with the next one prefetched,
//! in every micro-batch's forward and backward, and reduce-scatters each
//! unit in the last one. A unit's share of forward and backward is its
//! share of the matrix parameters (embeddings are lookups, left out). The
//! "hidden" share is the part of the communication that runs under
//! compute; the bound is the step if all of it did.
//!
//! Run: cargo run --release --example predict_scaling -- --table chapters/tables/scaling-on-paper.md
//! (70 s on the 2-core machine of the committed table, most of it the
//! 25M model's steps.)

use std::fmt::Write;
use std::time::Duration;

use clap::Parser;
use ddp_workbook::data::TokenTask;
use ddp_workbook::ddp::{plan_buckets, FullyShard, ParamMeta};
use ddp_workbook::dist::{spawn_with, Group, SimulatedLink, SpawnOptions};
use ddp_workbook::models::{named_parameters, GptConfig, GptSize};
use ddp_workbook::train::{self, StepPhases, TrainConfig};

// train_rates.rs reads its `Rate` and its commands from these two; this
// program uses only its reading of the run's logs.
#[allow(dead_code)]
#[path = "support/bench_commands.rs"]
mod commands;
#[path = "support/scaling_model.rs"]
mod scaling_model;
#[path = "support/table_file.rs"]
mod table_file;
#[allow(dead_code)]
#[path = "support/vs_pytorch_tables.rs"]
mod tables;
#[allow(dead_code)] // its rate_of is the head-to-heads'
#[path = "support/train_rates.rs"]
mod train_rates;
use scaling_model::{predict, Compute, Ring, Shape, Strategy, STRATEGIES};
use table_file::thousands;
use train_rates::{logged, timed_rate};

#[derive(Parser)]
#[command(
    about = "Predicted step time of DDP, ZeRO-1, ZeRO-2 and FSDP at 2 to 64 ranks, from measured compute"
)]
struct Args {
    /// The sizes, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = GptSize::ALL)]
    sizes: Vec<GptSize>,
    /// The links' bandwidths in Gbit/s, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [10.0, 100.0])]
    gbit: Vec<f64>,
    /// The latency α of one message, in µs (25 µs: what `scripts/bench_nodes.sh`
    /// measures between two network namespaces; real Ethernet is of that order).
    #[arg(long, default_value_t = 25.0)]
    latency_us: f64,
    /// What-if factors: each table also at compute this many times faster
    /// than measured (100: a GPU's order against one core), comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1.0, 100.0])]
    speedup: Vec<f64>,
    /// The world sizes, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [2, 4, 8, 16, 32, 64])]
    ranks: Vec<usize>,
    /// Write the tables to this file (relative to the repository).
    #[arg(long)]
    table: Option<String>,
}

const COMMAND: &str = "cargo run --release --example predict_scaling";

/// Timed and untimed steps of the measured runs at `size` (a few seconds each).
fn steps_of(size: GptSize) -> (usize, usize) {
    match size {
        GptSize::Tiny => (60, 10),
        GptSize::M2 => (15, 3),
        GptSize::M10 => (5, 2),
        GptSize::M25 => (3, 1),
    }
}

fn config(size: GptSize, world_size: usize) -> TrainConfig {
    let (steps, warmup) = steps_of(size);
    TrainConfig {
        world_size,
        steps: warmup + steps,
        log_every: warmup,
        threads_per_rank: Some(1),
        model: size,
        eval_sequences: 16,
        ..TrainConfig::default()
    }
}

/// The step of `config`'s run on `pg` (ms, after the warm-up, from rank
/// 0's logs: `None` on the other ranks) and this rank's phases.
fn timed_run(pg: Group, config: &TrainConfig) -> anyhow::Result<(Option<f64>, StepPhases)> {
    let rank = pg.rank();
    let mut phases = None;
    let logs = logged(&|_| {}, |on_event| {
        phases = Some(train::train_as_process(pg, config, on_event)?.phases);
        Ok(())
    })?;
    let step_ms = if rank == 0 { Some(timed_rate(&logs, config)?.step_ms) } else { None };
    Ok((step_ms, phases.expect("the run returned")))
}

/// One rank's compute per step at `size`: the timed step, split as the
/// whole run's phases split (the warm-up's share is small, and allocating
/// falls in every phase alike).
fn measure_compute(size: GptSize) -> anyhow::Result<Compute> {
    let config = config(size, 1);
    let (step_ms, p) = spawn_with(SpawnOptions::new(1), |pg: Group| {
        ddp_workbook::tch::set_num_threads(1);
        timed_run(pg, &config)
    })?
    .remove(0);
    let step_ms = step_ms.expect("rank 0 times its steps");
    let parts = [p.forward, p.backward + p.sync, p.optimizer, p.data].map(|d| d.as_secs_f64());
    let sum: f64 = parts.iter().sum();
    let share = |x: f64| step_ms / 1e3 * x / sum.max(1e-12);
    let (forward, backward, optimizer) = (share(parts[0]), share(parts[1]), share(parts[2]));
    Ok(Compute { forward, backward, optimizer, rest: step_ms / 1e3 - forward - backward - optimizer })
}

/// DDP's step (ms) on 2 rank threads over the simulated link.
fn measure_ddp_on_link(size: GptSize, link: SimulatedLink) -> anyhow::Result<f64> {
    let config = config(size, 2);
    let steps = spawn_with(SpawnOptions::new(2).link(link), |pg: Group| {
        ddp_workbook::tch::set_num_threads(1);
        timed_run(pg, &config)
    })?;
    Ok(steps[0].0.expect("rank 0 times its steps"))
}

/// `size`'s shape: its parameters in the training run's order, each
/// block's stage in backward, and the training run's buckets.
fn shape_of(size: GptSize) -> Shape {
    let config = config(size, 1);
    let task = TokenTask::standard(config.seed as i64, config.train_sequences as i64);
    let (vs, _) = train::build_model(&config, &task);
    let named = named_parameters(&vs);
    let layers = GptConfig::of_size(size).n_layer as usize;
    // The library's units: root, then block k as unit k + 1. Backward runs
    // the root's head first, the blocks last to first, the embeddings last.
    let mut stage = vec![0; named.len()];
    for (unit, (_, members)) in FullyShard::units_per_layer(&named, "blocks", layers).iter().enumerate() {
        for &i in members {
            stage[i] = match unit {
                0 if named[i].0.contains("emb") => layers + 1,
                0 => 0,
                unit => layers + 1 - unit,
            };
        }
    }
    let params: Vec<(f64, usize)> =
        named.iter().zip(&stage).map(|((_, t), &s)| ((t.numel() * 4) as f64, s)).collect();
    let mut weight = vec![0.0; layers + 2];
    for ((name, t), &(_, s)) in named.iter().zip(&params) {
        if t.dim() == 2 && !name.contains("emb") {
            weight[s] += t.numel() as f64;
        }
    }
    let total: f64 = weight.iter().sum();
    let caps = config.bucket_caps();
    let buckets = plan_buckets(&ParamMeta::of(&named), caps.cap_bytes, caps.first_cap_bytes);
    let bucket_bytes = buckets.iter().map(|b| (b.bytes() as f64, b.params.clone())).collect();
    Shape { params, stage_share: weight.iter().map(|w| w / total).collect(), buckets: bucket_bytes, layers }
}

fn ms(seconds: f64) -> String {
    if seconds >= 0.1 {
        thousands(seconds * 1e3)
    } else {
        format!("{:.1}", seconds * 1e3)
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        !args.sizes.is_empty() && !args.gbit.is_empty() && !args.ranks.is_empty() && !args.speedup.is_empty(),
        "--sizes, --gbit, --speedup and --ranks each need at least one value"
    );
    anyhow::ensure!(
        args.gbit.iter().all(|&g| g > 0.0)
            && args.speedup.iter().all(|&f| f > 0.0)
            && args.latency_us >= 0.0
            && args.ranks.iter().all(|&n| n >= 2),
        "--gbit and --speedup must be positive, --latency-us at least 0 and every --ranks at least 2"
    );
    let run = table_file::Run::start();
    let accum = TrainConfig::default().accum_steps;
    let mut measured = vec![];
    for &size in &args.sizes {
        let compute = measure_compute(size)?;
        println!("{size}: compute per step on one rank {compute:.4?} s");
        measured.push((size, shape_of(size), compute));
    }
    let mut body = String::from(
        "Predicted step time per rank in ms, and in brackets the share of the communication hidden under \
         compute, at the same work per rank (16 sequences per micro-batch, 2 micro-batches). \"1 rank\" is \
         the measured compute; \"bound\" is the step at 64 ranks if every collective were hidden.\n",
    );
    for (&speedup, &gbit) in args.speedup.iter().flat_map(|s| args.gbit.iter().map(move |g| (s, g))) {
        let link = SimulatedLink::new(Duration::from_secs_f64(args.latency_us * 1e-6), gbit);
        let compute_is = if speedup == 1.0 {
            "compute as measured".to_string()
        } else {
            format!("compute {speedup} times faster than measured")
        };
        let _ = write!(
            body,
            "\n#### {gbit} Gbit/s, α = {} µs, {compute_is}\n\n| size | strategy | 1 rank |",
            args.latency_us
        );
        for n in &args.ranks {
            let _ = write!(body, " {n} ranks |");
        }
        body += " bound | communication at 64 ranks |\n| --- | --- | ---: |";
        body += &" ---: |".repeat(args.ranks.len() + 2);
        body += "\n";
        for (size, shape, measured_compute) in &measured {
            let compute = &measured_compute.faster(speedup);
            for strategy in STRATEGIES {
                let _ = write!(body, "| {size} | {} | {} |", strategy.name(), ms(compute.total()));
                let mut last = None;
                for &n in &args.ranks {
                    let ring = Ring {
                        n: n as f64,
                        alpha: link.latency.as_secs_f64(),
                        bytes_per_second: link.bytes_per_second,
                    };
                    let p = predict(strategy, shape, *compute, ring, accum);
                    let _ = write!(body, " {} ({:.0} %) |", ms(p.step), 100.0 * p.hidden_share());
                    last = Some(p);
                }
                let last = last.expect("at least one world size");
                let _ = writeln!(body, " {} | {} |", ms(last.bound), ms(last.communication));
            }
        }
    }
    body +=
        "\nThe check: DDP on 2 rank threads over the simulated link, measured, against the prediction at 2 \
             ranks (the simulated link charges α once per all-reduce, the ring 2(N-1) times; at 2 ranks that \
             is 25 µs per bucket).\n\n| size | link | measured step | predicted | measured / predicted |\n\
             | --- | --- | ---: | ---: | ---: |\n";
    for (size, shape, compute) in &measured {
        for &gbit in &args.gbit {
            let link = SimulatedLink::new(Duration::from_secs_f64(args.latency_us * 1e-6), gbit);
            let ring =
                Ring { n: 2.0, alpha: link.latency.as_secs_f64(), bytes_per_second: link.bytes_per_second };
            let predicted = predict(Strategy::Ddp, shape, *compute, ring, accum).step;
            let step = measure_ddp_on_link(*size, link)? / 1e3;
            println!(
                "{size}, {gbit} Gbit/s: DDP on 2 rank threads {} ms, predicted {} ms",
                ms(step),
                ms(predicted)
            );
            let _ = writeln!(
                body,
                "| {size} | {gbit} Gbit/s | {} ms | {} ms | {:.2} |",
                ms(step),
                ms(predicted),
                step / predicted
            );
        }
    }
    let params: Vec<String> = measured
        .iter()
        .map(|(size, shape, _)| format!("{size}: {} B of float32 gradients", thousands(shape.bytes())))
        .collect();
    let settings = [
        format!("the sizes' gradients: {}", params.join(", ")),
        "one libtorch thread per rank; the buckets of the training run (25 MiB, the first 1 MiB)".to_string(),
    ];
    let command = table_file::command_line(COMMAND);
    let body = format!("{body}\n{}", run.caption(&settings, &command));
    println!("\n{body}");
    if let Some(table) = &args.table {
        println!("wrote {}", table_file::write_table(table, &command, &body)?.display());
    }
    Ok(())
}
