//! How long one gradient sync takes with chapter 3's
//! naive sync (one all-reduce per parameter), with chapter 5's buckets (one
//! all-reduce per bucket, PyTorch's default caps, each gradient copied into
//! its bucket and back), and with the finished library's buckets, in which
//! the gradients live (nothing copied), on a model of many small tensors and
//! on one of a few large tensors, for 1, 2 and 4 ranks of the in-process
//! backend. Prints a Markdown table. All three are the library's
//! (`ddp::naive::sync_gradients`, `sync_bucket` on every bucket of a `GradientBuckets`
//! and `GradientBuckets::sync`), so the benchmark runs before you have done
//! the exercises.
//!
//! Run: cargo run --release --example bench_sync
//!      cargo run --release --example bench_sync -- --steps 10 --world-sizes 2,4
//!      cargo run --release --example bench_sync -- --table chapters/tables/sync.md
//! (`--table` writes the table with the machine, its load and the command,
//! support/table_file.rs, for chapter 5 to include.)
//!
//! Only the sync is timed: each rank runs one backward to create its
//! gradients, then syncs them over and over (after the first sync they are
//! equal on every rank, so the values stay put). Every step runs the naive
//! sync and then the bucketed one, so that both see the same load from
//! anything else on the machine. Before each timed sync all ranks meet at a
//! barrier, so they start together; a sync takes as long as its slowest rank,
//! and the table shows the median over the timed steps.

use std::time::{Duration, Instant};

use clap::Parser;
use ddp_workbook::ddp::{naive, sync_bucket, BucketCaps, GradientBuckets};
use ddp_workbook::dist::spawn;
use ddp_workbook::models::{named_parameters, Mlp};
use ddp_workbook::tch::nn::Module;
use ddp_workbook::tch::{self, Kind, Tensor};

#[path = "support/machine.rs"]
mod machine;
#[path = "support/table_file.rs"]
mod table_file;
use machine::load_average;

#[derive(Parser)]
#[command(about = "Time the naive and the bucketed gradient sync on the in-process backend")]
struct Args {
    /// Timed steps per case, each one naive and one bucketed sync (the
    /// median is reported).
    #[arg(long, default_value_t = 100)]
    steps: usize,
    /// Untimed steps before them (allocations, first-touch page faults).
    #[arg(long, default_value_t = 10)]
    warmup: usize,
    /// World sizes to run, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 2, 4])]
    world_sizes: Vec<usize>,
    /// libtorch's intra-op threads, shared by all rank threads. One, because
    /// the rank threads already fill the cores: with one OpenMP thread per
    /// core, the large buffers' operations oversubscribe the cores, and a
    /// parallel region whose thread lost its core to another process stalls.
    #[arg(long, default_value_t = 1)]
    intra_op_threads: i32,
    /// Also write the table, the machine, its load and this command to this
    /// Markdown file (relative to the repository).
    #[arg(long)]
    table: Option<String>,
}

