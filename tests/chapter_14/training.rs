//! Chapter 14 tests, part 3: FSDP with YOUR schedule trained against one
//! process on the global batch and against the workbook's DDP, after every
//! step: bitwise equal to DDP on 2 ranks (the float64 division, 2 then 1,
//! is DDP's division by 2), within `TOLERANCE` on 3 (FSDP divides by 2
//! then 1.5, DDP by 3); `reshard_after_forward` true and false; SGD and
//! AdamW; accumulation with `no_sync`; a parameter no rank uses; more ranks
//! than rows (an empty shard). Each test first walks your schedule on
//! paper (`schedule.rs`), to name a mistake before it reads freed memory.

use ddp_workbook::ch14_fsdp::{FsdpAdamW, FsdpOptions, FsdpSgd, FullyShard};
use ddp_workbook::check::{compare_to_reference, max_reference_diff, snapshot};
use ddp_workbook::data::Regression;
use ddp_workbook::ddp::{AdamWUpdate, SimpleDistributedDataParallelism};
use ddp_workbook::dist::Group;
use ddp_workbook::models::{named_parameters, Gpt, GptConfig, Mlp};
use ddp_workbook::tch::nn::{Module, VarStore};
use ddp_workbook::tch::{Device, Kind, Reduction, Tensor};
use ddp_workbook::with_seed;

use super::schedule::assert_your_schedule_is_sound;
use crate::common::{run, TOLERANCE};

pub type Named = Vec<(String, Tensor)>;

pub const STEPS: usize = 3;
const SEED: i64 = 7;
/// Rows of each rank's batch.
pub const LOCAL: i64 = 4;
const LR_SGD: f64 = 0.1;
const LR_ADAMW: f64 = 0.01;
const WEIGHT_DECAY: f64 = 0.01;

/// Which model and how it is cut into units.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Model {
    /// `[4, 7, 3, 1]`, each layer a unit: a 7-row weight is 4 and 3 rows on 2 ranks.
    MlpPerLayer,
    /// `[4, 2, 1]`, each layer a unit: 2 rows on 3 ranks leave rank 2 empty.
    NarrowMlp,
    /// `[4, 8, 6, 2]`, each layer a unit: every row count divides by 2, no padding.
    EvenMlp,
    /// A tiny GPT, each block a unit.
    Gpt,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Opt {
    Sgd,
    AdamW,
}

/// One configuration of a run.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub model: Model,
    pub opt: Opt,
    pub reshard: bool,
    /// Micro-batches per step (no_sync on all but the last).
    pub micro: i64,
    /// An extra parameter that no rank's loss uses (in the root).
    pub unused: bool,
}

impl Case {
    pub fn new(model: Model, opt: Opt, reshard: bool) -> Case {
        Case { model, opt, reshard, micro: 1, unused: false }
    }
}

pub fn gpt_config() -> GptConfig {
    GptConfig { vocab_size: 11, block_size: 6, n_layer: 2, n_head: 2, n_embd: 8 }
}

/// A built model, run with or without FSDP's hooks.
pub enum Net {
    Mlp(Mlp),
    Gpt(Box<Gpt>),
}

impl Net {
    pub fn sharded(&self, fsdp: &FullyShard, x: &Tensor) -> Tensor {
        fsdp.forward_with(|hooks| match self {
            Net::Mlp(m) => m.forward_with_hooks(x, hooks),
            Net::Gpt(g) => g.forward_with_hooks(x, hooks),
        })
        .expect("the forward's gathers succeed")
    }
}

impl Module for Net {
    fn forward(&self, x: &Tensor) -> Tensor {
        match self {
            Net::Mlp(m) => m.forward(x),
            Net::Gpt(g) => g.forward(x),
        }
    }
}

impl std::fmt::Debug for Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Net")
    }
}

