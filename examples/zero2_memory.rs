//! What sharding the gradients (ZeRO-2, chapter 13) costs and saves per
//! rank, measured: the tiny GPT (float32) on 1 to 4 in-process ranks, one
//! training step after a first one, behind the workbook's DDP (with the
//! training run's AdamW) and behind `ShardGradOp`. Prints, per rank, the
//! bytes of gradients alive at their peak during the step (DDP: its
//! buckets, the whole gradient; ZeRO-2: from its memory ledger), the AdamW
//! moments each keeps, and the bytes each step sends on the wire if every
//! collective runs as a ring (`CommStats::ring_wire_bytes`). Bytes, not
//! times: the numbers do not depend on the machine.
//!
//! Run: cargo run --example zero2_memory
//!      cargo run --example zero2_memory -- --table chapters/tables/zero2-memory.md

use clap::Parser;
use ddp_workbook::data::{masked_cross_entropy, TokenTask};
use ddp_workbook::ddp::{BucketCaps, ShardGradOp, SimpleDistributedDataParallelism};
use ddp_workbook::dist::{spawn, Group};
use ddp_workbook::models::{Gpt, GptConfig};
use ddp_workbook::tch::Kind;
use ddp_workbook::train::AdamW;

#[path = "support/table_file.rs"]
#[allow(dead_code)] // the timing helpers are the benchmarks'
mod table_file;

#[derive(Parser)]
#[command(about = "Gradient, moment and wire bytes per rank: DDP against ZeRO-2")]
struct Args {
    /// Also write the table to this file (relative to the repository).
    #[arg(long)]
    table: Option<String>,
}

const LR: f64 = 1e-3;
/// 64 KiB buckets: the tiny GPT's gradient is several buckets.
const CAPS: BucketCaps = BucketCaps { cap_bytes: 64 * 1024, first_cap_bytes: 64 * 1024 };
const ROWS: i64 = 4;

/// Per rank: gradient bytes at their peak, moment bytes, wire bytes of the second step.
type Measured = (usize, usize, f64);

fn ddp(world: usize) -> anyhow::Result<Measured> {
    let all = spawn(world, |pg: Group| {
        let task = TokenTask::standard(1, 64);
        let (vs, gpt) = Gpt::seeded(1, &GptConfig::tiny(), Kind::Float);
        let model = SimpleDistributedDataParallelism::with_bucket_caps(gpt, &vs, pg.clone(), CAPS)?;
        let mut optimizer = AdamW::new(model.parameters(), LR, 0.0);
        let mut wire = 0.0;
        for step in 0..2 {
            let before = pg.stats();
            optimizer.zero_grad();
            let (x, y, mask) = task.batch((step * world as i64 + pg.rank() as i64) * ROWS, ROWS);
            model.backward(&masked_cross_entropy(&model.forward(&x), &y, &mask))?;
            model.optimizer_step(&mut optimizer)?;
            wire = pg.stats().since(&before).ring_wire_bytes(world);
        }
        let grads = model.buckets().iter().map(|b| b.bytes()).sum();
        let moments = optimizer.state().into_iter().filter(|(name, _)| name.starts_with("exp_avg"));
        let moments = moments.map(|(_, t)| t.numel() * t.kind().elt_size_in_bytes()).sum();
        Ok((grads, moments, wire))
    })?;
    Ok(all[0])
}

fn zero2(world: usize) -> anyhow::Result<Measured> {
    let all = spawn(world, |pg: Group| {
        let task = TokenTask::standard(1, 64);
        let (vs, gpt) = Gpt::seeded(1, &GptConfig::tiny(), Kind::Float);
        let mut model = ShardGradOp::new(gpt, &vs, pg.clone(), CAPS, LR, 0.0)?;
        let ledger = model.ledger();
        let mut wire = 0.0;
        for step in 0..2 {
            let before = pg.stats();
            model.zero_grad()?;
            ledger.reset_peak();
            let (x, y, mask) = task.batch((step * world as i64 + pg.rank() as i64) * ROWS, ROWS);
            model.backward(&masked_cross_entropy(&model.forward(&x), &y, &mask))?;
            model.step()?;
            wire = pg.stats().since(&before).ring_wire_bytes(world);
        }
        Ok((ledger.peak_by_kind().gradients, ledger.alive().optimizer_state, wire))
    })?;
    Ok(all[0])
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut table = String::from(
        "| ranks | gradients, DDP | gradients at peak, ZeRO-2 | moments, DDP | moments, ZeRO-2 | \
         wire per step, DDP | wire per step, ZeRO-2 |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for world in 1..=4 {
        let (d, z) = (ddp(world)?, zero2(world)?);
        table += &format!("| {world} | {} | {} | {} | {} | {:.0} | {:.0} |\n", d.0, z.0, d.1, z.1, d.2, z.2);
    }
    let (vs, _) = Gpt::seeded(1, &GptConfig::tiny(), Kind::Float);
    let parameters: i64 = vs.trainable_variables().iter().map(|t| t.numel() as i64).sum();
    let settings = format!(
        "- bytes per rank; tiny GPT ({parameters} parameters, float32), {ROWS} sequences per rank, buckets \
         of 64 KiB, the second step of each run; wire bytes as a ring sends them \
         (`CommStats::ring_wire_bytes`), with the padding's zeros and each step's end-of-backward check"
    );
    println!("{table}\n{settings}");
    if let Some(path) = &args.table {
        let command = table_file::command_line("cargo run --example zero2_memory");
        let body = format!("{table}\n{settings}\n");
        println!("wrote {}", table_file::write_table(path, &command, &body)?.display());
    }
    Ok(())
}
