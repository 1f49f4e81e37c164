//! Chapter 11 tests, part 3: `ShardedAdamW` trained on 2, 3 and 4 ranks.
//! Compiled into `cargo test --test chapter_11` (see `tests/chapter_11.rs`).
//!
//! Every rank trains the same f64 MLP on its own rows of each global batch;
//! the buckets (4, 18 and 25 elements) do not all divide by any of the world
//! sizes, so the padding is exercised. Two references, computed other ways:
//! plain DDP (the library's wrapper, which all-reduces, and the training
//! run's `AdamW` on every rank) and one process with that `AdamW` on the
//! whole global batch. ZeRO-1 changes where the optimizer's arithmetic runs,
//! not what it computes: after every step it must equal DDP bit for bit (the
//! same sum, division and AdamW on every element) and one process within
//! `TOLERANCE` (the order of the additions differs there). When it does not,
//! the message quotes what `step_bucket.rs`'s one-bucket test finds. The
//! bytes each rank hands to collectives are noted call by call by a group
//! around the library's, and compared with sizes worked out by hand.

use ddp_workbook::ch11_zero::{AdamW, BucketCaps, Replicated, ShardedAdamW};
use ddp_workbook::check::{compare_replicas, compare_to_reference, snapshot};
use ddp_workbook::data::Regression;
use ddp_workbook::ddp;
use ddp_workbook::dist::{CommStats, Group};
use ddp_workbook::models::{named_parameters, Mlp};
use ddp_workbook::tch::{Kind, Tensor};

use super::step_bucket::likely_cause;
use crate::common::counting::{counted, ring_bytes, Call};
use crate::common::{assert_matches_one_process, mse, run, Hints, Named, Step, TOLERANCE};

pub(super) const SIZES: &[i64] = &[4, 5, 3, 1]; // 47 parameters
const MODEL_SEED: i64 = 31;
const DATA_SEED: i64 = 32;
const ROWS_PER_RANK: i64 = 2;
pub(super) const STEPS: usize = 4;
pub(super) const LR: f64 = 0.01;
pub(super) const WEIGHT_DECAY: f64 = 0.1;
/// With f64 parameters: buckets of 4, 18 and 25 elements (the last layer's
/// weight and bias first), in that order.
pub(super) const CAPS: BucketCaps = BucketCaps { cap_bytes: 256, first_cap_bytes: 64 };
pub(super) const BUCKET_NUMELS: [usize; 3] = [4, 18, 25];
const F64_BYTES: usize = 8;

/// One rank's record of a run.
pub(super) struct RankRun {
    pub(super) after_each_step: Vec<Named>,
    /// Bytes of AdamW moments this rank holds.
    pub(super) moment_bytes: usize,
    /// What this rank handed to collectives during each step's sync (DDP:
    /// its backward; ZeRO: its optimizer step), as the library counts it.
    pub(super) sync_stats: Vec<CommStats>,
    /// The same sync, call by call, as a group around the library's saw it.
    pub(super) sync_calls: Vec<Vec<Call>>,
}

fn data() -> Regression {
    Regression::new(DATA_SEED, 4 * ROWS_PER_RANK * STEPS as i64, 4, 1, Kind::Double)
}

/// Rank `rank`'s rows of global batch `step`.
fn rank_batch(data: &Regression, world_size: usize, step: usize, rank: usize) -> (Tensor, Tensor) {
    let global = ROWS_PER_RANK * world_size as i64;
    data.batch(step as i64 * global + rank as i64 * ROWS_PER_RANK, ROWS_PER_RANK)
}

fn delta(after: CommStats, before: &CommStats) -> CommStats {
    CommStats {
        all_reduce: after.all_reduce - before.all_reduce,
        all_gather: after.all_gather - before.all_gather,
        reduce_scatter: after.reduce_scatter - before.reduce_scatter,
        collective_bytes: after.collective_bytes - before.collective_bytes,
        ..CommStats::default()
    }
}

