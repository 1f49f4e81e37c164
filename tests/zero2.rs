//! Tests of ZeRO stage 2 in the finished library (`ddp::ShardGradOp`,
//! FSDP's `SHARD_GRAD_OP`): gradients reduce-scattered bucket by bucket
//! during backward, each rank keeping its shard, AdamW on the shard, the
//! parameters all-gathered. Each claim is checked against a value computed
//! another way: the workbook's DDP with the training run's AdamW (bit for
//! bit: the same sum, division and AdamW on every element), one process on
//! the global batch (within `TOLERANCE`), the bytes of the full gradient,
//! and DDP's bytes on the wire.
//!
//! Run: `cargo test --test zero2` (add `-- --nocapture` for the numbers)

mod common;

use common::{mlp_with_an_unused_parameter, mse, run, Named, TOLERANCE};
use ddp_workbook::check::{compare_replicas, max_reference_diff, snapshot};
use ddp_workbook::data::{masked_cross_entropy, Regression, TokenTask};
use ddp_workbook::ddp::{BucketCaps, ShardGradOp, SimpleDistributedDataParallelism, BUCKETS_IN_FLIGHT};
use ddp_workbook::dist::{CommStats, Group};
use ddp_workbook::models::{named_parameters, Gpt, GptConfig, Mlp};
use ddp_workbook::tch::nn::{Module, VarStore};
use ddp_workbook::tch::{Kind, Tensor};
use ddp_workbook::train::AdamW;

const LR: f64 = 0.01;
const WEIGHT_DECAY: f64 = 0.1;
const STEPS: usize = 3;
const MLP: &[i64] = &[4, 5, 3, 1]; // 47 parameters
/// Buckets of 4, 18 and 25 f64 elements: none divides by 3 ranks, 25 by none.
const CAPS: BucketCaps = BucketCaps { cap_bytes: 256, first_cap_bytes: 64 };
/// Every parameter alone: the last layer's bias is a bucket of 1 element,
/// smaller than the world size.
const ONE_EACH: BucketCaps = BucketCaps { cap_bytes: 8, first_cap_bytes: 8 };

/// How one step's batch is cut: `micro` micro-batches of `rows` per rank.
#[derive(Clone, Copy)]
struct Batching {
    rows: i64,
    micro: i64,
}

/// A model, its data and its loss, as every strategy here trains it.
trait Task: Sync {
    type M: Module;
    fn build(&self) -> (VarStore, Self::M);
    /// The mean loss over rows `start .. start + len`.
    fn loss(&self, model: &dyn Fn(&Tensor) -> Tensor, start: i64, len: i64) -> Tensor;
}

struct MlpTask {
    sizes: &'static [i64],
    unused: bool,
}

impl MlpTask {
    fn new(sizes: &'static [i64], unused: bool) -> Self {
        MlpTask { sizes, unused }
    }
}

impl Task for MlpTask {
    type M = Mlp;
    fn build(&self) -> (VarStore, Mlp) {
        if self.unused {
            mlp_with_an_unused_parameter(5, self.sizes)
        } else {
            Mlp::seeded(5, self.sizes, Kind::Double)
        }
    }
    fn loss(&self, model: &dyn Fn(&Tensor) -> Tensor, start: i64, len: i64) -> Tensor {
        // Built per call: tensors cannot be shared by the rank threads.
        let (x, y) = Regression::new(7, 256, self.sizes[0], 1, Kind::Double).batch(start, len);
        mse(&model(&x), &y)
    }
}

struct GptTask {
    cfg: GptConfig,
}

impl GptTask {
    fn new() -> Self {
        GptTask { cfg: GptConfig { vocab_size: 16, block_size: 32, n_layer: 2, n_head: 2, n_embd: 16 } }
    }
}

