//! Chapter 05 tests, shared part: the models, the data, and a training loop
//! that syncs the gradients one of five ways (bucketed, naive, not at all,
//! broken, bucketed after accumulating under `no_sync`) and records what
//! every rank did at every step.
//!
//! Compiled into `cargo test --test chapter_05` (see `tests/chapter_05.rs`).

use ddp_workbook::ch05_bucketing::{BucketCaps, LocalBackward, SimpleDistributedDataParallelism};
use ddp_workbook::check::{compare_replicas, compare_to_reference, snapshot};
use ddp_workbook::data::Regression;
use ddp_workbook::ddp::naive;
use ddp_workbook::dist::{DistError, ReduceOp};
use ddp_workbook::models::Mlp;
use ddp_workbook::tch::nn::{Module, VarStore};
use ddp_workbook::tch::{Device, Kind, Tensor};
use ddp_workbook::with_seed;

use crate::common::{global_batches, mlp_with_an_unused_parameter, mse, run, train_single_process, Named};

pub use crate::common::{Optim, Step, TOLERANCE};

pub const SIZES: &[i64] = &[4, 16, 16, 1];
/// The parameters of the MLP from its last registered to its first: the
/// order in which backward produces their gradients.
/// (tch's `nn::linear` registers a layer's bias before its weight.)
pub const REVERSED_MLP: [&str; 6] = [
    "layers.2.weight",
    "layers.2.bias",
    "layers.1.weight",
    "layers.1.bias",
    "layers.0.weight",
    "layers.0.bias",
];
/// Small enough to cut the 2.8 KiB MLP into four buckets.
pub const TINY_CAPS: BucketCaps = BucketCaps { cap_bytes: 1024, first_cap_bytes: 128 };
const MODEL_SEED: i64 = 5;
const DATA_SEED: i64 = 6;
/// Rows of one global batch: divisible by every world size we test (1 to 4).
pub const GLOBAL_BATCH: i64 = 12;
pub const STEPS: usize = 4;

pub const HINT_REPLICAS: &str =
    "every rank must call sync_gradients, and sync_bucket must copy the averaged \
    buffer back into every gradient that exists";
pub const HINT_MEAN: &str = "sync_bucket must all-reduce with SUM and divide by the world size exactly once";
pub const HINT_BITWISE: &str = "your sync_bucket must give exactly the naive sync's gradients, bit for bit: \
    check the offsets (each slot starts where the previous one ends, in `bucket.params` order), that every \
    slot is copied back into its own parameter's gradient, and that you divide once, after the all-reduce, as \
    the naive sync does (a division before it rounds differently in the last bit)";

/// How the training loop synchronises the gradients.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Sync {
    /// This chapter's `sync_gradients`: one all-reduce per bucket.
    Bucketed,
    /// The library's per-parameter sync (`ddp::naive`, chapter 3's
    /// exercise as the library does it): one all-reduce per parameter.
    Naive,
    /// Negative control: no communication at all.
    None,
    /// Negative control: one all-reduce per bucket, of the right size, with
    /// none of the gradients in it.
    EmptyBuckets,
    /// Two micro-batches per step through the wrapper's `backward`, the
    /// first inside `no_sync` (chapter 4's switch, kept by this stage).
    Accumulated,
}

pub fn mlp() -> (VarStore, Mlp) {
    Mlp::seeded(MODEL_SEED, SIZES, Kind::Double)
}

/// The MLP plus a trainable parameter `unused` that the loss never touches.
pub fn mlp_with_unused() -> (VarStore, Mlp) {
    mlp_with_an_unused_parameter(MODEL_SEED, SIZES)
}

/// A small network with parameters of two dtypes, registered interleaved:
/// input_scale (f32), hidden.weight and hidden.bias (f64), output.weight and
/// output.bias (f32).
#[derive(Debug)]
pub struct Mixed {
    input_scale: Tensor,
    hidden_weight: Tensor,
    hidden_bias: Tensor,
    output_weight: Tensor,
    output_bias: Tensor,
}

