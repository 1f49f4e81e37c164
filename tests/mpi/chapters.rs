//! The chapters' DDP, unchanged, on real processes.
//! Each rank trains on its own rows of every global batch with the
//! chapter's wrapper (your exercise when built without `solutions`); after
//! every `optimizer.step` it checks both claims of the book: every process
//! holds bitwise the same parameters (all-gathered and compared), and they
//! equal one process trained on the whole global batch, within TOLERANCE.
//! The finished wrapper's buckets come from `alloc_buffer` and must be
//! all-reduced in place, in the node's shared memory.

use ddp_workbook::ch03_averaging::{self as ch03};
use ddp_workbook::ch04_accumulation::{self as ch04};
use ddp_workbook::ch05_bucketing::{self as ch05, BucketCaps, LocalBackward};
use ddp_workbook::ch07_sharding::{self as ch07, rows, DistributedSampler, SimpleDistributedDataParallelism};
use ddp_workbook::check::{compare_to_reference, snapshot};
use ddp_workbook::data::Regression;
use ddp_workbook::dist::{Group, ProcessGroup};
use ddp_workbook::models::Mlp;
use ddp_workbook::tch::nn::VarStore;
use ddp_workbook::tch::{Kind, Tensor};

use crate::common::{global_batches, mse, train_single_process, Optim, Step, TOLERANCE};
use crate::harness::on_ranks;

const SIZES: &[i64] = &[4, 16, 16, 1];
const MODEL_SEED: i64 = 3;
const DATA_SEED: i64 = 4;
/// Rows of one global batch: 12 = 2 ranks x 6 = 3 ranks x 4.
const GLOBAL_BATCH: i64 = 12;
const STEPS: usize = 4;
/// Small enough to give this model several buckets.
const CAPS: BucketCaps = BucketCaps { cap_bytes: 512, first_cap_bytes: 128 };

fn mlp() -> (VarStore, Mlp) {
    Mlp::seeded(MODEL_SEED, SIZES, Kind::Double)
}

fn data() -> Regression {
    Regression::new(DATA_SEED, GLOBAL_BATCH * STEPS as i64, 4, 1, Kind::Double)
}

fn reference(optim: Optim) -> Vec<Step> {
    train_single_process(mlp, optim, &global_batches(&data(), GLOBAL_BATCH, STEPS))
}

/// This rank's rows of global batch `step`: a contiguous slice.
fn my_rows(pg: &dyn ProcessGroup, step: usize) -> (Tensor, Tensor) {
    let rows = GLOBAL_BATCH / pg.world_size() as i64;
    data().batch(step as i64 * GLOBAL_BATCH + pg.rank() as i64 * rows, rows)
}

/// The book's two claims after step `step` (from 1), for `case`.
fn check(
    pg: &dyn ProcessGroup,
    case: &str,
    params: &[(String, Tensor)],
    expected: &Step,
    step: usize,
) -> anyhow::Result<()> {
    let flat = Tensor::cat(&params.iter().map(|(_, p)| p.detach().flatten(0, -1)).collect::<Vec<_>>(), 0);
    for (other, theirs) in pg.all_gather(&flat)?.iter().enumerate() {
        anyhow::ensure!(
            theirs.equal(&flat),
            "{case}, after step {step}: rank {other}'s parameters differ from rank {}'s",
            pg.rank()
        );
    }
    compare_to_reference(&snapshot(params), &expected.params, TOLERANCE)
        .map_err(|report| anyhow::anyhow!("{case}, rank {} after step {step}: {report}", pg.rank()))
}

fn chapter_3(pg: &Group, optim: Optim) -> anyhow::Result<()> {
    let (expected, (vs, model)) = (reference(optim), mlp());
    let mut optimizer = optim.build(&vs)?;
    let ddp = ch03::SimpleDistributedDataParallelism::new(model, &vs, pg.clone())?;
    for (step, expected) in expected.iter().enumerate() {
        let (x, y) = my_rows(pg.as_ref(), step);
        ch03::train_step(&ddp, &mut optimizer, &x, &y, mse)?;
        check(pg.as_ref(), &format!("chapter 3, {optim:?}"), ddp.parameters(), expected, step + 1)?;
    }
    Ok(())
}