impl Task for GptTask {
    type M = Gpt;
    fn build(&self) -> (VarStore, Gpt) {
        Gpt::seeded(3, &self.cfg, Kind::Double)
    }
    fn loss(&self, model: &dyn Fn(&Tensor) -> Tensor, start: i64, len: i64) -> Tensor {
        let (inputs, targets, mask) = TokenTask::standard(5, 64).batch(start, len);
        masked_cross_entropy(&model(&inputs), &targets, &mask)
    }
}

/// Rows of global step `s`, for rank `rank`'s micro-batch `m`: each step
/// takes `rows * micro * world` consecutive rows, rank-major.
fn rows_of(b: Batching, world: usize, s: usize, rank: usize, m: i64) -> i64 {
    let per_rank = b.rows * b.micro;
    s as i64 * per_rank * world as i64 + rank as i64 * per_rank + m * b.rows
}

/// One rank's run: its parameters after every step, and what it sent in
/// each step (the first excepted: DDP broadcasts its gradient order once).
struct RankRun {
    after: Vec<Named>,
    stats: Vec<CommStats>,
}

fn train_zero2<T: Task>(task: &T, world: usize, caps: BucketCaps, b: Batching, unused: bool) -> Vec<RankRun> {
    run(world, |pg: Group| {
        let (vs, module) = task.build();
        let mut model =
            ShardGradOp::new(module, &vs, pg.clone(), caps, LR, WEIGHT_DECAY)?.find_unused_parameters(unused);
        let (mut after, mut stats) = (vec![], vec![]);
        for s in 0..STEPS {
            let before = pg.stats();
            model.zero_grad()?;
            for m in 0..b.micro {
                let start = rows_of(b, world, s, pg.rank(), m);
                let loss = task.loss(&|x| model.forward(x), start, b.rows) / b.micro as f64;
                if m + 1 < b.micro {
                    let _no_sync = model.no_sync();
                    model.backward(&loss)?;
                } else {
                    model.backward(&loss)?;
                }
            }
            model.step()?;
            stats.push(pg.stats().since(&before));
            after.push(snapshot(model.parameters()));
        }
        Ok(RankRun { after, stats })
    })
}

fn train_ddp<T: Task>(task: &T, world: usize, caps: BucketCaps, b: Batching, unused: bool) -> Vec<RankRun> {
    run(world, |pg: Group| {
        let (vs, module) = task.build();
        let model = SimpleDistributedDataParallelism::with_bucket_caps(module, &vs, pg.clone(), caps)?
            .find_unused_parameters(unused);
        let mut optimizer = AdamW::new(model.parameters(), LR, WEIGHT_DECAY);
        let (mut after, mut stats) = (vec![], vec![]);
        for s in 0..STEPS {
            let before = pg.stats();
            optimizer.zero_grad();
            for m in 0..b.micro {
                let start = rows_of(b, world, s, pg.rank(), m);
                let loss = task.loss(&|x| model.forward(x), start, b.rows) / b.micro as f64;
                if m + 1 < b.micro {
                    let _no_sync = model.no_sync();
                    model.backward(&loss)?;
                } else {
                    model.backward(&loss)?;
                }
            }
            model.optimizer_step(&mut optimizer)?;
            stats.push(pg.stats().since(&before));
            after.push(snapshot(model.parameters()));
        }
        Ok(RankRun { after, stats })
    })
}

/// One process, the training run's AdamW, the whole global batch per step.
fn one_process<T: Task>(task: &T, world: usize, b: Batching) -> Vec<Named> {
    let (vs, model) = task.build();
    let mut optimizer = AdamW::new(&named_parameters(&vs), LR, WEIGHT_DECAY);
    let global = b.rows * b.micro * world as i64;
    let mut after = vec![];
    for s in 0..STEPS {
        optimizer.zero_grad();
        task.loss(&|x| model.forward(x), s as i64 * global, global).backward();
        optimizer.step().expect("AdamW steps");
        after.push(snapshot(&named_parameters(&vs)));
    }
    after
}

