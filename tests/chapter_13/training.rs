//! Chapter 13 tests, part 2: `ShardGradOp` with your functions, trained.
//! Compiled into `cargo test --test chapter_13` (see `tests/chapter_13.rs`).
//!
//! Every rank trains the same f64 MLP on its own rows of each global batch.
//! Two references, computed other ways: the workbook's DDP with the
//! training run's AdamW on every rank (ZeRO-2 must take its steps bit for
//! bit: the same sum, division and AdamW on every element), and one process
//! with that AdamW on the whole global batch (within `TOLERANCE`).

use ddp_workbook::ch13_sharded_gradients::{BucketCaps, ShardGradOp};
use ddp_workbook::check::{compare_replicas, max_reference_diff, snapshot};
use ddp_workbook::data::Regression;
use ddp_workbook::ddp::{self, SimpleDistributedDataParallelism};
use ddp_workbook::dist::Group;
use ddp_workbook::models::{named_parameters, Mlp};
use ddp_workbook::tch::nn::Module;
use ddp_workbook::tch::Kind;
use ddp_workbook::train::AdamW;

use crate::common::{mse, run, Named, TOLERANCE};

pub(super) const SIZES: &[i64] = &[4, 5, 3, 1]; // 47 parameters
pub(super) const LR: f64 = 0.01;
pub(super) const WEIGHT_DECAY: f64 = 0.1;
pub(super) const STEPS: usize = 3;
const ROWS: i64 = 2;
/// Buckets of 4, 18 and 25 f64 elements: padding on 2 and 3 ranks.
pub(super) const CAPS: BucketCaps = BucketCaps { cap_bytes: 256, first_cap_bytes: 64 };
/// Every parameter its own bucket: the last bias is 1 element, fewer than the ranks.
pub(super) const ONE_EACH: BucketCaps = BucketCaps { cap_bytes: 8, first_cap_bytes: 8 };

fn data() -> Regression {
    Regression::new(13, 256, 4, 1, Kind::Double)
}

/// First row of rank `rank`'s micro-batch `m` of step `s`.
fn start(world: usize, micro: i64, s: usize, rank: usize, m: i64) -> i64 {
    (s as i64 * world as i64 + rank as i64) * micro * ROWS + m * ROWS
}

/// Which ZeRO-2 runs: yours (the chapter's wrapper) or the library's.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Whose {
    Yours,
    Library,
}

/// ZeRO-2's parameters after every step, per rank.
pub(super) fn train_zero2(whose: Whose, world: usize, caps: BucketCaps, micro: i64) -> Vec<Vec<Named>> {
    run(world, |pg: Group| {
        let data = data();
        let (vs, module) = Mlp::seeded(21, SIZES, Kind::Double);
        let mut yours;
        let mut library;
        let model: &mut ddp::ShardGradOp<Mlp> = if whose == Whose::Yours {
            yours = ShardGradOp::new(module, &vs, pg.clone(), caps, LR, WEIGHT_DECAY)?;
            &mut yours
        } else {
            library = ddp::ShardGradOp::new(module, &vs, pg.clone(), caps, LR, WEIGHT_DECAY)?;
            &mut library
        };
        let mut after = vec![];
        for s in 0..STEPS {
            model.zero_grad()?;
            for m in 0..micro {
                let (x, y) = data.batch(start(world, micro, s, pg.rank(), m), ROWS);
                let loss = mse(&model.forward(&x), &y) / micro as f64;
                if m + 1 < micro {
                    let _no_sync = model.no_sync(); // the full gradients stay, summed
                    model.backward(&loss)?;
                } else {
                    model.backward(&loss)?; // reduce-scatters, bucket by bucket
                }
            }
            model.step()?;
            after.push(snapshot(model.parameters()));
        }
        Ok(after)
    })
}

/// The workbook's DDP with the training run's AdamW: rank 0's parameters after every step.
pub(super) fn train_ddp(world: usize, caps: BucketCaps, micro: i64) -> Vec<Named> {
    let per_rank = run(world, |pg: Group| {
        let data = data();
        let (vs, module) = Mlp::seeded(21, SIZES, Kind::Double);
        let model = SimpleDistributedDataParallelism::with_bucket_caps(module, &vs, pg.clone(), caps)?;
        let mut optimizer = AdamW::new(model.parameters(), LR, WEIGHT_DECAY);
        let mut after = vec![];
        for s in 0..STEPS {
            optimizer.zero_grad();
            for m in 0..micro {
                let (x, y) = data.batch(start(world, micro, s, pg.rank(), m), ROWS);
                let loss = mse(&model.forward(&x), &y) / micro as f64;
                if m + 1 < micro {
                    let _no_sync = model.no_sync();
                    model.backward(&loss)?;
                } else {
                    model.backward(&loss)?;
                }
            }
            model.optimizer_step(&mut optimizer)?;
            after.push(snapshot(model.parameters()));
        }
        Ok(after)
    });
    per_rank.into_iter().next().expect("rank 0")
}

