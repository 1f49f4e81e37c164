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
//! (65 s on the 2-core machine of the committed table, most of it the
//! 25M model's steps.)

use std::fmt::Write;
use std::time::Duration;

use clap::Parser;
use ddp_workbook::data::TokenTask;
use ddp_workbook::ddp::{plan_buckets, Bucket, ParamMeta};
use ddp_workbook::dist::{spawn_with, Group, SimulatedLink, SpawnOptions};
use ddp_workbook::models::{named_parameters, GptConfig, GptSize};
use ddp_workbook::train::{self, StepPhases, TrainConfig};

// train_rates.rs reads its `Rate` and its commands from these two; this
// program uses only its reading of the run's logs.
#[allow(dead_code)]
#[path = "support/bench_commands.rs"]
mod commands;
#[path = "support/table_file.rs"]
mod table_file;
#[allow(dead_code)]
#[path = "support/vs_pytorch_tables.rs"]
mod tables;
#[allow(dead_code)] // its rate_of is the head-to-heads'
#[path = "support/train_rates.rs"]
mod train_rates;
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

/// One rank's compute per step, in seconds.
#[derive(Clone, Copy, Debug)]
struct Compute {
    forward: f64,
    backward: f64,
    optimizer: f64,
    /// Data and what the phases do not cover (logging, the loss's mean).
    rest: f64,
}

impl Compute {
    fn total(&self) -> f64 {
        self.forward + self.backward + self.optimizer + self.rest
    }