pub fn mixed() -> (VarStore, Mixed) {
    with_seed(MODEL_SEED, || {
        let vs = VarStore::new(Device::Cpu);
        let root = vs.root();
        let randn = |shape: &[i64], kind: Kind| Tensor::randn(shape, (kind, Device::Cpu)) * 0.5;
        let model = Mixed {
            input_scale: root.add("input_scale", randn(&[4], Kind::Float) + 1.0, true),
            hidden_weight: (&root / "hidden").add("weight", randn(&[8, 4], Kind::Double), true),
            hidden_bias: (&root / "hidden").add("bias", randn(&[8], Kind::Double), true),
            output_weight: (&root / "output").add("weight", randn(&[1, 8], Kind::Float), true),
            output_bias: (&root / "output").add("bias", randn(&[1], Kind::Float), true),
        };
        (vs, model)
    })
}

impl Module for Mixed {
    fn forward(&self, xs: &Tensor) -> Tensor {
        let scaled = (xs.to_kind(Kind::Float) * &self.input_scale).to_kind(Kind::Double); // [batch, 4]
        let hidden = (scaled.matmul(&self.hidden_weight.tr()) + &self.hidden_bias).tanh(); // [batch, 8]
        let out = hidden.to_kind(Kind::Float).matmul(&self.output_weight.tr()) + &self.output_bias; // [batch, 1]
        out.to_kind(Kind::Double)
    }
}

pub fn data() -> Regression {
    Regression::new(DATA_SEED, GLOBAL_BATCH * STEPS as i64, 4, 1, Kind::Double)
}

/// One rank's record of a run.
#[derive(Default)]
pub struct RankRun {
    /// The bucket layout, as names.
    pub buckets: Vec<Vec<String>>,
    /// Every parameter after each `optimizer.step()`.
    pub after_each_step: Vec<Named>,
    /// Per step: all-reduce calls, all collective calls, and bytes handed to them.
    pub all_reduces: Vec<u64>,
    pub collectives: Vec<u64>,
    pub bytes: Vec<u64>,
    /// Per step, if the model has a parameter `unused`: whether it had a
    /// gradient after the sync.
    pub unused_grad_defined: Vec<bool>,
}

/// Trains on `world_size` ranks for STEPS steps, each rank on its own slice
/// of every global batch, syncing the gradients the `sync` way.
pub fn train<M: Module>(
    world_size: usize,
    optim: Optim,
    sync: Sync,
    caps: BucketCaps,
    build: fn() -> (VarStore, M),
) -> Vec<RankRun> {
    run(world_size, |pg| {
        let (rank, data) = (pg.rank() as i64, data());
        let (vs, model) = build();
        let mut optimizer = optim.build(&vs)?;
        let ddp = SimpleDistributedDataParallelism::with_bucket_caps(model, &vs, pg, caps)?;
        let mut run = RankRun { buckets: ddp.bucket_names(), ..RankRun::default() };
        for step in 0..STEPS as i64 {
            let before = ddp.stats();
            let rows = GLOBAL_BATCH / world_size as i64; // every rank gets as many rows
            let (x, y) = data.batch(step * GLOBAL_BATCH + rank * rows, rows); // [rows, 4], [rows, 1]
            optimizer.zero_grad();
            if sync == Sync::Accumulated {
                let (halves_x, halves_y) = (x.chunk(2, 0), y.chunk(2, 0)); // 2 x [rows / 2, ..]
                {
                    let _no_sync = ddp.no_sync(); // accumulates, sends nothing
                    ddp.backward(&(mse(&ddp.forward(&halves_x[0]), &halves_y[0]) / 2.0))?;
                }
                ddp.backward(&(mse(&ddp.forward(&halves_x[1]), &halves_y[1]) / 2.0))?;
            // syncs the sums
            } else {
                ddp.backward_local(&mse(&ddp.forward(&x), &y))?;
            }
            match sync {
                Sync::Bucketed => ddp.sync_gradients()?, // one all-reduce per bucket
                Sync::Naive => naive::sync_gradients(ddp.process_group().as_ref(), ddp.parameters())?,
                Sync::None => {}
                Sync::EmptyBuckets => sync_empty_buckets(&ddp)?,
                Sync::Accumulated => {} // `backward` synced already
            }
            optimizer.step();
            let after = ddp.stats();
            run.all_reduces.push(after.all_reduce - before.all_reduce);
            run.collectives.push(after.collectives() - before.collectives());
            run.bytes.push(after.collective_bytes - before.collective_bytes);
            if let Some((_, unused)) = ddp.parameters().iter().find(|(name, _)| name == "unused") {
                run.unused_grad_defined.push(unused.grad().defined());
            }
            run.after_each_step.push(snapshot(ddp.parameters()));
        }
        Ok(run)
    })
}

