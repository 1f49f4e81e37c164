//! Chapter 07 tests, part 2: the whole loop. Compiled into
//! `cargo test --test chapter_07` (see `tests/chapter_07.rs`).
//!
//! Every rank trains the chapter-7 `SimpleDistributedDataParallelism` on its
//! own shard, in micro-batches of `micro` rows, k = 2 of them per optimizer
//! step, with buckets small enough to make several. One optimizer step then
//! sees N × k × micro rows over all ranks: the global batch. The gradient
//! each rank ends up with is
//!     (1/N) Σ_ranks Σ_micro-batches (1/k) ∇(mean loss of the micro-batch),
//! the mean over N·k equal micro-batches of their mean gradients: exactly
//! ∇(mean loss over the whole global batch). So one process that trains on
//! those rows, in one batch, must take the same steps, up to the order of
//! floating-point additions: TOLERANCE below, in f64.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use approx::abs_diff_eq;
use ddp_workbook::ch07_sharding::{
    rows, shard, shard_len, train_step, BucketCaps, DistributedSampler, SimpleDistributedDataParallelism,
};
use ddp_workbook::check::{compare_replicas, compare_to_reference, max_reference_diff, snapshot};
use ddp_workbook::data::Regression;
use ddp_workbook::dist::Group;
use ddp_workbook::models::{named_parameters, Mlp};
use ddp_workbook::tch::nn::{self, OptimizerConfig};
use ddp_workbook::tch::{Kind, Tensor};

use crate::common::{mse, run, train_single_process, Named, Optim, Step, TOLERANCE};

pub(super) const SIZES: &[i64] = &[4, 16, 16, 1];
pub(super) const MODEL_SEED: i64 = 11;
pub(super) const DATA_SEED: i64 = 12;
pub(super) const SAMPLER_SEED: u64 = 13;
/// 23 examples: 12 per rank on 2 ranks and 8 on 3, each padded by one.
pub(super) const DATASET_LEN: i64 = 23;
pub(super) const ACCUMULATION_STEPS: usize = 2;
pub(super) const STEPS_PER_EPOCH: usize = 2;
pub(super) const EPOCHS: u64 = 2;
pub(super) const LR: f64 = 0.1;
/// This 2.8 KiB f64 model gets 4 buckets.
pub(super) const CAPS: BucketCaps = BucketCaps { cap_bytes: 1024, first_cap_bytes: 128 };

/// How the ranks get their data.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Sharding {
    /// A DistributedSampler per rank, `set_epoch` every epoch: the real thing.
    Sampler,
    /// The bug: every rank builds its sampler as rank 0.
    EveryRankIsRank0,
    /// The other bug: `set_epoch` is never called.
    NoSetEpoch,
}

pub(super) fn data() -> Regression {
    Regression::new(DATA_SEED, DATASET_LEN, 4, 1, Kind::Double)
}

pub(super) fn sampler(world_size: usize, rank: usize) -> DistributedSampler {
    DistributedSampler::new(DATASET_LEN, world_size, rank, true, SAMPLER_SEED, false).expect("valid sampler")
}

/// One rank's record of a run.
#[derive(Default)]
pub(super) struct RankRun {
    pub(super) after_each_step: Vec<Named>,
    /// The indices this rank trained on, per epoch.
    pub(super) seen: Vec<Vec<i64>>,
    all_reduces_per_step: Vec<u64>,
    /// The global batch's loss, per step (all ranks' mean).
    losses: Vec<f64>,
    buckets: usize,
    gradient_syncs: u64,
    sync_time: Duration,
    /// Rank 0 only: where it saved the trained model (deleted on drop).
    checkpoint: Option<PathBuf>,
}

impl RankRun {
    fn record_step(&mut self, all_reduces: u64, loss: f64, parameters: &[(String, Tensor)]) {
        self.all_reduces_per_step.push(all_reduces);
        self.losses.push(loss);
        self.after_each_step.push(snapshot(parameters));
    }
}

impl Drop for RankRun {
    fn drop(&mut self) {
        if let Some(path) = &self.checkpoint {
            let _ = std::fs::remove_file(path); // a test's leftover; nothing to do if it fails
        }
    }
}

/// A file name of its own for every run, since tests run side by side.
fn checkpoint_path() -> PathBuf {
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let run = RUNS.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("ddp-workbook-ch07-{}-{run}.safetensors", std::process::id()))
}