    /// The same step on a device `factor` times faster.
    fn faster(&self, factor: f64) -> Compute {
        Compute {
            forward: self.forward / factor,
            backward: self.backward / factor,
            optimizer: self.optimizer / factor,
            rest: self.rest / factor,
        }
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

/// The model's shape, as the schedules see it.
struct Shape {
    /// Each parameter's bytes and its stage in backward: 0 the head
    /// (`lm_head`, `ln_f`), 1 + (L-1-k) block k, L+1 the embeddings.
    params: Vec<(f64, usize)>,
    /// Each stage's share of forward and backward (by matrix parameters).
    stage_share: Vec<f64>,
    /// DDP's buckets (the training run's caps).
    buckets: Vec<Bucket>,
    layers: usize,
}

impl Shape {
    fn of(size: GptSize) -> Shape {
        let config = config(size, 1);
        let task = TokenTask::standard(config.seed as i64, config.train_sequences as i64);
        let (vs, _) = train::build_model(&config, &task);
        let named = named_parameters(&vs);
        let layers = GptConfig::of_size(size).n_layer as usize;
        let stage = |name: &str| {
            let block = name.strip_prefix("blocks.").and_then(|r| r.split('.').next()?.parse::<usize>().ok());
            match block {
                Some(k) => 1 + (layers - 1 - k),
                None if name.contains("emb") => layers + 1,
                None => 0,
            }
        };
        let params: Vec<(f64, usize)> =
            named.iter().map(|(name, t)| ((t.numel() * 4) as f64, stage(name))).collect();
        let mut weight = vec![0.0; layers + 2];
        for ((name, t), &(_, s)) in named.iter().zip(&params) {
            if t.dim() == 2 && !name.contains("emb") {
                weight[s] += t.numel() as f64;
            }
        }
        let total: f64 = weight.iter().sum();
        let caps = config.bucket_caps();
        let buckets = plan_buckets(&ParamMeta::of(&named), caps.cap_bytes, caps.first_cap_bytes);
        Shape { params, stage_share: weight.iter().map(|w| w / total).collect(), buckets, layers }
    }

    fn bytes(&self) -> f64 {
        self.params.iter().map(|(b, _)| b).sum()
    }

    /// The bytes of each FSDP unit: the root (head and embeddings), then block 0 .. L-1.
    fn unit_bytes(&self) -> Vec<f64> {
        let mut units = vec![0.0; self.layers + 1];
        for &(bytes, stage) in &self.params {
            let unit = if stage == 0 || stage == self.layers + 1 { 0 } else { 1 + (self.layers - stage) };
            units[unit] += bytes;
        }
        units
    }
}

/// The α–β ring on `n` ranks: seconds for each collective of `bytes` (the
/// full tensor: the input of an all-reduce or a reduce-scatter, the output
/// of an all-gather).
#[derive(Clone, Copy)]
struct Ring {
    n: f64,
    alpha: f64,
    bytes_per_second: f64,
}

impl Ring {
    fn all_reduce(&self, bytes: f64) -> f64 {
        2.0 * self.half(bytes)
    }
    fn reduce_scatter(&self, bytes: f64) -> f64 {
        self.half(bytes)
    }
    fn all_gather(&self, bytes: f64) -> f64 {
        self.half(bytes)
    }
    /// (N-1) messages of a chunk each.
    fn half(&self, bytes: f64) -> f64 {
        (self.n - 1.0) * (self.alpha + bytes / self.n / self.bytes_per_second)
    }
}

/// One rank's queue of collectives: each starts when it is started and the
/// previous one is done.
#[derive(Default)]
struct Queue {
    free_at: f64,
    busy: f64,
}

impl Queue {
    /// Starts a collective of `seconds` at `t`; returns when it ends.
    fn start(&mut self, t: f64, seconds: f64) -> f64 {
        self.free_at = self.free_at.max(t) + seconds;
        self.busy += seconds;
        self.free_at
    }
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Strategy {
    Ddp,
    Zero1,
    Zero2,
    Fsdp,
}
const STRATEGIES: [Strategy; 4] = [Strategy::Ddp, Strategy::Zero1, Strategy::Zero2, Strategy::Fsdp];

impl Strategy {
    fn name(self) -> &'static str {
        match self {
            Strategy::Ddp => "DDP",
            Strategy::Zero1 => "ZeRO-1",
            Strategy::Zero2 => "ZeRO-2",
            Strategy::Fsdp => "FSDP",
        }
    }
}

/// One prediction: the step, the communication's total time, and the bound.
struct Predicted {
    step: f64,
    communication: f64,
    /// The step if every collective ran under compute.
    bound: f64,
}

impl Predicted {
    fn hidden_share(&self) -> f64 {
        if self.communication <= 0.0 {
            return 1.0;
        }
        let exposed = (self.step - self.bound).max(0.0);
        (1.0 - exposed / self.communication).clamp(0.0, 1.0)
    }
}

/// The step of `strategy` on `ring`, from one rank's `compute`, with `accum`
/// micro-batches per step (the training run's 2).
fn predict(strategy: Strategy, shape: &Shape, compute: Compute, ring: Ring, accum: usize) -> Predicted {
    let k = accum as f64;
    let (forward, backward) = (compute.forward / k, compute.backward / k); // per micro-batch
    let optimizer = match strategy {
        Strategy::Ddp => compute.optimizer,
        _ => compute.optimizer / ring.n, // each rank steps its shard
    };
    let stages = shape.layers + 2;
    let mut queue = Queue::default();
    // The micro-batches before the last: no communication but FSDP's gathers.
    let mut t = compute.rest;
    let step = if strategy == Strategy::Fsdp {
        let units = shape.unit_bytes();
        for micro_batch in 0..accum {
            t = fsdp_micro_batch(
                &mut queue,
                t,
                (forward, backward),
                shape,
                &units,
                ring,
                micro_batch + 1 == accum,
            );
        }
        t + optimizer
    } else {
        t += (k - 1.0) * (forward + backward) + forward;
        // Backward of the last micro-batch: stage s ends at ends[s].
        let mut ends = vec![0.0; stages];
        let mut clock = t;
        for (s, end) in ends.iter_mut().enumerate() {
            clock += backward * shape.stage_share[s];
            *end = clock;
        }
        // Buckets are started in order, each once all its gradients are ready.
        let mut started = t;
        let mut done = t;
        for bucket in &shape.buckets {
            let ready = bucket.params.iter().map(|&i| ends[shape.params[i].1]).fold(t, f64::max);
            started = started.max(ready);
            let bytes = bucket.bytes() as f64;
            let seconds =
                if strategy == Strategy::Zero2 { ring.reduce_scatter(bytes) } else { ring.all_reduce(bytes) };
            done = queue.start(started, seconds);
        }
        let mut t = clock.max(done) + optimizer;
        if strategy != Strategy::Ddp {
            // The updated shards, gathered bucket by bucket after the step.
            for bucket in &shape.buckets {
                t = queue.start(t, ring.all_gather(bucket.bytes() as f64));
            }
        }
        t
    };
    let bound = compute.rest + k * (forward + backward) + optimizer;
    Predicted { step, communication: queue.busy, bound }
}

/// One micro-batch of FSDP from `t`: forward (the root gathered, then each
/// block, the next one prefetched), backward (each block gathered again,
/// the next prefetched; in the last micro-batch each unit reduce-scattered
/// after its backward, the previous one waited for there). Returns its end.
fn fsdp_micro_batch(
    queue: &mut Queue,
    mut t: f64,
    (forward, backward): (f64, f64),
    shape: &Shape,
    units: &[f64],
    ring: Ring,
    last: bool,
) -> f64 {
    let layers = shape.layers;
    let block_share = |k: usize| shape.stage_share[1 + (layers - 1 - k)];
    let head = shape.stage_share[0];
    // Forward. The root stays gathered until its backward is done.
    t = queue.start(t, ring.all_gather(units[0]));
    let mut gathered = queue.start(t, ring.all_gather(units[1]));
    for k in 0..layers {
        t = t.max(gathered);
        if k + 1 < layers {
            gathered = queue.start(t, ring.all_gather(units[k + 2]));
        }
        t += forward * block_share(k);
    }
    t += forward * head;
    // Backward.
    t += backward * head;
    let mut gathered = queue.start(t, ring.all_gather(units[layers]));
    let mut reduced = t;
    for k in (0..layers).rev() {
        t = t.max(gathered);
        if k > 0 {
            gathered = queue.start(t, ring.all_gather(units[k]));
        }
        t += backward * block_share(k);
        if last {
            t = t.max(reduced); // one reduce-scatter in flight at most
            reduced = queue.start(t, ring.reduce_scatter(units[k + 1]));
        }
    }
    if last {
        t = t.max(reduced);
        t = queue.start(t, ring.reduce_scatter(units[0]));
    }
    t
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
        measured.push((size, Shape::of(size), compute));
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
