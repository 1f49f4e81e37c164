//! PyTorch's FSDP2 (`fully_shard`) as an oracle: the `fsdp_*` stages of
//! stages.rs, which scripts/torch/oracle.py trains under `fully_shard` (per
//! transformer block and at the root, resharding after forward or not, SGD
//! and `AdamW(foreach=False)`, gloo, float64), against the workbook's run
//! of the same stage and against one process on the global batch.
//! Compiled into `cargo test --features solutions,mpi,nccl --test torch_oracle`.
//!
//! Why the workbook's DDP must give FSDP2's numbers. FSDP2 computes each
//! unit's forward and backward on the whole parameters (all-gathered: exact
//! copies), so every rank's local gradient is DDP's. Its average is a
//! reduce-scatter of a buffer that holds each rank's chunk of every
//! gradient of the unit (dim 0 split in `world_size` chunks, padded),
//! divided in float64 by a pre-factor before the sum and a post-factor
//! after it (`_get_gradient_divide_factors`): on 2 ranks (a/2 + b/2) and
//! nothing after, on 3 ranks (a/2 + b/2 + c/2) / 1.5. Division by 2 is
//! exact and commutes with each rounded addition, and (s/2)/1.5 is s/3
//! rounded once: so FSDP2's average is the rounded sum divided by the world
//! size, as the workbook's DDP computes it. On 2 ranks a + b has one order,
//! so the two agree bitwise. On 3 ranks gloo's reduce-scatter adds in its
//! ring order, which depends on where the element lies in the unit's
//! buffer (gloo_order.rs, checked against gloo by
//! `gloo_reduce_scatters_in_its_ring_order`): the ring's chunks are the
//! ranks' parts but for a few elements at their edges, so an element that
//! rank r keeps is mostly (x[r-1] + x[r-2]) + x[r]; the workbook's DDP adds
//! in rank order: the last bits differ, within the oracle's 3-rank bound. With its
//! sums in gloo's order (fsdp_order.rs) the workbook's naive sync gives
//! FSDP2's bits on 3 ranks too. The optimizer then steps each rank's shard
//! element by element, as the workbook's steps the whole tensor: the same
//! bits per element.
//!
//! The seam: each test calls [`stage_agrees`] with the workbook's run of a
//! stage (one rank, on a group; a [`WorkbookRun`]): the DDP wrapper
//! ([`ddp`]), and the library's FSDP ([`sharded`]: `ddp::FullyShard`,
//! resharding after forward or not as the stage says), which must give
//! FSDP2's bits on 2 and 3 ranks ([`stage_agrees_as`], `Agreement::Bitwise`):
//! it lays out each unit's reduce-scatter buffer as FSDP2's `_chunk_cat`
//! (rank r's part holds the r-th chunk of ceil(rows / N) rows of each
//! parameter with a gradient, padded), divides by the same pre- and
//! post-factors, and runs on a group that reduce-scatters in gloo's order
//! (`gloo_order::in_gloo_order`); the optimizers step each shard element by
//! element.

use std::time::Duration;

use ddp_workbook::check::{compare_to_reference, max_abs_diff, same_bits};
use ddp_workbook::ddp::{shard_rows, FsdpSchedule};
use ddp_workbook::dist::{spawn_with, DistError, Group, ReduceOp, SpawnOptions};
use ddp_workbook::models::named_parameters;
use ddp_workbook::tch::nn::Module;
use ddp_workbook::tch::Tensor;
use ddp_workbook::train::AdamW;

use crate::compare::{compare, Agreement};
use crate::forwarding::{Forwarding, Intercept};
use crate::fsdp_order::{in_fsdp2_order, rows_per_rank};
use crate::oracle_run::{self, torch_tensors};
use crate::stages::{
    self, build, by_name, loss, micro_batch, ModelSpec, Stage, StageOptimizer, WorkbookSync,
};
use crate::workbook::{train, train_fsdp, train_fsdp_with, train_zero2, RankRun};
use crate::{check_against_torch, gloo_order};

/// One rank of the workbook's side of a stage, on a group: what the
/// oracle's rank computed, under its names (workbook.rs).
pub trait WorkbookRun: Fn(&Stage, Group) -> anyhow::Result<RankRun> + Sync {}
impl<F: Fn(&Stage, Group) -> anyhow::Result<RankRun> + Sync> WorkbookRun for F {}

