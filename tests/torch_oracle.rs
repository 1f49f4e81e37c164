//! PyTorch's own DistributedDataParallel as the oracle: the workbook's DDP
//! and PyTorch's, on the same model (the PyTorch twins of
//! scripts/torch/models.py, with the workbook's names), the same initial
//! weights (written by the workbook) and the same per-rank batches, in
//! float64, compute the same gradients and parameters after every step: on
//! 2 ranks bitwise, on 3 within a stated bound (tests/torch_oracle/compare.rs).
//! Stepped by SGD written out on both sides, or by the training run's AdamW
//! and the library's ZeRO-1 against PyTorch's AdamW and
//! ZeroRedundancyOptimizer (stages.rs).
//! PyTorch's FSDP2 (`fully_shard`) is an oracle too: its stages are held
//! to the workbook's DDP and to one process on the global batch, through a
//! seam where the library's FSDP and ZeRO-2 runs plug in (fsdp.rs).
//! PyTorch runs once per world size for every stage, under
//! `.venv/bin/torchrun --standalone` with gloo on loopback
//! (scripts/torch/oracle.py); each test is one stage, on 2 and 3 ranks.
//!
//! Run:   cargo test --features solutions,mpi,nccl --test torch_oracle -- --nocapture
//!        (prints what each stage measured on 3 ranks)
//! Needs: the project's .venv with torch (scripts/setup.sh).

#[path = "torch_oracle/branchy.rs"]
mod branchy;
#[path = "torch_oracle/compare.rs"]
mod compare;
#[path = "common/forwarding.rs"]
#[allow(dead_code)] // the oracle uses one of its intercepts
mod forwarding;
#[path = "torch_oracle/fsdp.rs"]
mod fsdp;
#[path = "torch_oracle/fsdp_order.rs"]
mod fsdp_order;
#[path = "torch_oracle/gloo_order.rs"]
mod gloo_order;
#[path = "torch_oracle/inputs.rs"]
mod inputs;
#[path = "torch_oracle/layouts.rs"]
mod layouts;
#[path = "torch_oracle/oracle_run.rs"]
mod oracle_run;
#[path = "torch_oracle/stages.rs"]
mod stages;
#[path = "torch_oracle/workbook.rs"]
mod workbook;

#[cfg(feature = "mpi")]
#[allow(dead_code)]
#[path = "mpi/harness.rs"]
mod harness;
#[cfg(feature = "mpi")]
#[path = "torch_oracle/on_mpi.rs"]
mod on_mpi;

use std::time::Duration;

use ddp_workbook::check::{max_abs_diff, same_bits};
use ddp_workbook::dist::{spawn_with, SpawnOptions};
use ddp_workbook::tch::Tensor;

use compare::{compare, Agreement, Measured};
use oracle_run::torch_tensors;
use stages::by_name;
use workbook::{train, RankRun};

/// The workbook's ranks of `stage` on the in-process backend.
fn workbook_ranks(stage: &str, world_size: usize) -> Vec<RankRun> {
    let stage = by_name(stage);
    let options = SpawnOptions::new(world_size).timeout(Duration::from_secs(60));
    spawn_with(options, |pg| train(&stage, pg))
        .unwrap_or_else(|e| panic!("{}: a rank failed: {e}", stage.name))
}

/// Compares every rank's tensors with PyTorch's rank's, bitwise on 2 ranks
/// and within the bound on 3, and prints what it measured.
/// `compared` picks the tensors, by name.
fn check_against_torch(
    stage: &str,
    world_size: usize,
    runs: &[RankRun],
    agreement: Agreement,
    compared: fn(&str) -> bool,
) -> Measured {
    let mut measured = Measured::default();
    for (rank, run) in runs.iter().enumerate() {
        let what = format!("stage `{stage}` on {world_size} ranks, rank {rank}");
        let pick = |tensors: &[(String, Tensor)]| -> Vec<(String, Tensor)> {
            tensors.iter().filter(|(n, _)| compared(n)).map(|(n, t)| (n.clone(), t.shallow_clone())).collect()
        };
        let (ours, torch) = (pick(&run.tensors), pick(&torch_tensors(world_size, stage, rank)));
        measured = measured.merge(compare(&what, &ours, &torch, agreement).unwrap_or_else(|e| panic!("{e}")));
    }
    println!(
        "stage `{stage}` on {world_size} ranks, {agreement:?}: largest difference from PyTorch {:.3e} \
         ({:.3e} of the tensor's largest value)",
        measured.max_abs_diff, measured.max_relative
    );
    measured
}

/// A stage on 2 ranks (bitwise) and on 3 (within the bound, or as the
/// stage demands: `Agreement::of`), comparing what `stages::compared` says.
fn stage_agrees(stage: &str) {
    for world_size in [2, 3] {
        let runs = workbook_ranks(stage, world_size);
        let agreement = Agreement::of(&by_name(stage), world_size)
            .unwrap_or_else(|| panic!("stage `{stage}` has no agreement to check on {world_size} ranks"));
        let compared = stages::compared(&by_name(stage), world_size);
        check_against_torch(stage, world_size, &runs, agreement, compared);
    }
}