fn chapter_4(pg: &Group) -> anyhow::Result<()> {
    let (expected, (vs, model)) = (reference(Optim::Adam), mlp());
    let mut optimizer = Optim::Adam.build(&vs)?;
    let ddp = ch04::SimpleDistributedDataParallelism::new(model, &vs, pg.clone())?;
    let k = if pg.world_size() == 2 { 3 } else { 2 }; // micro-batches of 2 rows
    for (step, expected) in expected.iter().enumerate() {
        let (x, y) = my_rows(pg.as_ref(), step);
        let micro: Vec<(Tensor, Tensor)> = x.chunk(k, 0).into_iter().zip(y.chunk(k, 0)).collect();
        ch04::learner::accumulate_and_step(&ddp, &mut optimizer, &micro, mse)?;
        check(pg.as_ref(), "chapter 4", ddp.parameters(), expected, step + 1)?;
    }
    Ok(())
}

fn chapter_5(pg: &Group) -> anyhow::Result<()> {
    let (expected, (vs, model)) = (reference(Optim::Adam), mlp());
    let mut optimizer = Optim::Adam.build(&vs)?;
    let ddp = ch05::SimpleDistributedDataParallelism::with_bucket_caps(model, &vs, pg.clone(), CAPS)?;
    anyhow::ensure!(ddp.buckets().len() > 2, "the test wants several buckets, got {}", ddp.buckets().len());
    for (step, expected) in expected.iter().enumerate() {
        let (x, y) = my_rows(pg.as_ref(), step);
        optimizer.zero_grad();
        ddp.backward_local(&mse(&ddp.forward(&x), &y))?;
        ddp.sync_gradients()?;
        optimizer.step();
        check(pg.as_ref(), "chapter 5", ddp.parameters(), expected, step + 1)?;
    }
    Ok(())
}

/// The finished wrapper, fed by your sampler: without shuffling, rank r's
/// shard is rows r, r + N, r + 2N, ..., so positions s*B/N.. of every
/// shard together are exactly global batch s.
fn chapter_7(pg: &Group) -> anyhow::Result<()> {
    let (expected, (vs, model), data) = (reference(Optim::Adam), mlp(), data());
    let mut optimizer = Optim::Adam.build(&vs)?;
    let ddp = SimpleDistributedDataParallelism::with_bucket_caps(model, &vs, pg.clone(), CAPS)?;
    let sampler = DistributedSampler::for_group(pg.as_ref(), GLOBAL_BATCH * STEPS as i64, false, 0, false)?;
    let shard = ch07::shard(&sampler);
    let rows_per_step = (GLOBAL_BATCH / pg.world_size() as i64) as usize;
    let in_place_before = ddp_workbook::dist::mpi::zero_copy_all_reduces();
    for (step, expected) in expected.iter().enumerate() {
        let mine = &shard[step * rows_per_step..(step + 1) * rows_per_step];
        let micro: Vec<&[i64]> = mine.chunks(rows_per_step / 2).collect();
        ch07::train_step(&ddp, &mut optimizer, &micro, |idx| {
            mse(&ddp.forward(&rows(&data.x, idx)), &rows(&data.y, idx))
        })?;
        check(pg.as_ref(), "chapter 7", ddp.parameters(), expected, step + 1)?;
    }
    // Its buckets come from alloc_buffer: every one summed in place, every step.
    let (in_place, buckets) =
        (ddp_workbook::dist::mpi::zero_copy_all_reduces() - in_place_before, ddp.buckets().len());
    anyhow::ensure!(
        in_place >= (STEPS * buckets) as u64,
        "{in_place} all-reduces went in place in shared memory; want at least {STEPS} steps x {buckets} buckets"
    );
    Ok(())
}

fn all_chapters(pg: Group) -> anyhow::Result<()> {
    chapter_3(&pg, Optim::Sgd)?;
    chapter_3(&pg, Optim::Adam)?;
    chapter_4(&pg)?;
    chapter_5(&pg)?;
    chapter_7(&pg)
}

#[test]
fn chapters_3_to_6_on_2_processes_equal_one_process_on_the_global_batch() {
    on_ranks(
        2,
        "chapters::chapters_3_to_6_on_2_processes_equal_one_process_on_the_global_batch",
        all_chapters,
    );
}

#[test]
fn chapters_3_to_6_on_3_processes_equal_one_process_on_the_global_batch() {
    on_ranks(
        3,
        "chapters::chapters_3_to_6_on_3_processes_equal_one_process_on_the_global_batch",
        all_chapters,
    );
}