/// `run` on every rank of `world_size` in-process ranks.
fn ranks(stage: &Stage, world_size: usize, run: &impl WorkbookRun) -> Vec<RankRun> {
    let options = SpawnOptions::new(world_size).timeout(Duration::from_secs(60));
    spawn_with(options, |pg| run(stage, pg)).unwrap_or_else(|e| panic!("{}: a rank failed: {e}", stage.name))
}

/// An FSDP stage on 2 and 3 ranks: `run`'s ranks against PyTorch's
/// `fully_shard` (bitwise on 2 ranks, within the bound on 3), and PyTorch's
/// against one process on the global batch (within the bound).
pub fn stage_agrees(name: &str, run: impl WorkbookRun) {
    stage_agrees_as(name, run, Agreement::on);
}

/// [`stage_agrees`], with the agreement asked of `run` on each world size.
pub fn stage_agrees_as(name: &str, run: impl WorkbookRun, agreement: fn(usize) -> Agreement) {
    let stage = by_name(name);
    assert!(stage.fully_shard.is_some(), "stage `{name}` is not trained under fully_shard");
    for world_size in [2, 3] {
        let runs = ranks(&stage, world_size, &run);
        // A bound leaves out what rounding noise makes incomparable; bits
        // leave nothing out.
        let agreement = agreement(world_size);
        let compared = match agreement {
            Agreement::Bitwise => |_: &str| true,
            Agreement::Close => stages::compared(&stage, world_size),
        };
        check_against_torch(name, world_size, &runs, agreement, compared);
        equals_one_process(&stage, world_size);
    }
}

/// Largest absolute difference allowed between PyTorch's ranks and one
/// process on the global batch, per element: the chapter tests' bound for
/// DDP against one process (tests/common/mod.rs). Not bitwise: the gradient
/// of a batch of N x B rows sums its rows otherwise than N gradients of B
/// rows do. Not the 3-rank bound relative to each tensor's largest value
/// either: AdamW divides each gradient by its own running size, so where a
/// gradient is small, its rounding moves the step by more than the
/// gradient's relative error (measured: 3.1e-13 on the tiny GPT, 3.3e-12 of
/// `mlp.fc.weight`'s largest value, against 1e-16 under SGD).
pub const ONE_PROCESS_TOLERANCE: f64 = 1e-10;

/// PyTorch's ranks against one process on the global batch, within
/// [`ONE_PROCESS_TOLERANCE`]. The forward (on one rank's batch) is not
/// compared, nor, under AdamW on the tiny GPT, `attn.qkv.bias`
/// (stages::compared: its gradient is rounding noise, its steps as large
/// as the learning rate).
fn equals_one_process(stage: &Stage, world_size: usize) -> f64 {
    let ours = one_process(stage, world_size);
    let adamw_on_the_gpt = matches!(stage.model, ModelSpec::Gpt) && stage.optimizer != StageOptimizer::Sgd;
    let compared = |name: &str| name != "forward" && !(adamw_on_the_gpt && name.contains("attn.qkv.bias"));
    let pick = |tensors: Vec<(String, Tensor)>| -> Vec<(String, Tensor)> {
        tensors.into_iter().filter(|(n, _)| compared(n)).collect()
    };
    let ours = pick(ours);
    let mut largest = 0f64;
    for rank in 0..world_size {
        let torch = pick(torch_tensors(world_size, stage.name, rank));
        compare_to_reference(&torch, &ours, ONE_PROCESS_TOLERANCE).unwrap_or_else(|report| {
            panic!(
                "stage `{}` on {world_size} ranks: PyTorch's fully_shard, rank {rank}, against one process on \
                 the global batch: {}",
                stage.name,
                report.hint("both must average the same gradients: look at the first step and tensor listed")
            )
        });
        for (name, theirs) in &torch {
            let (_, mine) = ours.iter().find(|(n, _)| n == name).expect("compared above");
            largest = largest.max(max_abs_diff(mine, theirs));
        }
    }
    println!(
        "stage `{}` on {world_size} ranks against one process on the global batch: largest difference {largest:.3e} \
         (tolerance {ONE_PROCESS_TOLERANCE:e})",
        stage.name
    );
    largest
}