/// A broken bucketed sync for the negative control: per bucket one
/// all-reduce of the bucket's size, dtype and device, which carries none of
/// the gradients, so every rank steps with its own, local gradients (what a
/// sync that never fills its buffers, or never copies them back, leaves).
fn sync_empty_buckets<M: Module>(ddp: &SimpleDistributedDataParallelism<M>) -> Result<(), DistError> {
    for bucket in ddp.buckets() {
        let mut empty = Tensor::zeros([bucket.numel as i64], (bucket.kind, bucket.device)); // [numel]
        ddp.process_group().all_reduce(&mut empty, ReduceOp::Sum)?;
    }
    Ok(())
}

/// One process, one model, the whole global batch of every step.
pub fn one_process<M: Module>(optim: Optim, build: fn() -> (VarStore, M)) -> Vec<Step> {
    train_single_process(build, optim, &global_batches(&data(), GLOBAL_BATCH, STEPS))
}

/// Bitwise: the same parameters on every rank after every step, in both runs.
pub fn assert_same_training(bucketed: &[RankRun], naive: &[RankRun], case: &str) {
    for step in 0..STEPS {
        let per_rank: Vec<_> = bucketed.iter().map(|r| snapshot(&r.after_each_step[step])).collect();
        compare_replicas(&per_rank, 0.0).unwrap_or_else(|report| {
            panic!("{case}, bucketed sync, after step {}: {}", step + 1, report.hint(HINT_REPLICAS))
        });
        for (rank, (b, n)) in bucketed.iter().zip(naive).enumerate() {
            compare_to_reference(&b.after_each_step[step], &n.after_each_step[step], 0.0).unwrap_or_else(
                |report| {
                    let report = report.hint(HINT_BITWISE);
                    panic!("{case}, rank {rank} after step {}, bucketed vs naive sync: {report}", step + 1)
                },
            );
        }
    }
}

/// Fails with `message` unless `planned` is `expected`. When it holds the
/// same buckets in another order, it says so first: the order is then the
/// one thing to fix, whatever the rule the test is about.
#[track_caller]
pub fn assert_layout<T: PartialEq + std::fmt::Debug>(planned: &[T], expected: &[T], message: &str) {
    if planned == expected {
        return;
    }
    let same_buckets = planned.len() == expected.len() && expected.iter().all(|b| planned.contains(b));
    if same_buckets {
        // Only the case from `message`, not its "because": that explains a
        // rule about which buckets form, which these buckets already keep.
        let case = message.split(", because ").next().unwrap_or(message);
        panic!(
            "your plan_buckets planned the right buckets in the wrong order: {planned:?}, the chapter \
             expects {expected:?}, because buckets come out in the order backward starts filling them, by \
             their first member, the highest index first: every rank's k-th all-reduce must carry the same \
             bucket, and the one backward completes first must be the first to leave. ({case})"
        );
    }
    panic!("{message}\n  planned:  {planned:?}\n  expected: {expected:?}");
}
