//! The workbook's side of the cross-check:
//! one rank trains a stage (stages.rs) with the workbook's DDP, as the
//! oracle trains it with PyTorch's, and returns what the oracle writes,
//! under the same names: `forward`, `step{k}.mb{m}.grad.{name}`,
//! `step{k}.param.{name}`. Runs on any backend: the in-process ranks of
//! `spawn`, or MPI processes.
//! Compiled into `cargo test --features solutions,mpi,nccl --test torch_oracle`.

use ddp_workbook::ddp::{
    bf16_compress_hook, bf16_compress_hook_pytorch_order, naive, BucketCaps, FsdpAdamW, FsdpOptions,
    FsdpSchedule, FsdpSgd, FullyShard, Replicated, ShardGradOp, ShardedAdamW,
    SimpleDistributedDataParallelism, StepOptimizer, UnusedParameters,
};
use ddp_workbook::dist::Group;
use ddp_workbook::models::named_parameters;
use ddp_workbook::tch::nn::Module;
use ddp_workbook::tch::{TchError, Tensor};
use ddp_workbook::train::AdamW;

use super::gloo_order::in_gloo_order;
use super::stages::{
    build, loss, micro_batch, Bf16Hook, FsdpUnits, NoSync, Stage, StageOptimizer, Twin, WorkbookSync,
};

/// What one rank computed, and how many gradient syncs it ran.
pub struct RankRun {
    pub tensors: Vec<(String, Tensor)>,
    pub gradient_syncs: u64,
    /// The wrapper's bucket sizes in bytes, in all-reduce order: at
    /// construction and after training (empty for the naive sync).
    pub layout_before: Vec<usize>,
    pub layout_after: Vec<usize>,
    /// Each bucket's members after training, and the parameters' names in
    /// registration order.
    pub names_after: Vec<Vec<String>>,
    pub parameters: Vec<String>,
}

impl RankRun {
    /// A run read back from its tensors (an MPI rank's file): no counts
    /// or layouts.
    pub fn from_tensors(tensors: Vec<(String, Tensor)>) -> RankRun {
        RankRun {
            tensors,
            gradient_syncs: 0,
            layout_before: vec![],
            layout_after: vec![],
            names_after: vec![],
            parameters: vec![],
        }
    }
}