/// One process on the global batch: each micro-batch is every rank's rows
/// together (the mean loss over them is the mean of the ranks' means, the
/// ranks holding as many rows each), stepped as the stage says. Returns
/// the gradients after the last micro-batch and the parameters after each
/// step, under the oracle's names. A Branchy branch that no micro-batch of
/// the step takes has no gradient in it, as under PyTorch's AdamW (its
/// `.grad` is None): neither recorded nor stepped.
pub fn one_process(stage: &Stage, world_size: usize) -> Vec<(String, Tensor)> {
    ddp_workbook::tch::set_num_threads(1);
    let (vs, model) = build(&stage.model);
    let params = named_parameters(&vs);
    let mut adamw = match stage.optimizer {
        StageOptimizer::Sgd => None,
        StageOptimizer::AdamW => Some(AdamW::new(&params, stage.lr, stage.weight_decay)),
        StageOptimizer::Zero1 => panic!("stage `{}`: one process has no ZeRO-1 to run", stage.name),
    };
    let mut out = Vec::new();
    for step in 0..stage.steps {
        for (_, p) in &params {
            let mut grad = p.grad();
            if grad.defined() {
                let _ = grad.zero_();
            }
        }
        let mut branch_used = false;
        for m in 0..stage.micro_batches {
            let batches: Vec<_> = (0..world_size).map(|r| micro_batch(stage, r, step, m)).collect();
            let use_branch = batches[0].use_branch;
            let branchy = matches!(stage.model, ModelSpec::Branchy(_));
            assert!(
                !branchy || batches.iter().all(|b| b.use_branch == use_branch),
                "stage `{}`: ranks take different branches in step {step}: no global batch gives that",
                stage.name
            );
            branch_used |= use_branch;
            model.choose_branch(use_branch);
            let inputs: Vec<&Tensor> = batches.iter().map(|b| &b.input).collect();
            let targets: Vec<&Tensor> = batches.iter().map(|b| &b.target).collect();
            let output = model.forward(&Tensor::cat(&inputs, 0));
            loss(stage, &output, &Tensor::cat(&targets, 0)).backward();
        }
        let no_gradient = |name: &str| {
            matches!(stage.model, ModelSpec::Branchy(_)) && !branch_used && name.starts_with("branch.")
        };
        let last = stage.micro_batches - 1;
        for (name, p) in params.iter().filter(|(n, p)| p.grad().defined() && !no_gradient(n)) {
            out.push((format!("step{step}.mb{last}.grad.{name}"), p.grad().copy()));
        }
        match &mut adamw {
            Some(adamw) => {
                let skipped: Vec<String> =
                    params.iter().map(|(n, _)| n.clone()).filter(|n| no_gradient(n)).collect();
                adamw.skip_in_next_step(&skipped);
                adamw.step().unwrap_or_else(|e| panic!("stage `{}`: AdamW's step failed: {e}", stage.name));
            }
            None => ddp_workbook::tch::no_grad(|| {
                for (_, p) in &params {
                    let mut p = p.shallow_clone();
                    p -= p.grad() * stage.lr;
                }
            }),
        }
        for (name, p) in &params {
            out.push((format!("step{step}.param.{name}"), p.detach().copy()));
        }
    }
    out
}

/// The workbook's DDP with the stage's optimizer: what FSDP must equal.
fn ddp(stage: &Stage, pg: Group) -> anyhow::Result<RankRun> {
    train(stage, pg)
}

/// The library's FSDP ([`train_fsdp`]), `reshard_after_forward` as the
/// stage says, on a group whose float64 reduce-scatters add in gloo's ring
/// order: its unit buffers are laid out as FSDP2's (each parameter's r-th
/// chunk of ceil(rows / N) rows, padded, in rank r's part) and divided by
/// the same pre- and post-factors, so it must give FSDP2's bits on any
/// number of ranks.
pub fn sharded(stage: &Stage, pg: Group) -> anyhow::Result<RankRun> {
    train_fsdp(stage, gloo_order::in_gloo_order(pg))
}

/// The workbook's naive sync (one all-reduce per parameter, sum then divide
/// by the world size) and SGD, its sums added in the order FSDP2's gloo
/// reduce-scatter adds them (fsdp_order.rs).
fn naive_sync_in_fsdp2_order(stage: &Stage, pg: Group) -> anyhow::Result<RankRun> {
    anyhow::ensure!(stage.optimizer == StageOptimizer::Sgd, "the naive sync's stages step by SGD");
    let naive = Stage { sync: WorkbookSync::Naive, ..stage.clone() };
    train(&naive, in_fsdp2_order(stage, pg))
}