pub(super) fn train_ddp(world_size: usize, sharding: Sharding) -> Vec<RankRun> {
    run(world_size, |pg: Group| {
        let data = data();
        let (vs, model) = Mlp::seeded(MODEL_SEED, SIZES, Kind::Double);
        let rank = if sharding == Sharding::EveryRankIsRank0 { 0 } else { pg.rank() };
        let set_epoch = sharding != Sharding::NoSetEpoch;
        let mut run = RankRun::default();
        let checkpoint = checkpoint_path();
        let mut sampler =
            DistributedSampler::new(DATASET_LEN, pg.world_size(), rank, true, SAMPLER_SEED, false)?;
        // The real run shards with your code; the negative controls, which
        // show what a broken sharding does, with the library's, so that they
        // speak about sharding mistakes and not about your sampler.
        let yours = sharding == Sharding::Sampler;
        let shard_of = |s: &DistributedSampler| if yours { shard(s) } else { s.indices() };
        let per_rank = if yours { shard_len(&sampler) } else { sampler.len() };
        let micro = per_rank / (ACCUMULATION_STEPS * STEPS_PER_EPOCH); // rows per micro-batch
        let ddp = SimpleDistributedDataParallelism::with_bucket_caps(model, &vs, pg, CAPS)?;
        let mut optimizer = nn::Sgd::default().build(&vs, LR)?;
        for epoch in 0..EPOCHS {
            if set_epoch {
                sampler.set_epoch(epoch); // a new order, the same on every rank
            }
            let shard = shard_of(&sampler); // this rank's part of it, as long as every other rank's
            for step_indices in shard.chunks_exact(micro * ACCUMULATION_STEPS) {
                let micro_batches: Vec<&[i64]> = step_indices.chunks_exact(micro).collect();
                let calls_before = ddp.stats().all_reduce; // the test's records
                let rank_loss = train_step(&ddp, &mut optimizer, &micro_batches, |indices| {
                    let (x, y) = (rows(&data.x, indices), rows(&data.y, indices)); // [micro, 4], [micro, 1]
                    mse(&ddp.forward(&x), &y) // mean over this micro-batch
                })?;
                let all_reduces = ddp.stats().all_reduce - calls_before; // the test's records
                let loss = ddp.mean_over_ranks(rank_loss)?; // every rank calls it: a collective
                if ddp.rank() == 0 {
                    println!("{world_size} ranks, {sharding:?}, epoch {epoch}: global batch loss {loss:.6}");
                }
                run.record_step(all_reduces, loss, ddp.parameters()); // the test's records
            }
            run.seen.push(shard); // the test's records
        }
        if ddp.rank() == 0 {
            vs.save(&checkpoint)?; // the unwrapped model's weights, once
            run.checkpoint = Some(checkpoint); // the test's records
        }
        ddp.process_group().barrier()?; // no rank may read the file before it is complete
        (run.buckets, run.gradient_syncs, run.sync_time) =
            (ddp.buckets().len(), ddp.gradient_syncs(), ddp.sync_time());
        Ok(run)
    })
}

/// The global batch of every step, as the library's samplers (the
/// reference) of `world_size` ranks form it: step s of an epoch is every rank's s-th step, together.
/// With `only_rank0`, rank 0's part alone.
pub(super) fn global_batches(world_size: usize, only_rank0: bool) -> Vec<Vec<i64>> {
    let mut batches = vec![];
    for epoch in 0..EPOCHS {
        let shards: Vec<Vec<i64>> = (0..world_size)
            .map(|rank| {
                let mut s = sampler(world_size, rank);
                s.set_epoch(epoch);
                s.indices()
            })
            .collect();
        let per_step = shards[0].len() / STEPS_PER_EPOCH;
        for step in 0..STEPS_PER_EPOCH {
            let ranks = if only_rank0 { 1 } else { world_size };
            batches.push(
                shards[..ranks]
                    .iter()
                    .flat_map(|s| &s[step * per_step..(step + 1) * per_step])
                    .copied()
                    .collect(),
            );
        }
    }
    batches
}

/// One process, one model, one batch per step: the reference.
pub(super) fn one_process(batches: &[Vec<i64>]) -> Vec<Step> {
    let data = data();
    let batches: Vec<(Tensor, Tensor)> =
        batches.iter().map(|b| (rows(&data.x, b), rows(&data.y, b))).collect(); // [B, 4], [B, 1] each
    train_single_process(|| Mlp::seeded(MODEL_SEED, SIZES, Kind::Double), Optim::Sgd, &batches)
}