#[test]
fn the_twins_load_the_workbook_weights_and_give_its_forward_bitwise() {
    // The oracle loads each stage's weights with load_state_dict(strict=True)
    // (a missing or extra name fails it) and writes its forward on the first
    // batch before DDP touches the model.
    for stage in ["naive", "buckets_default", "find_unused"] {
        let runs = workbook_ranks(stage, 2);
        check_against_torch(stage, 2, &runs, Agreement::Bitwise, |name| name == "forward");
    }
}

#[test]
fn naive_sync_per_parameter_equals_pytorch_ddp() {
    stage_agrees("naive");
}

#[test]
fn wrapper_buckets_with_the_default_cap_equal_pytorch_ddp() {
    stage_agrees("buckets_default");
}

#[test]
fn wrapper_buckets_with_a_small_cap_equal_pytorch_ddp_with_a_small_bucket_cap_mb() {
    assert_eq!(stages::SMALL_CAP_MB, 0.0625, "stages.rs passes bucket_cap_mb=0.0625 to PyTorch");
    stage_agrees("buckets_small");
}

#[test]
fn no_sync_accumulation_equals_pytorch_ddp() {
    stage_agrees("no_sync");
}

#[test]
fn find_unused_parameters_equals_pytorch_ddp_when_a_rank_skips_a_branch() {
    stage_agrees("find_unused");
}

#[test]
fn gradient_as_bucket_view_in_pytorch_gives_the_workbooks_numbers() {
    stage_agrees("bucket_view");
}

#[test]
fn ddp_with_adamw_equals_pytorch_ddp_with_adamw() {
    stage_agrees("adamw");
}

#[test]
fn zero_1_equals_pytorchs_zero_redundancy_optimizer_over_adamw() {
    stage_agrees("zero1");
}

#[test]
fn on_the_tiny_gpt_adamw_and_zero_1_equal_pytorch() {
    stage_agrees("adamw_gpt");
    stage_agrees("zero1_gpt");
}

/// A branch used by every rank in steps 1, 2 and 4 and by none in 3 and 5:
/// PyTorch's AdamW leaves it where it is in 3 and 5 (its gradient is
/// `None`), no momentum, no weight decay, and its step count stays behind.
#[test]
fn adamw_leaves_a_parameter_no_rank_used_as_pytorch_does() {
    stage_agrees("adamw_unused_gap");
    stage_agrees("zero1_unused_gap");
}

/// A branch used by no rank in steps 1 and 2, by every rank from step 3:
/// its first update is its first step for the bias correction.
#[test]
fn adamw_counts_steps_per_parameter_as_pytorch_does() {
    stage_agrees("adamw_unused_late");
    stage_agrees("zero1_unused_late");
}

/// A branch used only in a micro-batch inside `no_sync`: it has a gradient
/// in that step, which PyTorch's DDP counts (its map of used parameters
/// spans the backward passes since the last sync), so it is stepped.
#[test]
fn a_parameter_used_only_inside_no_sync_is_stepped_as_pytorch_steps_it() {
    stage_agrees("adamw_unused_no_sync");
    stage_agrees("zero1_unused_no_sync");
}

/// A branch used in the first of two synced backward passes of a step: the
/// second leaves its gradient as the first made it (PyTorch's DDP does not
/// touch a gradient no rank computed), and AdamW steps it.
#[test]
fn a_parameter_used_in_an_earlier_sync_of_the_step_is_stepped_as_pytorch_steps_it() {
    stage_agrees("adamw_unused_two_syncs");
}

/// PyTorch reads `no_sync` when the forward runs: a forward inside the
/// scope and its backward after it sends nothing, and the rank keeps its
/// own gradient until the next synced backward adds its own and averages
/// the sum. The workbook reads the switch when `backward` runs, so it
/// averages that backward at once and the next one again. The step's
/// result is the same average, up to the rounding of two sums instead of
/// one (so not bitwise, even on 2 ranks); the workbook syncs twice.
/// In the stage `no_sync_forward_only`, every tensor but the gradients
/// after its first micro-batch, where PyTorch has not synced yet.
fn after_the_deferred_sync(name: &str) -> bool {
    !name.contains(".mb0.grad.")
}