/// FSDP2's float64 average on 3 ranks, (a/2 + b/2 + c/2) / 1.5, is the sum
/// divided by 3 rounded once (module comment): with the sum added in gloo's
/// order, the workbook's naive sync gives its bits. Without that order it
/// does not, so the order is the whole of the 3-rank difference.
#[test]
fn on_3_ranks_fully_shard_differs_from_the_workbooks_sync_only_by_glooss_order_of_additions() {
    // On 2 ranks the order cannot matter: the other tests hold these stages
    // to PyTorch's bits there.
    for name in ["fsdp_gpt_sgd", "fsdp_mlp_sgd", "fsdp_two_rows", "fsdp_gpt_accumulate"] {
        let stage = by_name(name);
        let runs = ranks(&stage, 3, &naive_sync_in_fsdp2_order);
        check_against_torch(name, 3, &runs, Agreement::Bitwise, |_| true);
        let plain = |stage: &Stage, pg| train(&Stage { sync: WorkbookSync::Naive, ..stage.clone() }, pg);
        let runs = ranks(&stage, 3, &plain);
        let torch = torch_tensors(3, name, 0);
        let differs = runs[0].tensors.iter().filter(|(n, _)| n != "forward").any(|(n, ours)| {
            let (_, theirs) =
                torch.iter().find(|(t, _)| t == n).unwrap_or_else(|| panic!("PyTorch wrote no {n}"));
            !same_bits(ours, theirs)
        });
        assert!(
            differs,
            "stage `{name}`: the naive sync in rank order gives FSDP2's bits on 3 ranks: this test cannot \
             tell orders apart"
        );
    }
}

#[test]
fn fully_shard_per_block_with_sgd_equals_the_workbooks_fsdp_ddp_and_one_process() {
    stage_agrees("fsdp_gpt_sgd", ddp);
    stage_agrees_as("fsdp_gpt_sgd", sharded, |_| Agreement::Bitwise);
    stage_agrees("fsdp_gpt_sgd_keep", ddp);
    stage_agrees_as("fsdp_gpt_sgd_keep", sharded, |_| Agreement::Bitwise);
}

#[test]
fn fully_shard_per_block_with_adamw_equals_the_workbooks_fsdp_ddp_and_one_process() {
    stage_agrees("fsdp_gpt_adamw", ddp);
    stage_agrees_as("fsdp_gpt_adamw", sharded, |_| Agreement::Bitwise);
    stage_agrees("fsdp_gpt_adamw_keep", ddp);
    stage_agrees_as("fsdp_gpt_adamw_keep", sharded, |_| Agreement::Bitwise);
    stage_agrees("fsdp_gpt_root_adamw", ddp);
    stage_agrees_as("fsdp_gpt_root_adamw", sharded, |_| Agreement::Bitwise);
}

#[test]
fn fully_shard_at_the_root_of_the_mlp_with_empty_shards_equals_the_workbooks_fsdp_and_ddp() {
    stage_agrees("fsdp_mlp_sgd", ddp);
    stage_agrees_as("fsdp_mlp_sgd", sharded, |_| Agreement::Bitwise);
    stage_agrees("fsdp_mlp_adamw_keep", ddp);
    stage_agrees_as("fsdp_mlp_adamw_keep", sharded, |_| Agreement::Bitwise);
    stage_agrees("fsdp_two_rows", ddp);
    stage_agrees_as("fsdp_two_rows", sharded, |_| Agreement::Bitwise);
}

#[test]
fn fully_shard_accumulating_without_gradient_sync_equals_the_workbooks_fsdp_and_ddps_no_sync() {
    stage_agrees("fsdp_gpt_accumulate", ddp);
    stage_agrees_as("fsdp_gpt_accumulate", sharded, |_| Agreement::Bitwise);
}

#[test]
fn fully_shard_leaves_a_parameter_no_rank_used_as_the_workbooks_fsdp_and_ddp_with_adamw_do() {
    stage_agrees("fsdp_unused_gap", ddp);
    stage_agrees_as("fsdp_unused_gap", sharded, |_| Agreement::Bitwise);
}