/// Replicas bitwise equal after every step; returns rank 0's largest
/// difference from `reference`.
pub(super) fn replicas_match_and_differ_from(runs: &[RankRun], reference: &[Step]) -> f64 {
    assert_eq!(
        runs[0].after_each_step.len(),
        reference.len(),
        "every rank must take {} steps",
        reference.len()
    );
    let mut largest: f64 = 0.0;
    for (step, expected) in reference.iter().enumerate() {
        let per_rank: Vec<_> = runs.iter().map(|run| snapshot(&run.after_each_step[step])).collect();
        compare_replicas(&per_rank, 0.0).unwrap_or_else(|report| panic!("after step {}: {report}", step + 1));
        largest = largest.max(max_reference_diff(&per_rank[0], &expected.params));
    }
    largest
}

#[test]
fn the_whole_loop_on_2_and_3_ranks_equals_one_process_on_the_global_batch() {
    for world_size in [2, 3] {
        let runs = train_ddp(world_size, Sharding::Sampler);
        let reference = one_process(&global_batches(world_size, false));
        let largest = replicas_match_and_differ_from(&runs, &reference);
        let last = reference.len() - 1;
        compare_to_reference(&runs[0].after_each_step[last], &reference[last].params, TOLERANCE)
            .unwrap_or_else(|r| {
                let hint =
                    "each rank must train on its own shard: samples_per_rank and epoch_shard must give \
                        every rank an equal, strided part of the padded epoch order";
                panic!("{world_size} ranks, after the last step: {}", r.hint(hint))
            });
        assert!(largest <= TOLERANCE, "{world_size} ranks: a step was {largest:e} from one process");
        println!(
            "{world_size} ranks: largest difference from one process over {} steps: {largest:e}",
            last + 1
        );
        for (step, (&ddp_loss, one)) in
            runs[0].losses.iter().zip(reference.iter().map(|s| s.loss)).enumerate()
        {
            assert!(
                abs_diff_eq!(ddp_loss, one, epsilon = TOLERANCE),
                "step {step}: logged loss {ddp_loss} != global batch's {one}"
            );
        }
        // Rank 0 alone saved the trained model, and it loads into a plain, unwrapped one.
        assert!(runs[1..].iter().all(|run| run.checkpoint.is_none()), "only rank 0 may write the checkpoint");
        let path = runs[0].checkpoint.as_ref().expect("rank 0 saves a checkpoint");
        let (mut vs, _) = Mlp::seeded(MODEL_SEED + 1, SIZES, Kind::Double); // other weights, then overwritten
        vs.load(path).expect("the checkpoint loads into a model without the wrapper");
        let loaded = snapshot(&named_parameters(&vs));
        compare_replicas(&[snapshot(&runs[0].after_each_step[last]), loaded], 0.0)
            .unwrap_or_else(|report| panic!("the checkpoint is not the trained model: {report}"));
        for (rank, run) in runs.iter().enumerate() {
            assert_eq!(run.buckets, 4, "rank {rank}: the caps ({CAPS}) make 4 buckets of this model");
            // One per bucket, plus the small one at the end of backward in
            // which the ranks compare which parameters got a gradient.
            assert_eq!(
                run.all_reduces_per_step,
                vec![run.buckets as u64 + 1; reference.len()],
                "rank {rank}: one all-reduce per bucket per optimizer step, and one of the used-parameter \
                 masks (none in the no_sync micro-steps)"
            );
            assert_eq!(run.gradient_syncs, reference.len() as u64, "rank {rank}: one timed sync per step");
            assert!(run.sync_time > Duration::ZERO, "rank {rank}: the sync time must be measured");
        }
    }
}

#[test]
fn negative_control_without_set_epoch_every_epoch_repeats_the_same_order() {
    let with = train_ddp(2, Sharding::Sampler);
    let without = train_ddp(2, Sharding::NoSetEpoch);
    for rank in 0..2 {
        assert_ne!(with[rank].seen[0], with[rank].seen[1], "rank {rank}: with set_epoch the epochs differ");
        assert_eq!(
            without[rank].seen[0], without[rank].seen[1],
            "rank {rank}: without set_epoch they repeat"
        );
    }
    // The first epoch is the same either way; the second is not.
    let per_epoch = STEPS_PER_EPOCH;
    let first = max_reference_diff(
        &with[0].after_each_step[per_epoch - 1],
        &without[0].after_each_step[per_epoch - 1],
    );
    let last = max_reference_diff(
        &with[0].after_each_step[2 * per_epoch - 1],
        &without[0].after_each_step[2 * per_epoch - 1],
    );
    println!("without set_epoch: {first:e} apart after epoch 0, {last:e} after epoch 1");
    assert_eq!(first, 0.0, "epoch 0 must not depend on set_epoch");
    assert!(last > 1e6 * TOLERANCE, "epoch 1 must differ without set_epoch, got {last:e}");
}
