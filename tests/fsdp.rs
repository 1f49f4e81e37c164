//! Tests of the library's FSDP (`ddp::FullyShard`, ZeRO-3, PyTorch's
//! `fully_shard`): after every step the gathered parameters equal the
//! workbook's DDP (bitwise on 2 ranks, within `TOLERANCE` on 3, where
//! FSDP divides by 2 then 1.5 and DDP by 3) and one process on the global
//! batch (within `TOLERANCE`); with accumulation, an unused parameter and
//! empty shards; memory below DDP's; prefetch that really runs ahead.
//!
//! Run: `cargo test --test fsdp`

mod common;
#[path = "fsdp/memory_and_prefetch.rs"]
mod memory_and_prefetch;

use common::{run, TOLERANCE};
use ddp_workbook::check::{compare_to_reference, max_reference_diff, snapshot};
use ddp_workbook::data::Regression;
use ddp_workbook::ddp::{
    fsdp_schedule, Action, AdamWUpdate, FsdpAdamW, FsdpOptions, FsdpSchedule, FsdpSgd, FullyShard,
    SimpleDistributedDataParallelism, UnitAt,
};
use ddp_workbook::models::{named_parameters, Gpt, GptConfig, Mlp};
use ddp_workbook::tch::nn::{Module, VarStore};
use ddp_workbook::tch::{Device, Kind, Reduction, Tensor};
use ddp_workbook::with_seed;

type Named = Vec<(String, Tensor)>;

const STEPS: usize = 3;
const SEED: i64 = 7;
/// Rows of each rank's batch.
const LOCAL: i64 = 4;
const LR_SGD: f64 = 0.1;
const LR_ADAMW: f64 = 0.01;
const WEIGHT_DECAY: f64 = 0.01;
/// How far the tiny GPT on 3 ranks may be from one process after 3 SGD
/// steps: the workbook's DDP is 7.5e-10 away there (`check` prints it).
const GPT_3_RANKS_FROM_ONE_PROCESS: f64 = 1e-8;

/// Which model and how it is cut into units.
#[derive(Clone, Copy, Debug)]
pub enum Model {
    /// `[4, 7, 3, 1]`: a 7-row weight (4 and 3 rows on 2 ranks), the root only.
    Mlp,
    /// The same, each layer a unit.
    MlpPerLayer,
    /// `[4, 2, 1]`, each layer a unit: 2 rows on 3 ranks leave rank 2 empty.
    NarrowMlp,
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
    /// An extra parameter that no rank's loss uses.
    pub unused: bool,
    /// Run the library's schedule with every list of actions reversed.
    pub reversed: bool,
}

impl Case {
    pub fn new(model: Model, opt: Opt, reshard: bool) -> Case {
        Case { model, opt, reshard, micro: 1, unused: false, reversed: false }
    }
}

pub fn gpt_config() -> GptConfig {
    GptConfig { vocab_size: 11, block_size: 6, n_layer: 2, n_head: 2, n_embd: 8 }
}

/// A built model and how to run it, with or without FSDP's hooks.
pub enum Net {
    Mlp(Mlp),
    Gpt(Box<Gpt>),
}

impl Net {
    fn plain(&self, x: &Tensor) -> Tensor {
        match self {
            Net::Mlp(m) => m.forward(x),
            Net::Gpt(g) => g.forward(x),
        }
    }

    fn sharded(&self, fsdp: &FullyShard, x: &Tensor) -> Tensor {
        fsdp.forward_with(|hooks| match self {
            Net::Mlp(m) => m.forward_with_hooks(x, hooks),
            Net::Gpt(g) => g.forward_with_hooks(x, hooks),
        })
        .expect("the forward's gathers succeed")
    }
}

impl Module for Net {
    fn forward(&self, x: &Tensor) -> Tensor {
        self.plain(x)
    }
}

impl std::fmt::Debug for Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Net")
    }
}