/// The rows of each parameter that PyTorch's rank `rank` keeps, by name.
fn torch_shard_rows(world_size: usize, stage: &str, rank: usize) -> Vec<(String, i64)> {
    let path = oracle_run::oracle(world_size).join(stage).join(format!("torch_shard_rows_rank{rank}.txt"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    text.lines()
        .map(|line| {
            let (name, rows) = line.split_once(' ').unwrap_or_else(|| panic!("{}: `{line}`", path.display()));
            (name.to_string(), rows.parse().unwrap_or_else(|e| panic!("{}: `{line}`: {e}", path.display())))
        })
        .collect()
}

/// Each of PyTorch's ranks keeps the rows fsdp_order.rs lays out (chunks of
/// ceil(rows / N) rows, the last ranks fewer or none), and the stages hold
/// the empty shards they say they do: rank 1 of 2 and ranks 1 and 2 of 3
/// none of the MLP's 1-row last layer, rank 2 of 3 none of the 2-row one.
#[test]
fn fully_shard_keeps_the_rows_the_layout_says_and_some_ranks_none() {
    let mut empty = Vec::new();
    for world_size in [2, 3] {
        for stage in stages::stages().into_iter().filter(|s| s.fully_shard.is_some()) {
            let (vs, _) = build(&stage.model);
            let params = named_parameters(&vs);
            for rank in 0..world_size {
                let kept = torch_shard_rows(world_size, stage.name, rank);
                let names: Vec<&String> = kept.iter().map(|(n, _)| n).collect();
                assert_eq!(
                    names,
                    params.iter().map(|(n, _)| n).collect::<Vec<_>>(),
                    "stage `{}`: PyTorch's parameters are not the workbook's, in its order",
                    stage.name
                );
                for ((name, p), (_, rows)) in params.iter().zip(&kept) {
                    let per = rows_per_rank(p.size()[0], world_size);
                    let expected = (p.size()[0] - rank as i64 * per).clamp(0, per);
                    assert_eq!(
                        *rows, expected,
                        "stage `{}` on {world_size} ranks: PyTorch's rank {rank} keeps {rows} rows of `{name}`, \
                         fsdp_order.rs lays out {expected}",
                        stage.name
                    );
                    if expected == 0 {
                        empty.push(format!("{world_size}:{}:{rank}:{name}", stage.name));
                    }
                }
            }
        }
    }
    for shard in [
        "2:fsdp_mlp_sgd:1:layers.2.weight",
        "3:fsdp_mlp_sgd:2:layers.2.weight",
        "3:fsdp_two_rows:2:layers.1.weight",
    ] {
        assert!(
            empty.iter().any(|e| e == shard),
            "no empty shard {shard} (world size:stage:rank:parameter) in {empty:?}"
        );
    }
}

/// gloo's float64 reduce-scatter of buffers of several lengths, and every
/// rank's input, from the oracle's runs: the workbook's in-process ranks,
/// through gloo_order.rs's group, must give each rank gloo's bits, where
/// a sum in rank order does not on 3 ranks. (The group the library's FSDP
/// and ZeRO-2 runs reduce-scatter on to match FSDP2 bitwise on 3 ranks.)
#[test]
fn gloo_reduce_scatters_in_its_ring_order() {
    for world_size in [2, 3] {
        let path = oracle_run::oracle(world_size).join("f64_reduce_scatter").join("gloo.safetensors");
        let tensors =
            Tensor::read_safetensors(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let get = |name: String| {
            tensors
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, t)| t.shallow_clone())
                .unwrap_or_else(|| panic!("{} holds no {name}", path.display()))
        };
        let lengths: Vec<String> =
            tensors.iter().filter_map(|(n, _)| n.strip_suffix(".output0").map(String::from)).collect();
        assert!(lengths.len() >= 5, "{} holds the reduce-scatters of {lengths:?} only", path.display());
        let mut rank_order_differs = false;
        for length in lengths {
            let inputs: Vec<Tensor> = (0..world_size).map(|r| get(format!("{length}.rank{r}"))).collect();
            let outputs: Vec<Tensor> = (0..world_size).map(|r| get(format!("{length}.output{r}"))).collect();
            let options = SpawnOptions::new(world_size).timeout(Duration::from_secs(60));
            // Tensors are not Sync: each rank gets its input as numbers.
            let numbers: Vec<Vec<f64>> = inputs.iter().map(|t| Vec::<f64>::try_from(t).unwrap()).collect();
            let ours = spawn_with(options, |pg| {
                let input = Tensor::from_slice(&numbers[pg.rank()]);
                Ok(gloo_order::in_gloo_order(pg).reduce_scatter(&input, ReduceOp::Sum)?)
            })
            .unwrap_or_else(|e| panic!("a rank failed: {e}"));
            let in_rank_order = inputs[1..].iter().fold(inputs[0].copy(), |s, c| s + c);
            let part = outputs[0].numel() as i64;
            for (rank, (ours, gloo)) in ours.iter().zip(&outputs).enumerate() {
                assert!(
                    same_bits(ours, gloo),
                    "{length} elements a rank on {world_size} ranks, rank {rank}: gloo_order.rs does not \
                     reduce-scatter in gloo's order"
                );
                rank_order_differs |= !same_bits(&in_rank_order.narrow(0, rank as i64 * part, part), gloo);
            }
        }
        assert_eq!(
            rank_order_differs,
            world_size == 3,
            "on {world_size} ranks, gloo's reduce-scatter and a sum in rank order differ: {rank_order_differs} \
             (on 2 ranks a + b has one order; on 3 they must differ, or this test cannot tell orders apart)"
        );
    }
}

/// The library's FSDP with `schedule` in place of its own, on `world_size`
/// ranks of stage `name`: each rank's tensors against PyTorch's, compared
/// as `agreement` says (the error, if they differ).
fn perturbed(
    name: &str,
    world_size: usize,
    schedule: FsdpSchedule,
    agreement: Agreement,
) -> Result<(), String> {
    let stage = by_name(name);
    let run = |stage: &Stage, pg: Group| train_fsdp_with(stage, gloo_order::in_gloo_order(pg), schedule);
    for (rank, run) in ranks(&stage, world_size, &run).iter().enumerate() {
        let what = format!("stage `{name}` on {world_size} ranks, rank {rank}");
        let measured = compare(&what, &run.tensors, &torch_tensors(world_size, name, rank), agreement)?;
        println!(
            "{what}, perturbed, {agreement:?}: largest difference from PyTorch {:.3e}",
            measured.max_abs_diff
        );
    }
    Ok(())
}

/// The stages catch a wrong FSDP: one that sums the gradients without
/// dividing by the world size, and, on 3 ranks, one that keeps other rows
/// per rank (each rank the chunk FSDP2 gives the rank after it): its
/// numbers are as right, within the bound, but its reduce-scatter buffer
/// holds other elements where gloo's ring adds in another order, so its
/// bits are not FSDP2's.
#[test]
fn fully_shard_stages_catch_a_wrong_divide_factor_and_another_layout() {
    let sums = FsdpSchedule { divide_factors: |_| (1.0, 1.0), ..FsdpSchedule::default() };
    let error =
        perturbed("fsdp_mlp_sgd", 2, sums, Agreement::Close).expect_err("a sum passed for an average");
    assert!(error.contains(".grad."), "the sum's gradients must be reported first: {error}");
    println!("{error}");
    let rotated = FsdpSchedule {
        shard_rows: |rows, world_size, rank| shard_rows(rows, world_size, (rank + 1) % world_size),
        ..FsdpSchedule::default()
    };
    perturbed("fsdp_gpt_sgd", 3, rotated, Agreement::Close)
        .expect("another layout is as right, within the bound");
    let error = perturbed("fsdp_gpt_sgd", 3, rotated, Agreement::Bitwise)
        .expect_err("another layout gave FSDP2's bits");
    assert!(error.contains("not bitwise equal"), "{error}");
}

/// The `fully_shard(reshard_after_forward=False)` stages ZeRO-2 (FSDP's
/// SHARD_GRAD_OP) can run: the AdamW ones (ZeRO-2 steps AdamW only;
/// `train_zero2` refuses `fsdp_gpt_sgd_keep`), and `fsdp_unused_gap`,
/// whose PyTorch run reshards after forward: resharding changes when
/// FSDP2 frees parameters, not one number (the library's FSDP gives its
/// bits either way), and it is the stage with a parameter no rank uses.
pub const ZERO2_STAGES: [&str; 3] = ["fsdp_gpt_adamw_keep", "fsdp_mlp_adamw_keep", "fsdp_unused_gap"];

/// The library's ZeRO-2 against PyTorch's `fully_shard` without resharding
/// after forward: bitwise on 2 ranks, within the oracle's bound on 3.
///
/// Why not bitwise on 3 ranks. ZeRO-2 reduce-scatters DDP's flat buckets
/// (the members' gradients back to back, padded to N equal parts) and
/// divides the sum by N once, as DDP does; FSDP2's (a/2 + b/2 + c/2) / 1.5
/// is that same sum divided by 3 rounded once (module comment), so the
/// division agrees. The additions do not: gloo adds each element in the
/// ring order of its position in the buffer, and an element's position in
/// a flat bucket is not its position in FSDP2's `_chunk_cat` buffer (rank
/// r's part: the r-th ceil(rows / N)-row chunk of each parameter), and on
/// in-process ranks the library sums in rank order anyway. Only a sum in
/// gloo's order over FSDP2's layout would give its bits, which
/// fsdp_order.rs does for the naive sync; so on 3 ranks the honest claim
/// is the bound, and this test checks that bits do differ there (the
/// bound is then the tightest agreement that holds).
///
/// Also: a parameter no rank used gets no gradient and is not stepped by
/// AdamW, as FSDP2's `.grad` is None and PyTorch's AdamW skips it: the
/// names compared are PyTorch's (no gradient recorded for the unused
/// branch in steps 3 and 5) and its parameters bitwise on 2 ranks.
#[test]
fn zero2_equals_fully_shard_without_resharding_after_forward() {
    let mut three_rank_bits_differ = false;
    for name in ZERO2_STAGES {
        let stage = by_name(name);
        for world_size in [2, 3] {
            let runs = ranks(&stage, world_size, &train_zero2);
            let agreement = Agreement::on(world_size);
            let compared = match agreement {
                Agreement::Bitwise => |_: &str| true,
                Agreement::Close => stages::compared(&stage, world_size),
            };
            check_against_torch(name, world_size, &runs, agreement, compared);
            if world_size == 3 {
                three_rank_bits_differ |= runs.iter().enumerate().any(|(rank, run)| {
                    compare("", &run.tensors, &torch_tensors(3, name, rank), Agreement::Bitwise).is_err()
                });
            }
        }
    }
    assert!(
        three_rank_bits_differ,
        "ZeRO-2 gave FSDP2's bits on 3 ranks on every stage: hold it to Agreement::Bitwise there"
    );
    let Err(error) = ranks_result(&by_name("fsdp_gpt_sgd_keep"), 2, &train_zero2) else {
        panic!("ZeRO-2 ran an SGD stage, though it steps AdamW only")
    };
    assert!(error.contains("steps AdamW only"), "{error}");
}

/// `run` on every rank, or the first rank's error.
fn ranks_result(stage: &Stage, world_size: usize, run: &impl WorkbookRun) -> Result<Vec<RankRun>, String> {
    let options = SpawnOptions::new(world_size).timeout(Duration::from_secs(60));
    spawn_with(options, |pg| run(stage, pg)).map_err(|e| e.to_string())
}

/// A group whose reduce-scatter delivers the sum times the world size:
/// ZeRO-2's division by the world size then leaves the sum, not the
/// average, in each rank's gradient shard.
struct TimesWorldSize;

impl Intercept for TimesWorldSize {
    fn reduce_scatter(&self, inner: &Group, tensor: &Tensor, op: ReduceOp) -> Result<Tensor, DistError> {
        Ok(inner.reduce_scatter(tensor, op)? * inner.world_size() as f64)
    }
}

/// The ZeRO-2 stages catch a ZeRO-2 that keeps the sum of the gradients,
/// not their average: its gradients are off by the world size, reported
/// first.
#[test]
fn zero2_stages_catch_a_wrong_division() {
    let name = "fsdp_mlp_adamw_keep";
    let run = |stage: &Stage, pg: Group| {
        let sums: Group = std::sync::Arc::new(Forwarding {
            inner: pg,
            name: "sums, not averages",
            intercept: TimesWorldSize,
        });
        train_zero2(stage, sums)
    };
    let runs = ranks(&by_name(name), 2, &run);
    let error = compare("perturbed ZeRO-2", &runs[0].tensors, &torch_tensors(2, name, 0), Agreement::Close)
        .expect_err("a sum passed for an average");
    assert!(error.contains(".grad."), "the sum's gradients must be reported: {error}");
    println!("{error}");
}