/// One rank of `stage` on `pg`.
pub fn train(stage: &Stage, pg: Group) -> anyhow::Result<RankRun> {
    // One libtorch thread, as each PyTorch process has: a reduction split
    // over threads could add in another order.
    ddp_workbook::tch::set_num_threads(1);
    let rank = pg.rank();
    let (vs, model) = build(&stage.model);
    let params = named_parameters(&vs);
    let mut out = Vec::new();
    let first = micro_batch(stage, rank, 0, 0);
    out.push(("forward".to_string(), ddp_workbook::tch::no_grad(|| model.forward(&first.input))));
    match stage.sync {
        WorkbookSync::Naive => {
            let replicated = Replicated::new(model, &vs, pg.clone())?;
            let mut syncs = 0;
            for step in 0..stage.steps {
                zero_grads(&params);
                for m in 0..stage.micro_batches {
                    let b = micro_batch(stage, rank, step, m);
                    replicated.module().choose_branch(b.use_branch);
                    loss(stage, &replicated.forward(&b.input), &b.target).f_backward()?;
                }
                naive::sync_gradients(pg.as_ref(), &params)?;
                syncs += 1;
                record(&params, step, stage.micro_batches - 1, &mut out);
                sgd_step(&params, stage.lr, step, &mut out);
            }
            Ok(RankRun { gradient_syncs: syncs, parameters: names(&params), ..RankRun::from_tensors(out) })
        }
        WorkbookSync::Wrapper { caps, find_unused } => {
            let ddp = SimpleDistributedDataParallelism::with_bucket_caps(
                model,
                &vs,
                hooked_group(stage, pg.clone()),
                caps,
            )?
            .find_unused_parameters(find_unused);
            register_bf16_hook(stage, &ddp);
            let layout_before = ddp.buckets().iter().map(|b| b.bytes()).collect();
            let mut optimizer = Optimizer::new(stage, &ddp, &pg, caps)?;
            for step in 0..stage.steps {
                match &mut optimizer {
                    Optimizer::Sgd => zero_grads(&params),
                    adamw => adamw.zero_grad(),
                }
                // The parameters no rank gave a gradient in any sync of this
                // step so far: PyTorch's AdamW stages leave those at None.
                let mut no_gradient: Option<Vec<usize>> = None;
                for m in 0..stage.micro_batches {
                    let b = micro_batch(stage, rank, step, m);
                    ddp.module().choose_branch(b.use_branch);
                    let last = m + 1 == stage.micro_batches;
                    if let Optimizer::Zero1(_) = optimizer {
                        // ZeRO-1's step averages the gradients: the wrapper sends nothing.
                        let _no_sync = ddp.no_sync();
                        ddp.backward(&loss(stage, &ddp.forward(&b.input), &b.target))?;
                        continue;
                    }
                    match stage.no_sync {
                        NoSync::AllButLast if !last => {
                            let _no_sync = ddp.no_sync();
                            ddp.backward(&loss(stage, &ddp.forward(&b.input), &b.target))?;
                        }
                        NoSync::ForwardOnly if !last => {
                            let loss = {
                                let _no_sync = ddp.no_sync();
                                loss(stage, &ddp.forward(&b.input), &b.target)
                            };
                            ddp.backward(&loss)?; // the scope is closed: the workbook syncs here
                        }
                        _ => ddp.backward(&loss(stage, &ddp.forward(&b.input), &b.target))?,
                    }
                    let synced = stage.no_sync != NoSync::AllButLast || last;
                    if let (Optimizer::AdamW(_), true) = (&optimizer, synced) {
                        let this_sync = ddp.last_step().no_gradient;
                        let so_far = no_gradient.take().unwrap_or_else(|| this_sync.clone());
                        no_gradient = Some(so_far.into_iter().filter(|i| this_sync.contains(i)).collect());
                    }
                    if stage.record_micro_batches || last {
                        let none = no_gradient.clone().unwrap_or_default();
                        let params: Vec<_> = (0..params.len())
                            .filter(|i| !none.contains(i))
                            .map(|i| (params[i].0.clone(), params[i].1.shallow_clone()))
                            .collect();
                        record(&params, step, m, &mut out);
                    }
                }
                if let Optimizer::Sgd = optimizer {
                    sgd_step(&params, stage.lr, step, &mut out);
                } else {
                    ddp.optimizer_step(&mut optimizer)?;
                    record_params(&params, step, &mut out);
                }
            }
            let layout_after = ddp.buckets().iter().map(|b| b.bytes()).collect();
            Ok(RankRun {
                tensors: out,
                gradient_syncs: ddp.gradient_syncs(),
                layout_before,
                layout_after,
                names_after: ddp.bucket_names(),
                parameters: names(&params),
            })
        }
    }
}

/// The group the stage's wrapper runs on: with PyTorch's order of the bf16
/// hook, its bf16 sums in gloo's order, as PyTorch's are.
fn hooked_group(stage: &Stage, pg: Group) -> Group {
    match stage.bf16_hook {
        Some(Bf16Hook::PyTorchOrder) => in_gloo_order(pg),
        _ => pg,
    }
}

/// Registers the stage's bf16 hook, if it has one.
fn register_bf16_hook<M: Module>(stage: &Stage, ddp: &SimpleDistributedDataParallelism<M>) {
    match stage.bf16_hook {
        Some(Bf16Hook::WorkbookOrder) => ddp.register_comm_hook(bf16_compress_hook),
        Some(Bf16Hook::PyTorchOrder) => ddp.register_comm_hook(bf16_compress_hook_pytorch_order),
        None => {}
    }
}

fn names(params: &[(String, Tensor)]) -> Vec<String> {
    params.iter().map(|(name, _)| name.clone()).collect()
}

/// In place, as tch's `zero_grad` (and the oracle) do: a gradient that
/// lives in a bucket stays there.
fn zero_grads(params: &[(String, Tensor)]) {
    for (_, p) in params {
        let mut grad = p.grad();
        if grad.defined() {
            let _ = grad.zero_();
        }
    }
}

/// Copies of the gradients after micro-batch `m` of `step`.
fn record(params: &[(String, Tensor)], step: usize, m: usize, out: &mut Vec<(String, Tensor)>) {
    for (name, p) in params {
        let grad = p.grad();
        if grad.defined() {
            out.push((format!("step{step}.mb{m}.grad.{name}"), grad.copy()));
        }
    }
}