/// One process, AdamW, the whole global batch per step.
pub(super) fn one_process(world: usize, micro: i64) -> Vec<Named> {
    let data = data();
    let (vs, model) = Mlp::seeded(21, SIZES, Kind::Double);
    let mut optimizer = AdamW::new(&named_parameters(&vs), LR, WEIGHT_DECAY);
    let global = world as i64 * micro * ROWS;
    let mut after = vec![];
    for s in 0..STEPS {
        optimizer.zero_grad();
        let (x, y) = data.batch(s as i64 * global, global);
        mse(&model.forward(&x), &y).backward();
        optimizer.step().expect("AdamW steps");
        after.push(snapshot(&named_parameters(&vs)));
    }
    after
}

/// Fails unless after every step the ranks agree, equal DDP bit for bit
/// and one process within `TOLERANCE`. Returns the distance to one process.
pub(super) fn assert_ddps_steps(case: &str, zero2: &[Vec<Named>], ddp: &[Named], one: &[Named]) -> f64 {
    let mut largest: f64 = 0.0;
    for s in 0..STEPS {
        let ranks: Vec<Named> = zero2.iter().map(|r| snapshot(&r[s])).collect();
        if let Err(report) = compare_replicas(&ranks, 0.0) {
            let hint = "the ranks' parameters differ: does every rank keep its own chunk (the one the \
                        reduce-scatter leaves on it)?";
            panic!("{case}, step {}: {}", s + 1, report.hint(hint));
        }
        let from_ddp = max_reference_diff(&ranks[0], &ddp[s]);
        assert!(
            from_ddp == 0.0,
            "{case}, step {}: ZeRO-2 differs from DDP by {from_ddp:e} (tolerance 0): the shard each rank \
             keeps must hold DDP's bits, the ranks' sum divided by the world size as DDP divides. The \
             `buckets` tests check one bucket alone on 3 ranks (run them first); if they pass, look at \
             what this case adds: several buckets, a bucket smaller than the world, accumulation",
            s + 1
        );
        largest = largest.max(max_reference_diff(&ranks[0], &one[s]));
        assert!(largest <= TOLERANCE, "{case}, step {}: {largest:e} from one process", s + 1);
    }
    largest
}

#[test]
fn your_zero2_takes_ddps_steps_bit_for_bit_on_2_and_3_ranks() {
    for world in [2, 3] {
        for (caps, what) in [(CAPS, "3 padded buckets"), (ONE_EACH, "a bucket smaller than the world")] {
            let case = format!("{world} ranks, {what}");
            let zero2 = train_zero2(Whose::Yours, world, caps, 1);
            let one = assert_ddps_steps(&case, &zero2, &train_ddp(world, caps, 1), &one_process(world, 1));
            println!("{case}: bitwise DDP's, {one:e} from one process");
        }
    }
}

#[test]
fn your_zero2_accumulates_under_no_sync_and_takes_ddps_steps() {
    for world in [2, 3] {
        let case = format!("{world} ranks, 3 micro-batches");
        let zero2 = train_zero2(Whose::Yours, world, CAPS, 3);
        assert_ddps_steps(&case, &zero2, &train_ddp(world, CAPS, 3), &one_process(world, 3));
    }
}

#[test]
fn your_zero2_holds_less_gradient_than_ddp() {
    // Ten layers of 272 elements, a bucket each.
    const DEEP: &[i64] = &[16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 1];
    let caps = BucketCaps { cap_bytes: 272 * 8, first_cap_bytes: 272 * 8 };
    for world in [2, 3, 4] {
        let got = run(world, |pg: Group| {
            let (vs, module) = Mlp::seeded(21, DEEP, Kind::Double);
            let full: usize = named_parameters(&vs).iter().map(|(_, p)| p.numel() * 8).sum();
            let mut model = ShardGradOp::new(module, &vs, pg.clone(), caps, LR, WEIGHT_DECAY)?;
            let data = Regression::new(13, 64, 16, 1, Kind::Double);
            let (x, y) = data.batch(2 * pg.rank() as i64, 2);
            let ledger = model.ledger();
            ledger.reset_peak();
            model.backward(&mse(&model.forward(&x), &y))?;
            let peak = ledger.peak_by_kind().gradients;
            let shards: usize = model.shards().iter().map(|s| s.len * 8).sum();
            model.step()?;
            Ok((full, peak, shards))
        });
        let (full, peak, shards) = got[0];
        println!(
            "{world} ranks: gradient bytes at their peak {peak}, shards {shards}, DDP's full gradient {full}"
        );
        assert!(
            peak >= shards,
            "{world} ranks: the peak {peak} is below the shards {shards} this rank keeps"
        );
        assert!(
            peak < full,
            "{world} ranks: ZeRO-2 held {peak} bytes of gradients at once, DDP's full gradient is {full}: \
             let each member's gradient go as soon as its bucket's buffer holds it, and the buffer as \
             soon as the reduce-scatter is done"
        );
    }
}