#[test]
fn forward_inside_no_sync_backward_outside_pytorch_defers_the_workbook_syncs_at_once() {
    let stage = by_name("no_sync_forward_only");
    for world_size in [2, 3] {
        let runs = workbook_ranks(stage.name, world_size);
        let torch: Vec<_> = (0..world_size).map(|r| torch_tensors(world_size, stage.name, r)).collect();
        let after_first = |tensors: &[(String, Tensor)]| -> Vec<Tensor> {
            tensors
                .iter()
                .filter(|(n, _)| n.starts_with("step0.mb0.grad."))
                .map(|(_, t)| t.shallow_clone())
                .collect()
        };
        // PyTorch: after the first backward, every rank holds its own gradient.
        let (torch0, torch1) = (after_first(&torch[0]), after_first(&torch[1]));
        assert!(
            torch0.iter().zip(&torch1).any(|(a, b)| !same_bits(a, b)),
            "PyTorch's ranks 0 and 1 hold the same gradient after a backward whose forward ran inside \
             no_sync: then PyTorch synced it, which this test says it does not"
        );
        // The workbook: the average of what PyTorch's ranks kept.
        for (i, grad) in after_first(&runs[0].tensors).iter().enumerate() {
            let mean = torch.iter().map(|t| after_first(t)[i].shallow_clone()).reduce(|a, b| a + b).unwrap()
                / world_size as f64;
            let diff = max_abs_diff(grad, &mean);
            assert!(diff <= 1e-14, "the workbook's gradient after that backward is not the mean of PyTorch's ranks' ({diff:e} apart)");
        }
        let steps = stage.steps as u64;
        assert_eq!(runs[0].gradient_syncs, 2 * steps, "the workbook syncs both backward passes of each step");
        // And the rest agrees, within the bound, on 2 ranks too.
        check_against_torch(stage.name, world_size, &runs, Agreement::Close, after_the_deferred_sync);
    }
}

#[test]
fn bf16_hook_in_pytorchs_order_equals_pytorchs_bf16_compress_hook_bitwise_on_2_and_3_ranks() {
    // ddp::bf16_compress_hook_pytorch_order against PyTorch's DDP with its
    // default_hooks.bf16_compress_hook, every gradient and parameter of 3
    // steps of the tiny GPT in 64 KiB buckets, with the workbook's bf16 sums
    // in gloo's order (gloo_order.rs).
    stage_agrees("bf16_hook_pytorch_order");
}

#[test]
fn bf16_hook_in_the_workbooks_order_equals_pytorchs_bf16_compress_hook_bitwise_on_2_ranks() {
    let runs = workbook_ranks("bf16_hook", 2);
    check_against_torch("bf16_hook", 2, &runs, Agreement::Bitwise, |_| true);
}

/// The first step's gradients: both sides start from the same weights.
fn first_gradients(name: &str) -> bool {
    name.starts_with("step0.mb0.grad.")
}

#[test]
fn the_workbooks_bf16_order_rounds_once_less_than_pytorchs_on_3_ranks() {
    // ddp::bf16_compress_hook divides before the cast, PyTorch's hook after
    // it, in bf16: on 3 ranks some of the first step's averaged gradients
    // differ, even with the sums in gloo's order. (That the workbook's order
    // rounds less is chapter 12's to show, in one process: tests/chapter_12.rs.)
    let runs = spawn_with(SpawnOptions::new(3).timeout(Duration::from_secs(60)), |pg| {
        train(&by_name("bf16_hook"), gloo_order::in_gloo_order(pg))
    })
    .unwrap_or_else(|e| panic!("bf16_hook: a rank failed: {e}"));
    let torch = torch_tensors(3, "bf16_hook", 0);
    let (mut differing, mut compared) = (0, 0);
    for (name, ours) in runs[0].tensors.iter().filter(|(n, _)| first_gradients(n)) {
        let (_, theirs) =
            torch.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("PyTorch wrote no {name}"));
        compared += ours.numel();
        differing += ours.ne_tensor(theirs).sum(ddp_workbook::tch::Kind::Int64).int64_value(&[]) as usize;
    }
    println!(
        "bf16_hook on 3 ranks: {differing} of {compared} first-step gradient elements differ from PyTorch's"
    );
    assert!(compared > 0, "no first-step gradients to compare");
    assert!(
        differing > 0,
        "the workbook's bf16 hook gave PyTorch's bits on 3 ranks: then it divides in bf16 as PyTorch does, \
         which it says it does not (src/ddp/reducer/bf16_hooks.rs)"
    );
}

#[test]
fn the_gloo_order_group_sums_as_gloo_does() {
    // gloo's bf16 all-reduce of buffers of several lengths on 3 ranks, and
    // every rank's contribution: gloo_order.rs's sum must give its bits,
    // where a sum in rank order does not.
    let path = oracle_run::oracle(3).join("bf16_sums").join("gloo.safetensors");
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
        tensors.iter().filter_map(|(n, _)| n.strip_suffix(".sum").map(String::from)).collect();
    assert!(lengths.len() >= 5, "{} holds the sums of {lengths:?} only", path.display());
    let mut rank_order_differs = false;
    for length in lengths {
        let contributions: Vec<Tensor> = (0..3).map(|r| get(format!("{length}.rank{r}"))).collect();
        let gloo = get(format!("{length}.sum"));
        assert!(
            same_bits(&gloo_order::gloo_ring_sum(&contributions), &gloo),
            "{length} elements: gloo_order.rs does not add in gloo's order"
        );
        let in_rank_order = contributions[1..].iter().fold(contributions[0].copy(), |s, c| s + c);
        rank_order_differs |= !same_bits(&in_rank_order, &gloo);
    }
    assert!(rank_order_differs, "gloo's sums are the rank-order sums: this test cannot tell orders apart");
}