/// Every rank and the references build this, from one seed.
pub fn build(case: Case) -> (VarStore, Net) {
    with_seed(SEED, || {
        let mut vs = VarStore::new(Device::Cpu);
        let net = match case.model {
            Model::MlpPerLayer => Net::Mlp(Mlp::new(&vs.root(), &[4, 7, 3, 1])),
            Model::NarrowMlp => Net::Mlp(Mlp::new(&vs.root(), &[4, 2, 1])),
            Model::EvenMlp => Net::Mlp(Mlp::new(&vs.root(), &[4, 8, 6, 2])),
            Model::Gpt => Net::Gpt(Box::new(Gpt::new(&vs.root(), &gpt_config()))),
        };
        if case.unused {
            let _ = vs.root().randn("unused", &[5, 2], 0.0, 1.0);
        }
        vs.set_kind(Kind::Double);
        (vs, net)
    })
}

/// Rows `start..start + len` of the data: inputs and targets.
pub fn batch(case: Case, start: i64, len: i64) -> (Tensor, Tensor) {
    match case.model {
        Model::Gpt => {
            let cfg = gpt_config();
            let all = with_seed(99, || {
                Tensor::randint(cfg.vocab_size, [64, cfg.block_size + 1], (Kind::Int64, Device::Cpu))
            });
            let rows = all.narrow(0, start, len);
            (rows.narrow(1, 0, cfg.block_size), rows.narrow(1, 1, cfg.block_size))
        }
        Model::EvenMlp => Regression::new(3, 64, 4, 2, Kind::Double).batch(start, len),
        _ => Regression::new(3, 64, 4, 1, Kind::Double).batch(start, len),
    }
}

/// The mean loss over the rows given.
pub fn loss(case: Case, output: &Tensor, target: &Tensor) -> Tensor {
    match case.model {
        Model::Gpt => {
            let vocab = gpt_config().vocab_size;
            output.reshape([-1, vocab]).cross_entropy_for_logits(&target.reshape([-1]))
        }
        _ => output.mse_loss(target, Reduction::Mean),
    }
}

/// The optimizer of the references, on full tensors: the same arithmetic
/// as `FsdpSgd` and `FsdpAdamW` on shards.
struct Stepper {
    opt: Opt,
    moments: Vec<(Tensor, Tensor)>,
    steps: Vec<i64>,
}

impl Stepper {
    fn new(opt: Opt, params: &[Tensor]) -> Stepper {
        let moments = params.iter().map(|p| (p.zeros_like(), p.zeros_like())).collect();
        Stepper { opt, moments, steps: vec![0; params.len()] }
    }

    fn step(&mut self, params: &[Tensor]) {
        for (i, p) in params.iter().enumerate() {
            let g = p.grad();
            if !g.defined() {
                continue;
            }
            match self.opt {
                Opt::Sgd => FsdpSgd { lr: LR_SGD }.update(p, &g).unwrap(),
                Opt::AdamW => {
                    self.steps[i] += 1;
                    let update = AdamWUpdate {
                        lr: LR_ADAMW,
                        beta1: 0.9,
                        beta2: 0.999,
                        eps: 1e-8,
                        weight_decay: WEIGHT_DECAY,
                        step: self.steps[i],
                    };
                    let (m, v) = &mut self.moments[i];
                    update.apply(&mut p.shallow_clone(), &g, m, v).unwrap();
                }
            }
        }
    }
}

fn zero_grads(params: &[Tensor]) {
    for p in params {
        let mut g = p.grad();
        if g.defined() {
            let _ = g.zero_();
        }
    }
}

/// One process, the global batch of `world * LOCAL` rows per step.
pub fn one_process(case: Case, world: i64) -> Vec<Named> {
    let (vs, net) = build(case);
    let named = named_parameters(&vs);
    let params: Vec<Tensor> = named.iter().map(|(_, p)| p.shallow_clone()).collect();
    let mut stepper = Stepper::new(case.opt, &params);
    let global = world * LOCAL;
    (0..STEPS as i64)
        .map(|s| {
            zero_grads(&params);
            let (x, y) = batch(case, s * global, global);
            loss(case, &net.forward(&x), &y).backward();
            stepper.step(&params);
            snapshot(&named)
        })
        .collect()
}