/// The optimizer of a stage run through the wrapper.
enum Optimizer {
    Sgd,
    AdamW(AdamW),
    Zero1(ShardedAdamW),
}

impl Optimizer {
    fn new(
        stage: &Stage,
        ddp: &SimpleDistributedDataParallelism<Twin>,
        pg: &Group,
        caps: BucketCaps,
    ) -> anyhow::Result<Optimizer> {
        let (lr, decay) = (stage.lr, stage.weight_decay);
        Ok(match stage.optimizer {
            StageOptimizer::Sgd => Optimizer::Sgd,
            StageOptimizer::AdamW => Optimizer::AdamW(AdamW::new(ddp.parameters(), lr, decay)),
            StageOptimizer::Zero1 => {
                Optimizer::Zero1(ShardedAdamW::new(ddp.parameters(), pg.clone(), caps, lr, decay)?)
            }
        })
    }
}

/// What `ddp.optimizer_step` drives: the AdamW stages' optimizers.
impl StepOptimizer for Optimizer {
    fn zero_grad(&mut self) {
        match self {
            Optimizer::Sgd => unreachable!("SGD stages zero and step by hand"),
            Optimizer::AdamW(adamw) => adamw.zero_grad(),
            Optimizer::Zero1(zero) => zero.zero_grad(),
        }
    }

    fn step(&mut self) -> Result<(), TchError> {
        match self {
            Optimizer::Sgd => unreachable!("SGD stages zero and step by hand"),
            Optimizer::AdamW(adamw) => StepOptimizer::step(adamw),
            Optimizer::Zero1(zero) => StepOptimizer::step(zero),
        }
    }

    fn skip_unused(&mut self, unused: &UnusedParameters) {
        match self {
            Optimizer::Sgd => {}
            Optimizer::AdamW(adamw) => adamw.skip_unused(unused),
            Optimizer::Zero1(zero) => zero.skip_unused(unused),
        }
    }
}

/// Copies of the parameters after `step`.
fn record_params(params: &[(String, Tensor)], step: usize, out: &mut Vec<(String, Tensor)>) {
    for (name, p) in params {
        out.push((format!("step{step}.param.{name}"), p.detach().copy()));
    }
}

/// Plain SGD, `p -= lr * grad`, written out as the oracle writes it, then
/// copies of the parameters.
fn sgd_step(params: &[(String, Tensor)], lr: f64, step: usize, out: &mut Vec<(String, Tensor)>) {
    ddp_workbook::tch::no_grad(|| {
        for (_, p) in params {
            let grad = p.grad();
            if grad.defined() {
                let mut p = p.shallow_clone();
                p -= &grad * lr;
            }
        }
    });
    record_params(params, step, out);
}

/// One rank of an `fsdp_*` stage with the library's FSDP ([`FullyShard`]):
/// units as the stage applies `fully_shard` (each GPT block and the root,
/// or the root alone), `reshard_after_forward` as it says, accumulation
/// through `set_requires_gradient_sync`, and [`FsdpSgd`] or [`FsdpAdamW`]
/// on the shards. Records what the oracle records from FSDP2, under the
/// same names: the full averaged gradients after the last micro-batch of a
/// step (gathered back, as `full_tensor()` does; none for a parameter
/// without a gradient shard, as FSDP2's `.grad` is then None) and the full
/// parameters after each step.
pub fn train_fsdp(stage: &Stage, pg: Group) -> anyhow::Result<RankRun> {
    train_fsdp_with(stage, pg, FsdpSchedule::default())
}