/// Every rank and the reference build this, from one seed.
pub fn build(case: Case) -> (VarStore, Net) {
    with_seed(SEED, || {
        let mut vs = VarStore::new(Device::Cpu);
        let net = match case.model {
            Model::Mlp | Model::MlpPerLayer => Net::Mlp(Mlp::new(&vs.root(), &[4, 7, 3, 1])),
            Model::NarrowMlp => Net::Mlp(Mlp::new(&vs.root(), &[4, 2, 1])),
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

/// The optimizer all three runs use, on full tensors or shards alike.
pub struct Stepper {
    opt: Opt,
    moments: Vec<(Tensor, Tensor)>,
    steps: Vec<i64>,
}

impl Stepper {
    pub fn new(opt: Opt, params: &[Tensor]) -> Stepper {
        let moments = params.iter().map(|p| (p.zeros_like(), p.zeros_like())).collect();
        Stepper { opt, moments, steps: vec![0; params.len()] }
    }

    /// Steps the parameters that have a gradient.
    pub fn step(&mut self, params: &[Tensor]) {
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
                    let mut p = p.shallow_clone();
                    update.apply(&mut p, &g, m, v).unwrap();
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

/// One process, the global batch of `world * LOCAL` rows per step: the
/// parameters after each step.
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
            loss(case, &net.plain(&x), &y).backward();
            stepper.step(&params);
            snapshot(&named)
        })
        .collect()
}

/// The rows of rank `rank`'s micro-batch `m` in step `s`.
fn local_rows(case: Case, world: i64, s: i64, rank: i64, m: i64) -> (i64, i64) {
    let micro_len = LOCAL / case.micro;
    (s * world * LOCAL + rank * LOCAL + m * micro_len, micro_len)
}

/// The workbook's DDP on `world` ranks: rank 0's parameters after each step.
pub fn ddp(case: Case, world: usize) -> Vec<Named> {
    run(world, |pg| {
        let rank = pg.rank() as i64;
        let (vs, net) = build(case);
        let named = named_parameters(&vs);
        let ddp = SimpleDistributedDataParallelism::new(net, &vs, pg)?;
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

/// What a FSDP run hands back from each rank.
pub struct FsdpRun {
    /// The gathered parameters after each step.
    pub steps: Vec<Named>,
    /// This rank's `(name, rows owned)`.
    pub rows: Vec<(String, (i64, i64))>,
}

pub fn fsdp_options(reshard: bool) -> FsdpOptions {
    FsdpOptions { reshard_after_forward: reshard, ..FsdpOptions::default() }
}

pub fn shard(case: Case, net: &Net, vs: &VarStore, pg: ddp_workbook::dist::Group) -> FullyShard {
    shard_with(case, net, vs, pg, false)
}

/// [`shard`], recording FSDP's events when `record_events`.
pub fn shard_with(
    case: Case,
    net: &Net,
    vs: &VarStore,
    pg: ddp_workbook::dist::Group,
    record_events: bool,
) -> FullyShard {
    let schedule = if case.reversed { reversed_schedule() } else { FsdpSchedule::default() };
    let options = FsdpOptions { record_events, schedule, ..fsdp_options(case.reshard) };
    match (case.model, net) {
        (Model::Gpt, Net::Gpt(g)) => FullyShard::gpt(g, vs, pg, options),
        (Model::Mlp, Net::Mlp(m)) => FullyShard::mlp(m, vs, pg, options, false),
        (_, Net::Mlp(m)) => FullyShard::mlp(m, vs, pg, options, true),
        _ => unreachable!("the model matches the case"),
    }
    .expect("fully_shard succeeds")
}

/// The library's schedule with the actions of every returned list in the
/// opposite order: the chapter says the order within a list changes no
/// result (`[Gather, Prefetch]` becomes `[Prefetch, Gather]`,
/// `[ReduceScatter, Free]` becomes `[Free, ReduceScatter]`).
fn reversed_schedule() -> FsdpSchedule {
    fn rev(mut actions: Vec<Action>) -> Vec<Action> {
        actions.reverse();
        actions
    }
    fn pre_forward(at: UnitAt) -> Vec<Action> {
        rev(fsdp_schedule::pre_forward(at))
    }
    fn post_forward(at: UnitAt) -> Vec<Action> {
        rev(fsdp_schedule::post_forward(at))
    }
    fn pre_backward(at: UnitAt) -> Vec<Action> {
        rev(fsdp_schedule::pre_backward(at))
    }
    fn post_backward(at: UnitAt) -> Vec<Action> {
        rev(fsdp_schedule::post_backward(at))
    }
    FsdpSchedule { pre_forward, post_forward, pre_backward, post_backward, ..FsdpSchedule::default() }
}

/// FSDP on `world` ranks: each rank's run.
pub fn fsdp(case: Case, world: usize) -> Vec<FsdpRun> {
    run(world, |pg| {
        let rank = pg.rank() as i64;
        let (vs, net) = build(case);
        let fsdp = shard(case, &net, &vs, pg);
        let mut adamw = (case.opt == Opt::AdamW).then(|| {
            let mut a = FsdpAdamW::new(&fsdp, LR_ADAMW, WEIGHT_DECAY);
            a.eps = 1e-8;
            a
        });
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
            steps.push(fsdp.full_parameters()?);
        }
        let rows = fsdp.sharded_parameters().into_iter().map(|p| (p.name, p.rows)).collect();
        Ok(FsdpRun { steps, rows })
    })
}

/// Names every tensor the same way and in one order, for comparing runs
/// whose lists differ in order (FSDP lists unit by unit).
fn sorted(named: &Named) -> Named {
    let mut out = snapshot(named);
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// The FSDP run against DDP (within `ddp_bound`; 0 is bitwise) and one
/// process (within `TOLERANCE`), after every step, on every rank.
pub fn check(case: Case, world: usize, ddp_bound: f64) -> Vec<FsdpRun> {
    check_within(case, world, ddp_bound, TOLERANCE)
}

/// [`check`], with `one_bound` for one process.
pub fn check_within(case: Case, world: usize, ddp_bound: f64, one_bound: f64) -> Vec<FsdpRun> {
    let runs = fsdp(case, world);
    let reference = one_process(case, world as i64);
    let ddp = (!case.unused).then(|| ddp(case, world));
    let (mut from_ddp, mut from_one, mut ddp_from_one): (f64, f64, f64) = (0.0, 0.0, 0.0);
    for (s, expected) in reference.iter().enumerate() {
        let expected = sorted(expected);
        for (rank, run) in runs.iter().enumerate() {
            let got = sorted(&run.steps[s]);
            compare_to_reference(&got, &expected, one_bound).unwrap_or_else(|report| {
                panic!("{case:?} on {world} ranks, rank {rank} after step {}: FSDP must train as one process on the global batch: {report}", s + 1)
            });
            from_one = from_one.max(max_reference_diff(&got, &expected));
            if let Some(ddp) = &ddp {
                let ddp = sorted(&ddp[s]);
                compare_to_reference(&got, &ddp, ddp_bound).unwrap_or_else(|report| {
                    panic!("{case:?} on {world} ranks, rank {rank} after step {}: FSDP must equal DDP within {ddp_bound:e}: {report}", s + 1)
                });
                from_ddp = from_ddp.max(max_reference_diff(&got, &ddp));
                ddp_from_one = ddp_from_one.max(max_reference_diff(&ddp, &expected));
            }
        }
    }
    match ddp {
        Some(_) => println!(
            "{case:?} on {world} ranks: largest difference from DDP {from_ddp:e}, from one process {from_one:e} (DDP from one process {ddp_from_one:e})"
        ),
        None => println!("{case:?} on {world} ranks: largest difference from one process {from_one:e} (no DDP run: it refuses a parameter without a gradient)"),
    }
    runs
}

mod two_ranks_bitwise {
    use super::*;

    #[test]
    fn mlp_root_sgd_resharding() {
        check(Case::new(Model::Mlp, Opt::Sgd, true), 2, 0.0);
    }

    #[test]
    fn mlp_root_adamw_kept() {
        check(Case::new(Model::Mlp, Opt::AdamW, false), 2, 0.0);
    }

    #[test]
    fn mlp_per_layer_adamw_resharding() {
        check(Case::new(Model::MlpPerLayer, Opt::AdamW, true), 2, 0.0);
    }

    #[test]
    fn gpt_sgd_resharding() {
        check(Case::new(Model::Gpt, Opt::Sgd, true), 2, 0.0);
    }

    #[test]
    fn gpt_adamw_resharding() {
        check(Case::new(Model::Gpt, Opt::AdamW, true), 2, 0.0);
    }

    #[test]
    fn gpt_adamw_kept() {
        check(Case::new(Model::Gpt, Opt::AdamW, false), 2, 0.0);
    }

    #[test]
    fn a_7_row_weight_is_4_and_3_rows() {
        let runs = check(Case::new(Model::Mlp, Opt::Sgd, true), 2, 0.0);
        let rows = |rank: usize| runs[rank].rows.iter().find(|(n, _)| n == "layers.0.weight").unwrap().1;
        assert_eq!((rows(0), rows(1)), ((0, 4), (4, 3)), "FSDP2 cuts 7 rows into ceil(7/2) = 4 and 3");
    }

    #[test]
    fn the_order_within_each_list_of_actions_changes_nothing() {
        // Every list reversed, on the cases where each list has two actions
        // (resharding; accumulation, for post_backward inside no_sync):
        // still DDP bit for bit and one process within the tolerance.
        check(Case { reversed: true, ..Case::new(Model::Gpt, Opt::AdamW, true) }, 2, 0.0);
        check(Case { reversed: true, micro: 2, ..Case::new(Model::Gpt, Opt::Sgd, true) }, 2, 0.0);
    }

    #[test]
    fn accumulation_with_no_sync_equals_ddp_bitwise() {
        let case = Case { micro: 2, ..Case::new(Model::Gpt, Opt::AdamW, true) };
        check(case, 2, 0.0);
    }

    #[test]
    fn a_parameter_no_rank_uses_gets_no_gradient_and_sgd_leaves_it() {
        let case = Case { unused: true, ..Case::new(Model::MlpPerLayer, Opt::Sgd, true) };
        let runs = check(case, 2, 0.0);
        let before = named_parameters(&build(case).0).into_iter().find(|(n, _)| n == "unused").unwrap().1;
        let after = runs[0].steps[STEPS - 1].iter().find(|(n, _)| n == "unused").unwrap().1.shallow_clone();
        assert!(after.equal(&before), "SGD must leave the unused parameter as it was");
    }

    /// FSDP2 reduce-scatters only the parameters with a gradient: one that
    /// no rank used keeps no gradient shard (`.grad` None), so AdamW skips
    /// it, as one process's does; a zero gradient would let weight decay
    /// and the moments move it.
    #[test]
    fn a_parameter_no_rank_uses_gets_no_gradient_and_adamw_leaves_it() {
        let case = Case { unused: true, ..Case::new(Model::MlpPerLayer, Opt::AdamW, true) };
        let runs = check(case, 2, 0.0);
        let before = named_parameters(&build(case).0).into_iter().find(|(n, _)| n == "unused").unwrap().1;
        for run in &runs {
            let after = run.steps[STEPS - 1].iter().find(|(n, _)| n == "unused").unwrap().1.shallow_clone();
            assert!(
                after.equal(&before),
                "AdamW stepped the parameter no rank used: it must have no gradient shard to step"
            );
        }
    }
}

mod three_ranks {
    use super::*;

    #[test]
    fn gpt_sgd_within_bound_of_ddp() {
        // SGD: AdamW's first steps move each weight by about lr whatever the
        // gradient's size, so a gradient near 0 that differs in its last
        // bits (3 ranks divide by 2 then 1.5, one process by the batch)
        // moves by a different lr-sized amount in each run.
        // One process is 7e-10 away after one step, and so is the workbook's
        // DDP (it prints both): on this GPT the mean of three 4-row
        // gradients, taken on one thread without any collective, is already
        // 6.7e-9 from the 12-row gradient (2 ranks: 1e-17). The bound is the
        // model's, not FSDP's, which equals DDP bitwise here.
        check_within(Case::new(Model::Gpt, Opt::Sgd, true), 3, TOLERANCE, GPT_3_RANKS_FROM_ONE_PROCESS);
    }

    #[test]
    fn mlp_sgd_kept_within_bound_of_ddp() {
        check(Case::new(Model::MlpPerLayer, Opt::Sgd, false), 3, TOLERANCE);
    }

    #[test]
    fn more_ranks_than_rows_leave_an_empty_shard_and_still_train() {
        let runs = check(Case::new(Model::NarrowMlp, Opt::AdamW, true), 3, TOLERANCE);
        let rows = |rank: usize, name: &str| runs[rank].rows.iter().find(|(n, _)| n == name).unwrap().1;
        assert_eq!(rows(2, "layers.0.weight").1, 0, "2 rows on 3 ranks: rank 2 keeps none");
        assert_eq!(rows(1, "layers.1.weight").1, 0, "1 row on 3 ranks: rank 1 keeps none");
    }
}

/// FSDP2's contract, which the library keeps: every rank has gradients
/// for the same parameters (only those are reduce-scattered). A parameter
/// that one rank used and another did not gives reduce-scatters of other
/// lengths: an error naming the unit, not a hang or a wrong average.
#[test]
fn a_parameter_only_some_ranks_use_is_an_error_naming_the_unit() {
    let options = ddp_workbook::dist::SpawnOptions::new(2).timeout(std::time::Duration::from_secs(30));
    let result = ddp_workbook::dist::spawn_with(options, |pg| {
        let vs = VarStore::new(Device::Cpu);
        let (a, b) = with_seed(SEED, || {
            (vs.root().randn("a", &[4, 3], 0.0, 1.0), vs.root().randn("b", &[4, 3], 0.0, 1.0))
        });
        let params = named_parameters(&vs);
        let rank = pg.rank();
        let fsdp = FullyShard::new(&params, vec![("root".into(), vec![0, 1])], pg, FsdpOptions::default())?;
        let loss = fsdp.forward_with(|_| {
            let used = a.sum(Kind::Float);
            if rank == 0 {
                used + b.sum(Kind::Float)
            } else {
                used
            }
        })?;
        fsdp.backward(&loss)?;
        Ok(())
    });
    let error = result
        .expect_err("rank 1 left out `b`, rank 0 did not: their reduce-scatters cannot match")
        .to_string();
    assert!(
        error.contains("reduce-scatter of root (1 of its 2 parameters have a gradient on this rank"),
        "the error must name the unit's reduce-scatter and what rank 1 left out: {error}"
    );
}

/// The units of `fully_shard` per block, worked out by hand on names that
/// could fool a prefix match: `blocks.1` is not `blocks.10`, `blockset.0`
/// and a bare `blocks` belong to the root.
#[test]
fn units_per_layer_cut_the_model_by_layer_index() {
    let names =
        ["wte", "blocks.0.w", "blocks.10.w", "blocks.1.w", "blockset.0.w", "blocks", "blocks.1.b", "lm_head"];
    let params: Named =
        names.iter().map(|n| (n.to_string(), Tensor::zeros([1], (Kind::Float, Device::Cpu)))).collect();
    let units = FullyShard::units_per_layer(&params, "blocks", 11);
    let mut expected: Vec<(String, Vec<usize>)> = (0..12)
        .map(|u| (if u == 0 { "root".to_string() } else { format!("blocks.{}", u - 1) }, vec![]))
        .collect();
    expected[0].1 = vec![0, 4, 5, 7];
    expected[1].1 = vec![1];
    expected[2].1 = vec![3, 6];
    expected[11].1 = vec![2];
    assert_eq!(units, expected);
}