/// The rows of rank `rank`'s micro-batch `m` in step `s`.
pub fn local_rows(case: Case, world: i64, s: i64, rank: i64, m: i64) -> (i64, i64) {
    let micro_len = LOCAL / case.micro;
    (s * world * LOCAL + rank * LOCAL + m * micro_len, micro_len)
}

/// The workbook's DDP on `world` ranks (on `wrap(pg)`): rank 0's
/// parameters after each step.
pub fn ddp_on(case: Case, world: usize, wrap: impl Fn(Group) -> Group + Sync) -> Vec<Named> {
    run(world, |pg| {
        let rank = pg.rank() as i64;
        let (vs, net) = build(case);
        let named = named_parameters(&vs);
        let ddp = SimpleDistributedDataParallelism::new(net, &vs, wrap(pg))?;
        let params: Vec<Tensor> = ddp.parameters().iter().map(|(_, p)| p.shallow_clone()).collect();
        let mut stepper = Stepper::new(case.opt, &params);
        let mut after = vec![];
        for s in 0..STEPS as i64 {
            zero_grads(&params);
            for m in 0..case.micro {
                let (start, len) = local_rows(case, world as i64, s, rank, m);
                let (x, y) = batch(case, start, len);
                let l = loss(case, &ddp.forward(&x), &y) / case.micro as f64;
                if m + 1 < case.micro {
                    let _guard = ddp.no_sync();
                    ddp.backward(&l)?;
                } else {
                    ddp.backward(&l)?;
                }
            }
            stepper.step(&params);
            after.push(snapshot(&named));
        }
        Ok(after)
    })
    .swap_remove(0)
}

/// FSDP with your schedule on `pg`, built for `case`, each layer or block a unit.
// ANCHOR: shard
pub fn shard(case: Case, net: &Net, vs: &VarStore, pg: Group, options: FsdpOptions) -> FullyShard {
    let options = FsdpOptions { reshard_after_forward: case.reshard, ..options };
    match net {
        Net::Gpt(g) => FullyShard::gpt(g, vs, pg, options),
        Net::Mlp(m) => FullyShard::mlp(m, vs, pg, options, true),
    }
    .expect("fully_shard succeeds with your shard_rows")
}
// ANCHOR_END: shard

/// What a FSDP run hands back from each rank.
pub struct FsdpRun {
    /// The gathered parameters after each step.
    pub steps: Vec<Named>,
    /// This rank's `(name, rows owned)`.
    pub rows: Vec<(String, (i64, i64))>,
}

/// FSDP with your schedule on `world` ranks: each rank's run.
pub fn fsdp(case: Case, world: usize) -> Vec<FsdpRun> {
    assert_your_schedule_is_sound();
    run(world, |pg| {
        let rank = pg.rank() as i64;
        let (vs, net) = build(case);
        // ANCHOR: loop
        let fsdp = shard(case, &net, &vs, pg, FsdpOptions::default());
        let mut adamw = (case.opt == Opt::AdamW).then(|| FsdpAdamW::new(&fsdp, LR_ADAMW, WEIGHT_DECAY));
        let mut steps = vec![];
        for s in 0..STEPS as i64 {
            fsdp.zero_grad();
            for m in 0..case.micro {
                let (start, len) = local_rows(case, world as i64, s, rank, m);
                let (x, y) = batch(case, start, len);
                fsdp.set_requires_gradient_sync(m + 1 == case.micro);
                let l = loss(case, &net.sharded(&fsdp, &x), &y) / case.micro as f64;
                fsdp.backward(&l)?;
            }
            match &mut adamw {
                Some(adamw) => adamw.step(&fsdp)?,
                None => FsdpSgd { lr: LR_SGD }.step(&fsdp)?,
            }
            // ANCHOR_END: loop
            steps.push(fsdp.full_parameters()?);
        }
        let rows = fsdp.sharded_parameters().into_iter().map(|p| (p.name, p.rows)).collect();
        Ok(FsdpRun { steps, rows })
    })
}