/// ZeRO-2 vs DDP bit for bit, and vs one process within `TOLERANCE`, after
/// every step; every rank equal to every other.
fn assert_like_ddp_and_one_process<T: Task>(
    case: &str,
    task: &T,
    world: usize,
    caps: BucketCaps,
    b: Batching,
) {
    let unused = false;
    check(case, task, world, caps, b, unused);
}

fn check<T: Task>(case: &str, task: &T, world: usize, caps: BucketCaps, b: Batching, unused: bool) -> f64 {
    let zero2 = train_zero2(task, world, caps, b, unused);
    let ddp = train_ddp(task, world, caps, b, unused);
    let reference = one_process(task, world, b);
    let mut largest: f64 = 0.0;
    for (s, one) in reference.iter().enumerate() {
        let ranks: Vec<Named> = zero2.iter().map(|r| snapshot(&r.after[s])).collect();
        if let Err(report) = compare_replicas(&ranks, 0.0) {
            panic!(
                "{case}, {world} ranks, step {}: the ranks differ: {}",
                s + 1,
                report.hint("the all-gather")
            );
        }
        let from_ddp = max_reference_diff(&ranks[0], &ddp[0].after[s]);
        assert!(
            from_ddp == 0.0,
            "{case}, {world} ranks, step {}: ZeRO-2 differs from DDP by {from_ddp:e}; it must take DDP's \
             steps bit for bit (sum, then divide by the world size, then AdamW)",
            s + 1
        );
        let from_one = max_reference_diff(&ranks[0], one);
        assert!(
            from_one <= TOLERANCE,
            "{case}, {world} ranks, step {}: ZeRO-2 is {from_one:e} from one process (tolerance {TOLERANCE:e})",
            s + 1
        );
        largest = largest.max(from_one);
    }
    println!("{case}, {world} ranks, {STEPS} AdamW steps: bitwise DDP's, {largest:e} from one process");
    largest
}

const PLAIN: Batching = Batching { rows: 2, micro: 1 };

#[test]
fn zero2_takes_ddps_steps_bit_for_bit_on_an_mlp() {
    for world in [2, 3] {
        assert_like_ddp_and_one_process("MLP", &MlpTask::new(MLP, false), world, CAPS, PLAIN);
    }
}

#[test]
fn zero2_takes_ddps_steps_bit_for_bit_on_a_tiny_gpt() {
    let caps = BucketCaps { cap_bytes: 8 * 1024, first_cap_bytes: 2 * 1024 };
    for world in [2, 3] {
        assert_like_ddp_and_one_process("tiny GPT", &GptTask::new(), world, caps, PLAIN);
    }
}

#[test]
fn zero2_accumulates_full_gradients_under_no_sync_and_matches_ddp() {
    let b = Batching { rows: 2, micro: 3 };
    for world in [2, 3] {
        assert_like_ddp_and_one_process("MLP, 3 micro-batches", &MlpTask::new(MLP, false), world, CAPS, b);
    }
}

#[test]
fn zero2_handles_a_bucket_smaller_than_the_world_size() {
    for world in [2, 3] {
        assert_like_ddp_and_one_process(
            "MLP, one bucket per parameter",
            &MlpTask::new(MLP, false),
            world,
            ONE_EACH,
            PLAIN,
        );
    }
}

#[test]
fn zero2_leaves_a_parameter_no_rank_used_as_ddp_does() {
    let task = MlpTask::new(MLP, true);
    for world in [2, 3] {
        // One process: AdamW skips a parameter without a gradient.
        check("MLP with an unused parameter", &task, world, CAPS, PLAIN, true);
        let zero2 = train_zero2(&task, world, CAPS, PLAIN, true);
        let (vs, _) = task.build();
        let start = snapshot(&named_parameters(&vs));
        let at = |named: &Named| named.iter().find(|(n, _)| n == "unused").map(|(_, t)| t.copy()).unwrap();
        assert!(
            at(&zero2[0].after[STEPS - 1]).equal(&at(&start)),
            "{world} ranks: the parameter no rank used moved (no gradient: no weight decay, no step)"
        );
    }
}