/// ZeRO-1: the library's replicated model, YOUR shards and step.
pub(super) fn train_zero(world_size: usize) -> Vec<RankRun> {
    run(world_size, |pg: Group| {
        let data = data();
        let (vs, module) = Mlp::seeded(MODEL_SEED, SIZES, Kind::Double);
        let model = Replicated::new(module, &vs, pg.clone())?;
        let (group, calls) = counted(&pg);
        let mut optimizer = ShardedAdamW::new(model.parameters(), group, CAPS, LR, WEIGHT_DECAY)?;
        let numels: Vec<usize> = optimizer.buckets().iter().map(|b| b.numel).collect();
        anyhow::ensure!(
            numels == BUCKET_NUMELS,
            "the test expects buckets of {BUCKET_NUMELS:?}, got {numels:?}"
        );
        let (mut after_each_step, mut sync_stats, mut sync_calls) = (vec![], vec![], vec![]);
        for step in 0..STEPS {
            optimizer.zero_grad();
            let (x, y) = rank_batch(&data, world_size, step, pg.rank());
            mse(&model.forward(&x), &y).backward(); // this rank's gradients only
            let before = pg.stats();
            calls.take();
            optimizer.step()?;
            sync_calls.push(calls.take());
            sync_stats.push(delta(pg.stats(), &before));
            after_each_step.push(snapshot(model.parameters()));
        }
        Ok(RankRun { after_each_step, moment_bytes: optimizer.moment_bytes(), sync_stats, sync_calls })
    })
}

/// Plain DDP: the library's wrapper and the training run's AdamW.
pub(super) fn train_ddp(world_size: usize) -> Vec<RankRun> {
    run(world_size, |pg: Group| {
        let data = data();
        let (vs, module) = Mlp::seeded(MODEL_SEED, SIZES, Kind::Double);
        let (group, calls) = counted(&pg);
        let model = ddp::SimpleDistributedDataParallelism::with_bucket_caps(module, &vs, group, CAPS)?;
        let mut optimizer = AdamW::new(model.parameters(), LR, WEIGHT_DECAY);
        let (mut after_each_step, mut sync_stats, mut sync_calls) = (vec![], vec![], vec![]);
        for step in 0..STEPS {
            optimizer.zero_grad();
            let (x, y) = rank_batch(&data, world_size, step, pg.rank());
            let before = pg.stats();
            calls.take();
            model.backward(&mse(&model.forward(&x), &y))?; // all-reduces the gradients
            sync_calls.push(calls.take());
            sync_stats.push(delta(pg.stats(), &before));
            optimizer.step()?;
            after_each_step.push(snapshot(model.parameters()));
        }
        let moments = optimizer.state().into_iter().filter(|(name, _)| name.starts_with("exp_avg"));
        let moment_bytes = moments.map(|(_, t)| t.numel() * t.kind().elt_size_in_bytes()).sum();
        Ok(RankRun { after_each_step, moment_bytes, sync_stats, sync_calls })
    })
}

/// One process, the training run's AdamW, the whole global batch per step.
pub(super) fn one_process(world_size: usize) -> Vec<Step> {
    as_steps(adamw_one_process(MODEL_SEED, &data(), ROWS_PER_RANK * world_size as i64, STEPS))
}

/// The MLP of `model_seed` trained in one process with the training run's
/// AdamW, on global batch s = rows `s * global_rows ..` of `data` at step s:
/// its parameters after each of `steps` steps.
pub(super) fn adamw_one_process(
    model_seed: i64,
    data: &Regression,
    global_rows: i64,
    steps: usize,
) -> Vec<Named> {
    let (vs, model) = Mlp::seeded(model_seed, SIZES, Kind::Double);
    let mut optimizer = AdamW::new(&named_parameters(&vs), LR, WEIGHT_DECAY);
    let mut after = vec![];
    for step in 0..steps {
        optimizer.zero_grad();
        let (x, y) = data.batch(step as i64 * global_rows, global_rows);
        mse(&ddp_workbook::tch::nn::Module::forward(&model, &x), &y).backward();
        optimizer.step().expect("AdamW steps");
        after.push(snapshot(&named_parameters(&vs)));
    }
    after
}

/// One process's parameters after every step, as `assert_matches_one_process` takes them.
fn as_steps(after_each_step: Vec<Named>) -> Vec<Step> {
    after_each_step
        .into_iter()
        .map(|params| Step { params, grads: vec![], loss: 0.0, all_reduces: 0 })
        .collect()
}