/// A model to sync: an MLP of f32 layers with these sizes.
struct Model {
    name: &'static str,
    sizes: Vec<i64>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Method {
    Naive,
    /// Chapter 5's sync: each gradient copied into its bucket and back.
    BucketedCopies,
    /// The finished library's: the gradients live in the buckets.
    BucketedInPlace,
}

/// The syncs run in the same loop, one after the other at every step, so
/// that all meet the same load from whatever else runs on the machine.
const METHODS: [Method; 3] = [Method::Naive, Method::BucketedCopies, Method::BucketedInPlace];

/// What one rank saw, per method (indexed like [`METHODS`]).
struct RankRecord {
    times: [Vec<Duration>; 3],
    all_reduces: [u64; 3],
    bytes: [u64; 3],
    numel: i64,
    tensors: usize,
}

/// What one method measured on one model and world size.
struct Measured {
    median: Duration,
    all_reduces_per_step: u64,
    bytes_per_step: u64,
    params: i64,
    tensors: usize,
}

/// Runs `warmup + steps` steps on `world_size` ranks; each step times one
/// naive sync and one bucketed sync.
fn measure(model: &Model, world_size: usize, args: &Args) -> anyhow::Result<Vec<Measured>> {
    let per_rank = spawn(world_size, |pg| {
        // Two copies of the model: the in-place sync turns its gradients into
        // views of its buckets, which the other two syncs must not see.
        let x = Tensor::randn([8, model.sizes[0]], (Kind::Float, tch::Device::Cpu)); // [8, in]
        let with_gradients = || {
            let (vs, mlp) = Mlp::seeded(1, &model.sizes, Kind::Float);
            mlp.forward(&x).square().mean(Kind::Float).backward(); // every parameter has a gradient now
            let params = named_parameters(&vs);
            (vs, params)
        };
        let ((_vs, params), (_vs_in_place, params_in_place)) = (with_gradients(), with_gradients());

        // What the wrappers set up at construction: the layout, and one
        // buffer per bucket, allocated once.
        let buckets = GradientBuckets::plan(pg.as_ref(), &params, BucketCaps::default())?;
        let buckets_in_place = GradientBuckets::plan(pg.as_ref(), &params_in_place, BucketCaps::default())?;

        let numel = params.iter().map(|(_, t)| t.numel() as i64).sum();
        let mut record = RankRecord {
            times: [vec![], vec![], vec![]],
            all_reduces: [0; 3],
            bytes: [0; 3],
            numel,
            tensors: params.len(),
        };
        for step in 0..args.warmup + args.steps {
            for (m, method) in METHODS.iter().enumerate() {
                pg.barrier()?; // start together
                let before = pg.stats();
                let start = Instant::now();
                match method {
                    Method::Naive => naive::sync_gradients(pg.as_ref(), &params)?,
                    Method::BucketedCopies => {
                        // Chapter 5's reference on every bucket, in bucket order.
                        for (b, bucket) in buckets.layout().iter().enumerate() {
                            sync_bucket(pg.as_ref(), bucket, &mut buckets.buffer(b), &params)?;
                        }
                    }
                    Method::BucketedInPlace => buckets_in_place.sync(pg.as_ref(), &params_in_place)?,
                }
                let elapsed = start.elapsed();
                let after = pg.stats();
                record.all_reduces[m] = after.all_reduce - before.all_reduce;
                record.bytes[m] = after.collective_bytes - before.collective_bytes;
                if step >= args.warmup {
                    record.times[m].push(elapsed);
                }
            }
        }
        Ok(record)
    })?;
    let measured = (0..METHODS.len())
        .map(|m| {
            // A step lasts as long as its slowest rank.
            let mut slowest: Vec<Duration> = (0..args.steps)
                .map(|i| per_rank.iter().map(|r| r.times[m][i]).max().unwrap_or_default())
                .collect();
            slowest.sort();
            let rank0 = &per_rank[0];
            Measured {
                median: slowest[slowest.len() / 2],
                all_reduces_per_step: rank0.all_reduces[m],
                bytes_per_step: rank0.bytes[m],
                params: rank0.numel,
                tensors: rank0.tensors,
            }
        })
        .collect();
    Ok(measured)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.steps > 0, "--steps must be at least 1");
    anyhow::ensure!(args.world_sizes.iter().all(|&n| n > 0), "every world size must be at least 1");
    anyhow::ensure!(args.intra_op_threads > 0, "--intra-op-threads must be at least 1");
    tch::set_num_threads(args.intra_op_threads);
    let models = [
        // 100 layers of 64 x 64: 200 tensors of 256 B to 16 KiB, 1.6 MiB in all.
        Model { name: "many small (MLP, 100 x [64, 64])", sizes: vec![64; 101] },
        // 3 layers of 1024 x 1024: 6 tensors, three of 4 MiB, 12 MiB in all.
        Model { name: "few large (MLP, 3 x [1024, 1024])", sizes: vec![1024; 4] },
    ];
    let run = table_file::Run::start();
    let load_before = load_average();
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let settings = format!(
        "in-process backend, {cores} cores, libtorch intra-op threads: {}, {} warm-up + {} timed steps per case \
         (each step: the naive sync, then the two bucketed ones), median of the slowest rank's time",
        tch::get_num_threads(),
        args.warmup,
        args.steps
    );
    println!("{settings}\n");
    let mut table = String::from(
        "| model | ranks | params | tensors | sync | all-reduces / step | bytes / step | ms / step | speed-up |\n\
         | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |\n",
    );
    for model in &models {
        for &world_size in &args.world_sizes {
            let measured = measure(model, world_size, &args)?;
            let naive = &measured[0];
            for (method, m) in METHODS.iter().zip(&measured) {
                let (name, speed_up) = match method {
                    Method::Naive => ("naive (ch. 3)", String::new()),
                    Method::BucketedCopies | Method::BucketedInPlace => {
                        let ratio = naive.median.as_secs_f64() / m.median.as_secs_f64();
                        let name = if *method == Method::BucketedCopies {
                            "bucketed, copies (ch. 5)"
                        } else {
                            "bucketed, in place (library)"
                        };
                        (name, format!("{ratio:.1}x"))
                    }
                };
                let row = format!(
                    "| {} | {world_size} | {} | {} | {name} | {} | {} | {:.3} | {speed_up} |",
                    model.name,
                    table_file::thousands(m.params as f64),
                    m.tensors,
                    m.all_reduces_per_step,
                    table_file::thousands(m.bytes_per_step as f64),
                    m.median.as_secs_f64() * 1e3,
                );
                println!("{row}");
                table += &row;
                table.push('\n');
            }
        }
    }
    println!("\n1-minute load average before: {load_before}, after: {}", load_average());
    if let Some(path) = &args.table {
        let command = table_file::command_line("cargo run --release --example bench_sync");
        let body = format!("{table}\n{}", run.caption(&[settings], &command));
        println!("wrote {}", table_file::write_table(path, &command, &body)?.display());
    }
    Ok(())
}
