//! Chapter 14's memory table and figure data: the bytes of parameters,
//! gradients and AdamW state one rank holds during one training step of a
//! GPT, under DDP, ZeRO-1 (chapter 11), ZeRO-2 (chapter 13) and FSDP
//! (chapter 14), on 1 to 4
//! in-process ranks, in float32, next to the 16 bytes per parameter
//! (4 + 4 + 8) that DDP's arithmetic gives.
//!
//! Measured, not computed: ZeRO-2's and FSDP's numbers are the peak of the
//! library's `MemoryLedger`, to which `ShardGradOp` reports its buckets,
//! full gradients, gradient shards and moments, and `FullyShard` every shard, all-gather
//! output, full parameter gathered and freed, gradient, reduce-scatter
//! input, gradient shard and moment. DDP and ZeRO-1 allocate their tensors
//! once and hold them for the whole step: their numbers are the bytes of
//! the tensors rank 0 holds after the step (parameters, `.grad`, and the
//! optimizer's moments: `AdamW::state`, `ShardedAdamW::moment_bytes`),
//! written into a ledger in the order the step creates them, so that the
//! figure can draw them beside FSDP's.
//!
//! With `--size 25m` (any of `GptSize`), the same for that model, as the
//! library's own account next to the resident memory `bench_sizes` measures.
//!
//! Run: cargo run --example memory_per_rank
//!      cargo run --release --example memory_per_rank -- --size 25m --ranks 1,2 --table chapters/tables/sizes-memory.md
//!      cargo run --example memory_per_rank -- --table chapters/tables/fsdp-memory.md --data chapters/figures/data/fsdp_memory.tsv
//! (`--table` writes the book's table, support/table_file.rs; `--data`
//! writes the bytes alive after each event of one step on 2 ranks, which
//! `cargo run --example figures` draws as ch14-bytes-alive.svg.)

use clap::Parser;
use ddp_workbook::ddp::{
    tensor_bytes, BucketCaps, FsdpAdamW, FsdpOptions, FullyShard, HeldBytes, Holding, MemoryLedger,
    Replicated, ShardGradOp, ShardedAdamW, SimpleDistributedDataParallelism,
};
use ddp_workbook::dist::{spawn, Group};
use ddp_workbook::models::{named_parameters, Gpt, GptConfig, GptSize};
use ddp_workbook::tch::{Kind, Tensor};
use ddp_workbook::train::AdamW;

#[path = "support/table_file.rs"]
mod table_file;

#[derive(Parser)]
#[command(about = "Bytes per rank of DDP, ZeRO-1, ZeRO-2 and FSDP during one step, from the ledgers")]
struct Args {
    /// Write the Markdown table to this file (chapters/tables/fsdp-memory.md).
    #[arg(long)]
    table: Option<String>,
    /// Write the bytes alive over one step on 2 ranks to this file.
    #[arg(long)]
    data: Option<String>,
    /// One of the benchmarks' GPT sizes instead of the 8-block tiny GPT
    /// (ZeRO-2 then with the training run's 25 MiB buckets): the library's
    /// own account of what `bench_sizes` measures as resident memory.
    #[arg(long)]
    size: Option<GptSize>,
    /// The world sizes, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 2, 3, 4])]
    ranks: Vec<usize>,
}

/// The model every strategy builds: `--size`'s, or the 8-block tiny GPT.
static CONFIG: std::sync::OnceLock<(GptConfig, BucketCaps)> = std::sync::OnceLock::new();

const LR: f64 = 1e-3;
const BATCH: i64 = 4;

/// The tiny GPT of the training run, with 8 blocks, so that one block is
/// a small part of the model (as in any model worth sharding); or `--size`'s.
fn config() -> GptConfig {
    CONFIG.get().map_or_else(|| GptConfig { n_layer: 8, ..GptConfig::tiny() }, |(config, _)| config.clone())
}

/// ZeRO-2's buckets: smaller than a block of the tiny GPT, as chapter 13's
/// table has them (with the default 25 MiB cap that whole model is one
/// bucket, whose flat copy and full gradients are alive together, so
/// sharding would save nothing); the training run's for `--size`.
fn zero2_caps() -> BucketCaps {
    CONFIG.get().map_or(BucketCaps { cap_bytes: 64 * 1024, first_cap_bytes: 64 * 1024 }, |(_, caps)| *caps)
}