/// Where to look when step_bucket's own test passes but a run fails.
pub(super) const CHECK_SHARD_OF: &str = "check shard_of: rank r's shard must be the r-th of the N \
     equal chunks that reduce_scatter leaves on rank r (the `shards` tests)";

/// Fails, naming the first parameter that differs and the likely cause,
/// unless after every step every rank's parameters are bitwise rank 0's and
/// rank 0's bitwise plain DDP's.
fn assert_bitwise_plain_ddp(world_size: usize, zero: &[RankRun], ddp: &RankRun) {
    for (s, expected) in ddp.after_each_step.iter().enumerate() {
        let after: Vec<Named> = zero.iter().map(|rank| snapshot(&rank.after_each_step[s])).collect();
        let (what, report) = match compare_replicas(&after, 0.0) {
            Err(report) => ("every rank's parameters vs rank 0's", report),
            Ok(()) => match compare_to_reference(&after[0], expected, 0.0) {
                Err(report) => ("ZeRO-1 vs plain DDP", report),
                Ok(()) => continue,
            },
        };
        let first = &report.differences[0];
        let place = first.rank.map_or(String::new(), |rank| format!("rank {rank}'s "));
        panic!(
            "{what} on {world_size} ranks, after step {}: {place}`{}` differs by {:e} (tolerance 0: \
             ZeRO-1 must take DDP's steps bit for bit, the same sum, division and AdamW on every \
             element). Likely: {}",
            s + 1,
            first.parameter,
            report.largest_difference(),
            likely_cause(CHECK_SHARD_OF)
        );
    }
}

const HINTS: Hints = Hints {
    replicas: "the ranks' parameters differ after the step: does every rank copy every rank's \
               updated shard back, in rank order, into its whole bucket?",
    reference: "ZeRO-1 took plain DDP's steps but not one process's: the DDP run itself is off \
                (see the control plain_ddp_with_adamw_matches_one_process)",
};

#[test]
fn zero_takes_the_steps_of_plain_ddp_and_of_one_process_on_2_3_and_4_ranks() {
    for world_size in [2, 3, 4] {
        assert!(BUCKET_NUMELS.iter().any(|n| n % world_size != 0), "a bucket must need padding");
        let (zero, ddp_run) = (train_zero(world_size), train_ddp(world_size));
        assert_bitwise_plain_ddp(world_size, &zero, &ddp_run[0]);
        let zero: Vec<Vec<Named>> = zero.into_iter().map(|r| r.after_each_step).collect();
        let reference = one_process(world_size);
        let case = "ZeRO-1 vs one process on the global batch";
        let from_one = assert_matches_one_process(case, &zero, &reference, TOLERANCE, &HINTS);
        println!(
            "{world_size} ranks, {STEPS} AdamW steps: ZeRO-1 vs plain DDP largest difference 0 (tolerance 0), \
             vs one process on the global batch {from_one:e} (tolerance {TOLERANCE:e})"
        );
    }
}

#[test]
fn each_rank_keeps_a_world_size_th_of_the_moments() {
    for world_size in [2, 3, 4] {
        let (zero, ddp_run) = (train_zero(world_size), train_ddp(world_size));
        let ddp_bytes = ddp_run[0].moment_bytes;
        assert_eq!(
            ddp_bytes,
            2 * 47 * F64_BYTES,
            "DDP keeps both moments of all 47 parameters on every rank"
        );
        // Per bucket, two moments of ceil(numel / N) elements each.
        let shard_numels: usize = BUCKET_NUMELS.iter().map(|n| n.div_ceil(world_size)).sum();
        for (rank, run) in zero.iter().enumerate() {
            assert_eq!(
                run.moment_bytes,
                2 * shard_numels * F64_BYTES,
                "rank {rank} of {world_size} keeps the moments of more than its shards"
            );
        }
        let ratio = zero[0].moment_bytes as f64 / ddp_bytes as f64;
        println!(
            "{world_size} ranks: AdamW moments per rank {ddp_bytes} B with DDP, {} B with ZeRO-1 \
             ({ratio:.3} of DDP's; 1/{world_size} = {:.3}, the rest is padding)",
            zero[0].moment_bytes,
            1.0 / world_size as f64
        );
    }
}