/// [`train_fsdp`] with `schedule`'s decisions (the rows, the divide
/// factors, ...) in place of the library's: how the tests perturb it.
pub fn train_fsdp_with(stage: &Stage, pg: Group, schedule: FsdpSchedule) -> anyhow::Result<RankRun> {
    ddp_workbook::tch::set_num_threads(1);
    let name = stage.name;
    let Some(shard) = stage.fully_shard else {
        anyhow::bail!("stage `{name}` is not trained under fully_shard: run it with `train`")
    };
    let rank = pg.rank();
    let (vs, model) = build(&stage.model);
    let params = named_parameters(&vs);
    let mut out = Vec::new();
    // Before sharding: FullyShard frees the model's full parameters.
    let first = micro_batch(stage, rank, 0, 0);
    out.push(("forward".to_string(), ddp_workbook::tch::no_grad(|| model.forward(&first.input))));
    let options = FsdpOptions {
        reshard_after_forward: shard.reshard_after_forward,
        schedule,
        ..FsdpOptions::default()
    };
    let fsdp = match (&model, shard.units) {
        (Twin::Gpt(gpt), FsdpUnits::PerBlock) => FullyShard::gpt(gpt, &vs, pg.clone(), options)?,
        (_, FsdpUnits::Root) => {
            FullyShard::new(&params, vec![("root".into(), (0..params.len()).collect())], pg.clone(), options)?
        }
        (_, FsdpUnits::PerBlock) => {
            anyhow::bail!("stage `{name}`: only the GPT has blocks to shard one by one; shard the root")
        }
    };
    let mut adamw = match stage.optimizer {
        StageOptimizer::Sgd => None,
        StageOptimizer::AdamW => Some(FsdpAdamW::new(&fsdp, stage.lr, stage.weight_decay)),
        StageOptimizer::Zero1 => anyhow::bail!("stage `{name}`: FSDP steps with SGD or AdamW, not ZeRO-1"),
    };
    let forward = |input: &Tensor| {
        fsdp.forward_with(|hooks| match &model {
            Twin::Gpt(gpt) => gpt.forward_with_hooks(input, hooks),
            other => other.forward(input), // one unit: no layer hooks to run
        })
    };
    for step in 0..stage.steps {
        fsdp.zero_grad(); // FSDP2's zero_grad(set_to_none=True)
        for m in 0..stage.micro_batches {
            let b = micro_batch(stage, rank, step, m);
            model.choose_branch(b.use_branch);
            let last = m + 1 == stage.micro_batches;
            match stage.no_sync {
                NoSync::Never => {}
                NoSync::AllButLast => fsdp.set_requires_gradient_sync(last),
                NoSync::ForwardOnly => anyhow::bail!("stage `{name}`: FSDP has no forward-only no_sync"),
            }
            fsdp.backward(&loss(stage, &forward(&b.input)?, &b.target))?;
            if last {
                record_full_gradients(&fsdp, &pg, &params, schedule, step, m, &mut out)?;
            }
        }
        match &mut adamw {
            Some(adamw) => adamw.step(&fsdp)?,
            None => FsdpSgd { lr: stage.lr }.step(&fsdp)?,
        }
        for (name, full) in fsdp.full_parameters()? {
            out.push((format!("step{step}.param.{name}"), full));
        }
    }
    Ok(RankRun { parameters: names(&params), ..RankRun::from_tensors(out) })
}

/// Every averaged gradient, gathered whole from the ranks' shards (each
/// padded to `ceil(rows / N)` rows, as FSDP2's `full_tensor()` gathers
/// them), after micro-batch `m` of `step`. A collective: every rank holds
/// a gradient shard of the same parameters.
fn record_full_gradients(
    fsdp: &FullyShard,
    pg: &Group,
    params: &[(String, Tensor)],
    schedule: FsdpSchedule,
    step: usize,
    m: usize,
    out: &mut Vec<(String, Tensor)>,
) -> anyhow::Result<()> {
    let world = pg.world_size();
    for p in fsdp.sharded_parameters() {
        let Some(grad) = p.grad else { continue };
        let (_, full) =
            params.iter().find(|(n, _)| *n == p.name).expect("FSDP shards the model's parameters");
        let rows = full.size().first().copied().unwrap_or(1);
        let row_numel = if rows == 0 { 0 } else { full.numel() as i64 / rows };
        let chunk = (rows + world as i64 - 1) / world as i64;
        let padded = Tensor::zeros([chunk * row_numel], (grad.kind(), grad.device()));
        padded.narrow(0, 0, grad.numel() as i64).copy_(&grad);
        let gathered = pg.all_gather(&padded)?;
        let whole = Tensor::zeros([rows * row_numel], (grad.kind(), grad.device()));
        for (r, part) in gathered.iter().enumerate() {
            let (start, count) = (schedule.shard_rows)(rows, world, r);
            whole.narrow(0, start * row_numel, count * row_numel).copy_(&part.narrow(
                0,
                0,
                count * row_numel,
            ));
        }
        out.push((format!("step{step}.mb{m}.grad.{}", p.name), whole.reshape(full.size())));
    }
    Ok(())
}