/// Bytes of f64 elements.
fn f64_bytes(numel: usize) -> usize {
    numel * 8
}

#[test]
fn zero2_gradient_peak_is_the_shard_plus_the_buckets_in_flight() {
    // Ten equal layers, a bucket each: the full gradient is many buckets.
    const DEEP: &[i64] = &[16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 1];
    let caps = BucketCaps { cap_bytes: f64_bytes(16 * 16 + 16), first_cap_bytes: f64_bytes(16 * 16 + 16) };
    let task = MlpTask::new(DEEP, false);
    for world in 1..=4 {
        let measured = run(world, |pg: Group| {
            let (vs, module) = task.build();
            let full: usize = named_parameters(&vs).iter().map(|(_, p)| f64_bytes(p.numel())).sum();
            let mut model = ShardGradOp::new(module, &vs, pg.clone(), caps, LR, WEIGHT_DECAY)?;
            let ledger = model.ledger();
            let shards: usize = model.shards().iter().map(|s| f64_bytes(s.len)).sum();
            let largest = model.shards().iter().map(|s| f64_bytes(s.padded_numel)).max().unwrap_or(0);
            for s in 0..2 {
                model.zero_grad()?;
                ledger.reset_peak();
                let loss = task.loss(&|x| model.forward(x), rows_of(PLAIN, world, s, pg.rank(), 0), 2);
                model.backward(&loss)?;
                model.step()?;
            }
            let events = ledger.events();
            let peak = events.iter().map(|e| e.alive.gradients).max().unwrap_or(0);
            assert_eq!(ledger.alive().gradients, 0, "gradients alive after the step");
            let ddp = run_ddp_gradient_bytes(&task, &pg, caps)?;
            Ok((full, shards, largest, peak, ddp))
        });
        let (full, shards, largest, peak, ddp) = measured[0];
        let bound = shards + (BUCKETS_IN_FLIGHT + 1) * largest;
        println!(
            "{world} rank(s): gradient bytes at their peak {peak} (ledger); shards {shards} + at most \
             {} buckets of {largest} in flight or filling = {bound}; DDP holds {ddp} (the full gradient, {full})",
            BUCKETS_IN_FLIGHT + 1
        );
        assert!(peak >= shards, "{world} ranks: peak {peak} below the shards {shards} every rank keeps");
        assert!(peak <= bound, "{world} ranks: peak {peak} above shards + buckets in flight {bound}");
        assert_eq!(ddp, full, "DDP's buckets hold the full gradient");
        if world > 1 {
            assert!(peak < ddp, "{world} ranks: ZeRO-2's gradient peak {peak} is not below DDP's {ddp}");
        }
    }
}

/// The bytes of DDP's gradient buckets on this model (every rank holds
/// them all, for the whole step).
fn run_ddp_gradient_bytes(task: &MlpTask, pg: &Group, caps: BucketCaps) -> anyhow::Result<usize> {
    let (vs, module) = task.build();
    let ddp = SimpleDistributedDataParallelism::with_bucket_caps(module, &vs, pg.clone(), caps)?;
    Ok(ddp.buckets().iter().map(|b| b.bytes()).sum())
}

#[test]
fn ledger_sees_the_parameters_and_a_shard_of_the_moments() {
    for world in [1, 2, 3] {
        let got = run(world, |pg: Group| {
            let (vs, module) = Mlp::seeded(5, MLP, Kind::Double);
            let model = ShardGradOp::new(module, &vs, pg, CAPS, LR, WEIGHT_DECAY)?;
            let shards = model.shards();
            let alive = model.ledger().alive();
            let padded: usize = shards.iter().map(|s| f64_bytes(s.padded_numel)).sum();
            let moments: usize = shards.iter().map(|s| 2 * f64_bytes(s.len)).sum();
            Ok((alive.parameters, padded, alive.optimizer_state, moments, alive.gradients))
        });
        let (params, padded, state, moments, grads) = got[0];
        assert_eq!(params, padded, "{world} ranks: every rank holds every (padded) parameter");
        assert_eq!(state, moments, "{world} ranks: two moments of this rank's shard");
        assert_eq!(grads, 0, "no gradient before backward");
        assert!(world == 1 || moments < 2 * f64_bytes(47), "{world} ranks: moments not sharded");
    }
}