#[test]
fn each_rank_hands_collectives_the_bytes_of_ddp_all_reduce_on_the_wire() {
    for world_size in [2, 3, 4] {
        let (zero, ddp_run) = (train_zero(world_size), train_ddp(world_size));
        // Worked out by hand: bucket b is padded to ceil(b / N) * N elements;
        // a step reduce-scatters the padded buffer, then all-gathers one
        // shard of it, bucket by bucket. DDP all-reduces each bucket's
        // gradients as they are, then a few flags, the library's
        // end-of-backward check (not part of the sync).
        let zero_calls: Vec<Call> = BUCKET_NUMELS
            .iter()
            .flat_map(|&numel| {
                let padded = numel.div_ceil(world_size) * world_size;
                [("reduce_scatter", padded * F64_BYTES), ("all_gather", padded / world_size * F64_BYTES)]
            })
            .collect();
        let ddp_grad_calls: Vec<Call> =
            BUCKET_NUMELS.iter().map(|&numel| ("all_reduce", numel * F64_BYTES)).collect();
        let zero_bytes: usize = zero_calls.iter().map(|(_, bytes)| bytes).sum();
        let buckets = BUCKET_NUMELS.len() as u64;
        for step in 0..STEPS {
            for (rank, run) in zero.iter().enumerate() {
                let calls = &run.sync_calls[step];
                assert_eq!(
                    calls, &zero_calls,
                    "rank {rank}, step {step}: ZeRO-1's collective calls (op, bytes handed over)"
                );
                // The library's own count must agree with the one made around it.
                let stats = &run.sync_stats[step];
                assert_eq!(
                    (stats.all_reduce, stats.reduce_scatter, stats.all_gather, stats.collective_bytes),
                    (0, buckets, buckets, zero_bytes as u64),
                    "rank {rank}, step {step}: the process group's stats() disagree with the calls it was handed"
                );
            }
            let ddp_calls = &ddp_run[0].sync_calls[step];
            assert!(
                ddp_calls.len() == BUCKET_NUMELS.len() + 1
                    && ddp_calls[..BUCKET_NUMELS.len()] == ddp_grad_calls,
                "step {step}: DDP's calls {ddp_calls:?}, expected {ddp_grad_calls:?} and its check"
            );
        }
        let (z, d) = (&zero[0].sync_calls[0], &ddp_run[0].sync_calls[0]);
        let ddp_grads: usize = ddp_grad_calls.iter().map(|(_, bytes)| bytes).sum();
        let ddp_check: usize = d.iter().map(|(_, bytes)| bytes).sum::<usize>() - ddp_grads;
        let padded_bytes = zero_bytes * world_size / (world_size + 1);
        let (ddp_wire, zero_wire) = (ring_bytes(&ddp_grad_calls, world_size), ring_bytes(z, world_size));
        let padding_wire = ring_bytes(&[("all_reduce", padded_bytes - ddp_grads)], world_size);
        println!(
            "{world_size} ranks, per rank and step: DDP hands {ddp_grads} B of gradients to all-reduce \
             ({ddp_wire:.0} B on a ring; plus {ddp_check} B of its end-of-backward check); ZeRO-1 \
             hands {zero_bytes} B to reduce-scatter + all-gather ({zero_wire:.0} B on a ring, {padding_wire:.0} B \
             of it padding)"
        );
    }
}

#[test]
fn a_parameter_without_a_gradient_is_a_clear_error() {
    let errors = run(2, |pg: Group| {
        let (vs, module) = crate::common::mlp_with_an_unused_parameter(MODEL_SEED, SIZES);
        let model = Replicated::new(module, &vs, pg.clone())?;
        let mut optimizer = ShardedAdamW::new(model.parameters(), pg.clone(), CAPS, LR, WEIGHT_DECAY)?;
        let (x, y) = rank_batch(&data(), 2, 0, pg.rank());
        mse(&model.forward(&x), &y).backward();
        Ok(optimizer.step().expect_err("a step without the gradient of `unused`").to_string())
    });
    for error in errors {
        assert!(error.contains("`unused` has no gradient"), "unclear error: {error}");
    }
}