fn batch(rank: usize) -> (Tensor, Tensor) {
    let cfg = config();
    let all = ddp_workbook::with_seed(5, || {
        Tensor::randint(cfg.vocab_size, [BATCH * 4, cfg.block_size + 1], (Kind::Int64, tch_cpu()))
    });
    let rows = all.narrow(0, rank as i64 * BATCH, BATCH);
    (rows.narrow(1, 0, cfg.block_size), rows.narrow(1, 1, cfg.block_size))
}

fn tch_cpu() -> ddp_workbook::tch::Device {
    ddp_workbook::tch::Device::Cpu
}

fn loss(logits: &Tensor, target: &Tensor) -> Tensor {
    let vocab = config().vocab_size;
    logits.reshape([-1, vocab]).cross_entropy_for_logits(&target.reshape([-1]))
}

/// One strategy's step on one rank: the peak and the timeline.
struct Measured {
    peak: HeldBytes,
    timeline: Vec<(HeldBytes, String)>,
    params: usize,
}

fn timeline(ledger: &MemoryLedger) -> Vec<(HeldBytes, String)> {
    ledger.events().into_iter().map(|e| (e.alive, e.label)).collect()
}

fn ddp(pg: Group) -> anyhow::Result<Measured> {
    let (vs, gpt) = Gpt::seeded(0, &config(), Kind::Float);
    let named = named_parameters(&vs);
    let rank = pg.rank();
    let ddp = SimpleDistributedDataParallelism::new(gpt, &vs, pg)?;
    let mut adamw = AdamW::new(&named, LR, 0.0);
    let (x, y) = batch(rank);
    ddp.backward(&loss(&ddp.forward(&x), &y))?;
    adamw.step()?;
    let ledger = MemoryLedger::default();
    let sum =
        |f: &dyn Fn(&Tensor) -> Tensor| -> usize { named.iter().map(|(_, p)| tensor_bytes(&f(p))).sum() };
    ledger.alloc(Holding::Parameters, sum(&|p| p.shallow_clone()), "parameters");
    let moments: usize =
        adamw.state().iter().filter(|(n, _)| n.starts_with("exp_avg")).map(|(_, t)| tensor_bytes(t)).sum();
    ledger.alloc(Holding::OptimizerState, moments, "AdamW moments");
    ledger.alloc(Holding::Gradients, sum(&|p| p.grad()), "gradients (backward)");
    Ok(Measured { peak: ledger.peak(), timeline: timeline(&ledger), params: params_of(&named) })
}

fn zero1(pg: Group) -> anyhow::Result<Measured> {
    let (vs, gpt) = Gpt::seeded(0, &config(), Kind::Float);
    let named = named_parameters(&vs);
    let rank = pg.rank();
    let model = Replicated::new(gpt, &vs, pg.clone())?;
    let mut adamw = ShardedAdamW::new(&named, pg, BucketCaps::default(), LR, 0.0)?;
    let (x, y) = batch(rank);
    loss(&model.forward(&x), &y).backward();
    adamw.step()?;
    let ledger = MemoryLedger::default();
    let sum =
        |f: &dyn Fn(&Tensor) -> Tensor| -> usize { named.iter().map(|(_, p)| tensor_bytes(&f(p))).sum() };
    ledger.alloc(Holding::Parameters, sum(&|p| p.shallow_clone()), "parameters");
    ledger.alloc(Holding::OptimizerState, adamw.moment_bytes(), "AdamW moments of this rank's shard");
    ledger.alloc(Holding::Gradients, sum(&|p| p.grad()), "gradients (backward)");
    Ok(Measured { peak: ledger.peak(), timeline: timeline(&ledger), params: params_of(&named) })
}

fn zero2(pg: Group) -> anyhow::Result<Measured> {
    let (vs, gpt) = Gpt::seeded(0, &config(), Kind::Float);
    let named = named_parameters(&vs);
    let rank = pg.rank();
    let mut zero2 = ShardGradOp::new(gpt, &vs, pg, zero2_caps(), LR, 0.0)?;
    let ledger = zero2.ledger();
    ledger.reset_peak();
    let (x, y) = batch(rank);
    zero2.backward(&loss(&zero2.forward(&x), &y))?;
    zero2.step()?;
    Ok(Measured { peak: ledger.peak(), timeline: timeline(&ledger), params: params_of(&named) })
}