#[test]
fn zero2_sends_the_bytes_ddp_sends() {
    // 44 parameters in one bucket: no padding on 2 or 4 ranks, 1 element on 3.
    const EVEN: &[i64] = &[4, 6, 2];
    let task = MlpTask::new(EVEN, false);
    let caps = BucketCaps::default();
    for world in [2, 3, 4] {
        let zero2 = train_zero2(&task, world, caps, PLAIN, false);
        let ddp = train_ddp(&task, world, caps, PLAIN, false);
        let padding = (world - 44 % world) % world;
        for s in 1..STEPS {
            let (z, d) = (&zero2[0].stats[s], &ddp[0].stats[s]);
            let (zw, dw) = (z.ring_wire_bytes(world), d.ring_wire_bytes(world));
            let n = world as f64;
            // The padding's zeros travel too: once in the reduce-scatter, once in the all-gather.
            let expected = dw + (n - 1.0) / n * 2.0 * f64_bytes(padding) as f64;
            println!(
                "{world} ranks, step {}: ZeRO-2 {zw} bytes on the wire per rank (reduce-scatter {} B, \
                 all-gather {} B, all-reduce {} B), DDP {dw} (all-reduce {} B); padding {padding} elements",
                s + 1,
                z.reduce_scatter_bytes,
                z.all_gather_bytes,
                z.all_reduce_bytes,
                d.all_reduce_bytes
            );
            assert!(
                (zw - expected).abs() < 1e-9,
                "{world} ranks: ZeRO-2 sends {zw} bytes per rank, DDP {dw}; with {padding} padding elements \
                 ZeRO-2 should send {expected}"
            );
            assert_eq!(
                (z.reduce_scatter, z.all_gather),
                (1, 1),
                "one reduce-scatter and all-gather per bucket"
            );
        }
    }
}

#[test]
fn zero2_reduce_scatters_each_bucket_during_backward() {
    // A bucket per parameter: the last layer's buckets are complete long
    // before backward reaches the first layer.
    let task = MlpTask::new(MLP, false);
    let labels = run(2, |pg: Group| {
        let (vs, module) = task.build();
        let model = ShardGradOp::new(module, &vs, pg.clone(), ONE_EACH, LR, WEIGHT_DECAY)?;
        let ledger = model.ledger();
        ledger.reset_peak();
        model.backward(&task.loss(&|x| model.forward(x), 2 * pg.rank() as i64, 2))?;
        Ok(ledger.events().into_iter().map(|e| e.label).collect::<Vec<String>>())
    });
    let labels = &labels[0];
    let first_launch = labels.iter().position(|l| l.ends_with("flat gradient, reduce-scattering"));
    let first_layer = labels.iter().position(|l| l == "full gradient of `layers.0.weight`");
    let (Some(first_launch), Some(first_layer)) = (first_launch, first_layer) else {
        panic!("the ledger recorded no launch or no gradient of layers.0.weight: {labels:#?}");
    };
    assert!(
        first_launch < first_layer,
        "the first reduce-scatter left after backward had reached the first layer: nothing overlapped \
         ({labels:#?})"
    );
    // Never more than BUCKETS_IN_FLIGHT full buffers alive at once.
    let mut alive: i64 = 0;
    for label in labels {
        alive += i64::from(label.ends_with("reduce-scattering"))
            - i64::from(label.ends_with("flat gradient goes"));
        assert!(alive as usize <= BUCKETS_IN_FLIGHT, "{alive} buckets in flight at `{label}`");
    }
    println!("first reduce-scatter at event {first_launch}, layers.0.weight's gradient at {first_layer}");
}