/// Names every tensor in one order (FSDP lists unit by unit).
fn sorted(named: &Named) -> Named {
    let mut out = snapshot(named);
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Your FSDP against DDP (within `ddp_bound`; 0 is bitwise) and one
/// process (within `TOLERANCE`), after every step, on every rank.
pub fn check(case: Case, world: usize, ddp_bound: f64) -> Vec<FsdpRun> {
    let runs = fsdp(case, world);
    let reference = one_process(case, world as i64);
    // The workbook's DDP refuses a parameter no rank used: one process only.
    let ddp = (!case.unused).then(|| ddp_on(case, world, |pg| pg));
    let (mut from_ddp, mut from_one): (f64, f64) = (0.0, 0.0);
    for (s, expected) in reference.iter().enumerate() {
        let expected = sorted(expected);
        for (rank, run) in runs.iter().enumerate() {
            let got = sorted(&run.steps[s]);
            compare_to_reference(&got, &expected, TOLERANCE).unwrap_or_else(|report| {
                panic!(
                    "{case:?} on {world} ranks, rank {rank} after step {}: your FSDP must train as one \
                     process on the global batch: {report}",
                    s + 1
                )
            });
            from_one = from_one.max(max_reference_diff(&got, &expected));
            if let Some(ddp) = &ddp {
                let ddp = sorted(&ddp[s]);
                compare_to_reference(&got, &ddp, ddp_bound).unwrap_or_else(|report| {
                    panic!(
                        "{case:?} on {world} ranks, rank {rank} after step {}: your FSDP must equal the \
                         workbook's DDP within {ddp_bound:e}: {report}",
                        s + 1
                    )
                });
                from_ddp = from_ddp.max(max_reference_diff(&got, &ddp));
            }
        }
    }
    println!(
        "{case:?} on {world} ranks: largest difference from DDP {from_ddp:e}, from one process {from_one:e}"
    );
    runs
}

#[test]
fn gpt_resharding_with_sgd_equals_ddp_bitwise_on_2_ranks() {
    check(Case::new(Model::Gpt, Opt::Sgd, true), 2, 0.0);
}

#[test]
fn gpt_kept_after_forward_with_adamw_equals_ddp_bitwise_on_2_ranks() {
    check(Case::new(Model::Gpt, Opt::AdamW, false), 2, 0.0);
}

#[test]
fn a_7_row_weight_is_kept_as_4_and_3_rows() {
    let runs = check(Case::new(Model::MlpPerLayer, Opt::AdamW, true), 2, 0.0);
    let rows = |rank: usize| runs[rank].rows.iter().find(|(n, _)| n == "layers.0.weight").unwrap().1;
    assert_eq!((rows(0), rows(1)), ((0, 4), (4, 3)), "FSDP2 cuts 7 rows into ceil(7/2) = 4 and 3");
}

#[test]
fn accumulation_with_no_sync_equals_ddp_bitwise() {
    let case = Case { micro: 2, ..Case::new(Model::Gpt, Opt::AdamW, true) };
    check(case, 2, 0.0);
}

#[test]
fn a_parameter_no_rank_uses_gets_a_zero_gradient_and_sgd_leaves_it() {
    let case = Case { unused: true, ..Case::new(Model::MlpPerLayer, Opt::Sgd, true) };
    let runs = check(case, 2, 0.0);
    let before = named_parameters(&build(case).0).into_iter().find(|(n, _)| n == "unused").unwrap().1;
    let after = runs[0].steps[STEPS - 1].iter().find(|(n, _)| n == "unused").unwrap().1.shallow_clone();
    assert!(after.equal(&before), "a zero gradient must leave the unused parameter as it was");
}

#[test]
fn more_ranks_than_rows_leave_an_empty_shard_and_still_train_on_3_ranks() {
    let runs = check(Case::new(Model::NarrowMlp, Opt::AdamW, true), 3, TOLERANCE);
    let rows = |rank: usize, name: &str| runs[rank].rows.iter().find(|(n, _)| n == name).unwrap().1;
    assert_eq!(rows(2, "layers.0.weight").1, 0, "2 rows on 3 ranks: rank 2 keeps none");
    assert_eq!(rows(1, "layers.1.weight").1, 0, "1 row on 3 ranks: rank 1 keeps none");
}
