//! Chapter 7's whole loop on 2 ranks. Run: cargo run --release --example sharded_training
//!
//! Two ranks (threads of this process) train the regression MLP of the
//! chapters with the finished DDP library alone: a `DistributedSampler` per
//! rank, `set_epoch` every epoch, 2 micro-batches per optimizer step
//! (`train_step` runs the first under `no_sync`), gradients averaged in 4
//! small buckets, SGD. Every rank computes the global batch's loss with
//! `mean_over_ranks`; rank 0 alone prints it, and rank 0 alone saves the
//! trained weights at the end. It runs in a second or two.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use ddp_workbook::data::Regression;
use ddp_workbook::ddp::{
    micro_batch_size, rows, train_step, BucketCaps, DistributedSampler, SamplerOptions,
    SimpleDistributedDataParallelism,
};
use ddp_workbook::dist::{spawn, Group};
use ddp_workbook::models::Mlp;
use ddp_workbook::tch::nn::{self, OptimizerConfig};
use ddp_workbook::tch::{Kind, Reduction};

const WORLD_SIZE: usize = 2;
const DATASET_LEN: i64 = 191; // odd: 96 per rank, rank 1's last one repeats the epoch's first
const GLOBAL_BATCH: i64 = 32; // = micro-batch 8 x 2 micro-batches x 2 ranks
const ACCUMULATION_STEPS: i64 = 2;
const EPOCHS: u64 = 10;
const LR: f64 = 0.1;
const DATA_SEED: i64 = 1;
const MODEL_SEED: i64 = 7;
const SAMPLER_SEED: u64 = 5;
/// Small caps, so that this small model (2,952 bytes of f64 gradients) gets
/// the 4 buckets of chapter 5 instead of one.
const CAPS: BucketCaps = BucketCaps { cap_bytes: 1024, first_cap_bytes: 128 };

/// What one rank reports back: its optimizer steps and gradient syncs.
struct RankSummary {
    steps: usize,
    syncs: u64,
}

/// One rank's whole run.
fn train_rank(pg: Group, checkpoint: &Path) -> anyhow::Result<RankSummary> {
    // ANCHOR: setup
    // The same data and the same initial weights on every rank: same seeds.
    let data = Regression::new(DATA_SEED, DATASET_LEN, 4, 1, Kind::Double); // x [191, 4], y [191, 1]
    let (vs, mlp) = Mlp::seeded(MODEL_SEED, &[4, 16, 16, 1], Kind::Double);
    let options = SamplerOptions { seed: SAMPLER_SEED, ..SamplerOptions::default() }; // shuffled, tail padded
    let mut sampler = DistributedSampler::sharded(pg.as_ref(), data.len(), options)?;
    let micro = micro_batch_size(GLOBAL_BATCH, pg.world_size(), ACCUMULATION_STEPS)? as usize; // rows
    let ddp = SimpleDistributedDataParallelism::with_bucket_caps(mlp, &vs, pg, CAPS)?; // rank 0's weights everywhere
    let mut optimizer = nn::Sgd::default().build(&vs, LR)?;
    // ANCHOR_END: setup
    if ddp.rank() == 0 {
        println!(
            "{} ranks x {} micro-batches of {micro} rows = global batch {GLOBAL_BATCH}; {} examples per rank \
             and epoch ({DATASET_LEN} in the data set); buckets {:?}",
            ddp.world_size(),
            ACCUMULATION_STEPS,
            sampler.len(),
            ddp.bucket_names()
        );
    }
    let mut steps = 0;
    // ANCHOR: epochs
    for epoch in 0..EPOCHS {
        sampler.set_epoch(epoch); // a new order, the same on every rank
        let shard = sampler.indices(); // this rank's part of it, as long as every other rank's
        let mut losses = Vec::new();
        for step_indices in shard.chunks_exact(micro * ACCUMULATION_STEPS as usize) {
            let micro_batches: Vec<&[i64]> = step_indices.chunks_exact(micro).collect(); // k lists of indices
            let rank_loss = train_step(&ddp, &mut optimizer, &micro_batches, |indices| {
                let (x, y) = (rows(&data.x, indices), rows(&data.y, indices)); // [micro, 4], [micro, 1]
                ddp.forward(&x).mse_loss(&y, Reduction::Mean) // the mean over this micro-batch
            })?;
            losses.push(ddp.mean_over_ranks(rank_loss)?); // the global batch's loss: every rank calls it
        }
        if ddp.rank() == 0 {
            let mean = losses.iter().sum::<f64>() / losses.len() as f64;
            println!("epoch {epoch}: {} steps, mean global-batch loss {mean:.6}", losses.len());
        }
        steps += losses.len();
    }
    if ddp.rank() == 0 {
        vs.save(checkpoint)?; // the unwrapped model's weights, once
    }
    ddp.process_group().barrier()?; // no rank may read the file before it is complete
                                    // ANCHOR_END: epochs
    Ok(RankSummary { steps, syncs: ddp.gradient_syncs() })
}

fn main() -> ExitCode {
    let checkpoint: PathBuf = std::env::temp_dir().join("sharded_training.ot");
    match spawn(WORLD_SIZE, |pg| train_rank(pg, &checkpoint)) {
        Ok(summaries) => {
            for (rank, summary) in summaries.iter().enumerate() {
                println!(
                    "rank {rank}: {} optimizer steps, {} gradient syncs (one per step: the first micro-batch \
                     of each step ran under no_sync)",
                    summary.steps, summary.syncs
                );
            }
            println!("rank 0 saved the trained weights to {}", checkpoint.display());
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}