fn fsdp(pg: Group) -> anyhow::Result<Measured> {
    let (vs, gpt) = Gpt::seeded(0, &config(), Kind::Float);
    let named = named_parameters(&vs);
    let rank = pg.rank();
    let fsdp = FullyShard::gpt(&gpt, &vs, pg, FsdpOptions::default())?;
    let mut adamw = FsdpAdamW::new(&fsdp, LR, 0.0);
    let ledger = fsdp.ledger().clone();
    ledger.reset_peak();
    let (x, y) = batch(rank);
    let logits = fsdp.forward_with(|hooks| gpt.forward_with_hooks(&x, hooks))?;
    fsdp.backward(&loss(&logits, &y))?;
    adamw.step(&fsdp)?;
    Ok(Measured { peak: ledger.peak(), timeline: timeline(&ledger), params: params_of(&named) })
}

fn params_of(named: &[(String, Tensor)]) -> usize {
    named.iter().map(|(_, p)| p.numel()).sum()
}

type Strategy = (&'static str, fn(Group) -> anyhow::Result<Measured>);

const STRATEGIES: [Strategy; 4] = [("DDP", ddp), ("ZeRO-1", zero1), ("ZeRO-2", zero2), ("FSDP", fsdp)];

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        !args.ranks.is_empty() && args.ranks.iter().all(|&n| n >= 1),
        "--ranks needs world sizes of at least 1"
    );
    anyhow::ensure!(
        args.data.is_none() || (args.size.is_none() && args.ranks.contains(&2)),
        "--data draws the 8-block tiny GPT on 2 ranks: drop --size, keep 2 in --ranks"
    );
    if let Some(size) = args.size {
        let caps = ddp_workbook::train::TrainConfig::default().bucket_caps();
        CONFIG.set((GptConfig::of_size(size), caps)).expect("set once, here");
    }
    let run = table_file::Run::start();
    let mut rows = String::from(
        "| strategy | ranks | parameters | gradients | optimizer state | peak per rank | bytes per parameter |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    let mut data = String::new();
    let mut params = 0;
    for (name, strategy) in STRATEGIES {
        for &world in &args.ranks {
            let measured =
                spawn(world, strategy).map_err(|e| anyhow::anyhow!("{name} on {world} ranks: {e}"))?;
            let rank0 = &measured[0];
            params = rank0.params;
            let p = rank0.peak;
            rows += &format!(
                "| {name} | {world} | {} | {} | {} | {} | {:.2} |\n",
                table_file::thousands(p.parameters as f64),
                table_file::thousands(p.gradients as f64),
                table_file::thousands(p.optimizer_state as f64),
                table_file::thousands(p.total() as f64),
                p.total() as f64 / params as f64
            );
            if world == 2 {
                for (i, (alive, label)) in rank0.timeline.iter().enumerate() {
                    data += &format!(
                        "{name}\t{i}\t{}\t{}\t{}\t{label}\n",
                        alive.parameters, alive.gradients, alive.optimizer_state
                    );
                }
            }
        }
    }
    let cfg = config();
    let arithmetic = format!(
        "A GPT of {} parameters ({} blocks, n_embd {}), float32: DDP's arithmetic is 4 + 4 + 8 = 16 bytes \
         per parameter, {} bytes per rank; FSDP's, on N ranks, 16/N per parameter plus the gathered units.\n\n",
        table_file::thousands(params as f64),
        cfg.n_layer,
        cfg.n_embd,
        table_file::thousands(16.0 * params as f64)
    );
    let body = format!("{arithmetic}{rows}\n");
    print!("{body}");
    let settings = [
        "rank 0's bytes at the peak of one AdamW step (forward, backward, step), from the ledgers"
            .to_string(),
        format!(
            "ZeRO-2: `ShardGradOp` with buckets of {} KiB; FSDP: `fully_shard` on each block and the root, \
             `reshard_after_forward=True`",
            zero2_caps().cap_bytes / 1024
        ),
    ];
    if let Some(path) = &args.table {
        let command = table_file::command_line("cargo run --example memory_per_rank");
        let body = format!("{body}{}", run.caption(&settings, &command));
        println!("wrote {}", table_file::write_table(path, &command, &body)?.display());
    }
    if let Some(path) = &args.data {
        let command = table_file::command_line("cargo run --example memory_per_rank");
        let text = format!(
            "# command\t{command}\n# ranks\t2\n# parameters\t{params}\n\
             strategy\tevent\tparameters\tgradients\toptimizer_state\tlabel\n{data}"
        );
        std::fs::write(path, text)?;
        println!("wrote {path}");
    }
    Ok(())
}