/// One rank of an AdamW `fsdp_*` stage with the library's ZeRO-2
/// ([`ShardGradOp`]: FSDP's SHARD_GRAD_OP, `fully_shard(
/// reshard_after_forward=False)`), the stage's `find_unused_parameters`,
/// accumulation through its `no_sync`. Records what the oracle records
/// from FSDP2, under the DDP runs' names: the full averaged gradients after
/// the last micro-batch of a step, gathered from the ranks' shards (none
/// for a parameter no rank gave a gradient: FSDP2's `.grad` is then None),
/// and the parameters after each step. ZeRO-2 steps AdamW only: an SGD
/// stage is refused.
pub fn train_zero2(stage: &Stage, pg: Group) -> anyhow::Result<RankRun> {
    ddp_workbook::tch::set_num_threads(1);
    let name = stage.name;
    let WorkbookSync::Wrapper { caps, find_unused } = stage.sync else {
        anyhow::bail!("stage `{name}` syncs naively: ZeRO-2 runs the stages of the DDP wrapper")
    };
    anyhow::ensure!(
        stage.optimizer == StageOptimizer::AdamW,
        "stage `{name}` steps by {:?}: ZeRO-2 shards AdamW's state and steps AdamW only; run it with \
         `train` or `train_fsdp`",
        stage.optimizer
    );
    let rank = pg.rank();
    let (vs, model) = build(&stage.model);
    let mut out = Vec::new();
    let first = micro_batch(stage, rank, 0, 0);
    out.push(("forward".to_string(), ddp_workbook::tch::no_grad(|| model.forward(&first.input))));
    let mut zero2 = ShardGradOp::new(model, &vs, pg.clone(), caps, stage.lr, stage.weight_decay)?
        .find_unused_parameters(find_unused);
    for step in 0..stage.steps {
        zero2.zero_grad()?;
        for m in 0..stage.micro_batches {
            let b = micro_batch(stage, rank, step, m);
            zero2.module().choose_branch(b.use_branch);
            let last = m + 1 == stage.micro_batches;
            let loss = loss(stage, &zero2.forward(&b.input), &b.target);
            match stage.no_sync {
                NoSync::Never => zero2.backward(&loss)?,
                NoSync::AllButLast if !last => {
                    let _no_sync = zero2.no_sync();
                    zero2.backward(&loss)?;
                }
                NoSync::AllButLast => zero2.backward(&loss)?,
                NoSync::ForwardOnly => anyhow::bail!("stage `{name}`: ZeRO-2 has no forward-only no_sync"),
            }
            if last {
                record_zero2_gradients(&zero2, &pg, step, m, &mut out)?;
            }
        }
        zero2.step()?;
        record_params(zero2.parameters(), step, &mut out);
    }
    Ok(RankRun { parameters: names(zero2.parameters()), ..RankRun::from_tensors(out) })
}

/// Every averaged gradient some rank computed, gathered whole from the
/// ranks' shards of each flat bucket, after micro-batch `m` of `step`. A
/// collective: every rank holds a shard of every bucket.
fn record_zero2_gradients(
    zero2: &ShardGradOp<Twin>,
    pg: &Group,
    step: usize,
    m: usize,
    out: &mut Vec<(String, Tensor)>,
) -> anyhow::Result<()> {
    let params = zero2.parameters();
    let without = zero2.without_gradient();
    for (b, (bucket, shard)) in zero2.layout().iter().zip(zero2.gradient_shards()).enumerate() {
        let Some(shard) = shard else {
            anyhow::bail!("bucket {b} holds no gradient shard after the step's synced backward")
        };
        let flat = Tensor::cat(&pg.all_gather(&shard)?, 0);
        let mut offset = 0;
        for &i in &bucket.params {
            let (name, p) = &params[i];
            let numel = p.numel() as i64;
            if !without.contains(name) {
                let grad = flat.narrow(0, offset, numel).view(p.size().as_slice()).copy();
                out.push((format!("step{step}.mb{m}.grad.{name}"), grad));
            }
            offset += numel;
        }
    }
    Ok(())
}
