//! The workbook's bucket layouts next to
//! PyTorch's, at construction and after the first-step rebuild, for several
//! models and caps (the stages of stages.rs; 2 ranks).
//! Compiled into `cargo test --features solutions,mpi,nccl --test torch_oracle`.
//!
//! What PyTorch 2.11 does (torch/nn/parallel/distributed.py, `_ddp_init_helper`,
//! and the reducer's `compute_bucket_assignment_by_size`), and these tests
//! confirm on its reports:
//!  - with `find_unused_parameters=False` (the default) the first iteration
//!    runs with ONE bucket holding every gradient, whatever the cap;
//!  - after the first iteration (applied at the second forward) it rebuilds
//!    the buckets in the order the gradients became ready, the first capped
//!    at `dist._DEFAULT_FIRST_BUCKET_BYTES` (1 MiB) when `bucket_cap_mb` is
//!    left at its default, at `bucket_cap_mb` otherwise, the rest at
//!    `bucket_cap_mb`;
//!  - a bucket closes once a gradient brings it to its cap or past it: a
//!    bucket may exceed its cap by its last gradient;
//!  - with `find_unused_parameters=True` the buckets are planned from the
//!    FIRST registered parameter with the same caps, then listed last
//!    bucket first, and never rebuilt;
//!  - `_get_ddp_logging_data()["bucket_sizes"]` reports the construction
//!    layout, also after the rebuild.
//!
//! The workbook plans at construction from the last registered parameter
//! (its first cap is BucketCaps::first_cap_bytes, so PyTorch's
//! `bucket_cap_mb=X` is `BucketCaps { cap_bytes: X, first_cap_bytes: X }`),
//! closes a bucket BEFORE a gradient would overflow it, and re-plans after
//! the first step only if a bucket would wait for a later one (also with
//! find_unused_parameters). Chapter 5 of the book says why.

use std::collections::BTreeSet;

use crate::compare::Agreement;
use crate::oracle_run::{torch_layouts, TorchLayouts};
use crate::workbook::RankRun;
use crate::{check_against_torch, workbook_ranks};

fn bytes(layout: &[(usize, Vec<String>)]) -> Vec<usize> {
    layout.iter().map(|(b, _)| *b).collect()
}

/// Bucket members as sets: what travels together (the order inside a
/// buffer is only where each gradient lies).
fn members(names: &[Vec<String>]) -> Vec<BTreeSet<String>> {
    names.iter().map(|b| b.iter().cloned().collect()).collect()
}

/// The workbook's rank 0 and PyTorch's, for `stage` on 2 ranks, after
/// checking what holds in every stage: the same numbers (bitwise), the same
/// parameter order, and PyTorch's logged sizes are its construction layout.
fn both(stage: &str) -> (RankRun, TorchLayouts) {
    let mut runs = workbook_ranks(stage, 2);
    check_against_torch(stage, 2, &runs, Agreement::Bitwise, |_| true);
    let run = runs.swap_remove(0);
    let torch = torch_layouts(2, stage);
    assert_eq!(
        run.parameters, torch.parameters,
        "{stage}: the twin registers its parameters in another order"
    );
    assert_eq!(
        torch.logged_at_construction,
        bytes(&torch.at_construction),
        "{stage}: PyTorch's logged bucket_sizes are not its construction layout"
    );
    println!(
        "{stage}: workbook {:?} then {:?}; PyTorch {:?} then {:?}",
        run.layout_before,
        run.layout_after,
        bytes(&torch.at_construction),
        bytes(&torch.after_training)
    );
    (run, torch)
}

#[test]
fn bucket_layouts_equal_pytorchs_where_both_rules_give_the_same_buckets() {
    // The default caps and a model under 1 MiB (the tiny GPT is 833,536
    // bytes in f64): one bucket, before and after, on both sides; also
    // with find_unused_parameters (Branchy, 464 bytes).
    for (stage, expected) in [("buckets_default", 833_536), ("find_unused", 464)] {
        let (run, torch) = both(stage);
        assert_eq!(run.layout_before, vec![expected], "{stage}");
        assert_eq!(bytes(&torch.at_construction), vec![expected], "{stage}");
        assert_eq!(run.layout_after, bytes(&torch.after_training), "{stage}");
        let torch_names: Vec<Vec<String>> = torch.after_training.iter().map(|(_, n)| n.clone()).collect();
        assert_eq!(members(&run.names_after), members(&torch_names), "{stage}");
    }
    // A cap below every gradient (8 bytes, the MLP's smallest): one
    // parameter per bucket. After the rebuild both sides send them in the
    // order backward produced them; at construction PyTorch has its one
    // bucket, the workbook already one per parameter.
    let (run, torch) = both("mlp_tiny_cap");
    assert_eq!(bytes(&torch.at_construction), vec![2952]);
    assert_eq!(run.layout_before, vec![128, 8, 2048, 128, 512, 128]); // reverse registration order
    assert_eq!(run.layout_after, bytes(&torch.after_training));
    assert_eq!(run.layout_after, vec![8, 128, 128, 2048, 128, 512]); // ready order
    let torch_names: Vec<Vec<String>> = torch.after_training.iter().map(|(_, n)| n.clone()).collect();
    assert_eq!(run.names_after, torch_names);
}

// The MLP [4, 16, 16, 1] in f64, in registration order (tch makes a
// Linear's bias before its weight): layers.0.bias 128 B, layers.0.weight
// 512, layers.1.bias 128, layers.1.weight 2048, layers.2.bias 8,
// layers.2.weight 128; 2952 in all. Backward makes them ready as
// layers.2.bias, layers.2.weight, layers.1.bias, layers.1.weight,
// layers.0.bias, layers.0.weight.

#[test]
fn with_a_cap_pytorch_lets_a_bucket_overflow_by_its_last_gradient_and_the_workbook_does_not() {
    // Cap 1000 B. PyTorch: one bucket of 2952 at first; rebuilt in ready
    // order 8 + 128 + 128 = 264, + 2048 = 2312 >= 1000 closes it; 128 + 512.
    // The workbook, from the last registered: 128 + 8 = 136, 2048 would
    // overflow: closed; 2048 alone; 128 + 512 + 128 = 768. Its layout
    // completes in ready order, so the first step keeps it.
    let (run, torch) = both("mlp_small_cap");
    assert_eq!(bytes(&torch.at_construction), vec![2952]);
    assert_eq!(bytes(&torch.after_training), vec![2312, 640]);
    assert_eq!(run.layout_before, vec![136, 2048, 768]);
    assert_eq!(run.layout_after, vec![136, 2048, 768]);
}

#[test]
fn pytorchs_small_first_bucket_applies_at_the_rebuild_only() {
    // The default cap with the first-bucket cap at 1000 B (PyTorch's
    // dist._DEFAULT_FIRST_BUCKET_BYTES, the workbook's first_cap_bytes).
    // PyTorch: one bucket at first; at the rebuild the first closes at
    // 2312 >= 1000, the rest (640) under 25 MiB. The workbook: 136, then
    // the rest, 2816, from construction on.
    let (run, torch) = both("mlp_first_cap");
    assert_eq!(bytes(&torch.at_construction), vec![2952]);
    assert_eq!(bytes(&torch.after_training), vec![2312, 640]);
    assert_eq!(run.layout_before, vec![136, 2816]);
    assert_eq!(run.layout_after, vec![136, 2816]);
}

#[test]
fn with_find_unused_parameters_pytorch_plans_from_the_first_parameter_and_never_rebuilds() {
    // Cap 1000 B. PyTorch from layers.0.bias: 128 + 512 + 128 + 2048 = 2816
    // >= 1000 closes it; 8 + 128 = 136 is left; listed last bucket first.
    let (run, torch) = both("mlp_small_cap_unused");
    assert_eq!(bytes(&torch.at_construction), vec![136, 2816]);
    assert_eq!(bytes(&torch.after_training), vec![136, 2816]);
    assert_eq!(run.layout_before, vec![136, 2048, 768]);
    assert_eq!(run.layout_after, vec![136, 2048, 768]);
}

#[test]
fn on_the_tiny_gpt_with_a_64_kib_cap_pytorchs_buckets_end_at_or_past_the_cap() {
    // PyTorch's rebuilt buckets: every one but the last reaches the cap,
    // and would not without its last gradient. The workbook's never pass
    // the cap but where one gradient alone is larger (mlp.fc.weight, 128 KiB).
    let cap = super::stages::SMALL_CAP_BYTES;
    let (run, torch) = both("buckets_small");
    assert_eq!(bytes(&torch.at_construction), vec![833_536]);
    let sizes: std::collections::HashMap<String, usize> = {
        let (vs, _) = super::stages::build(&super::stages::ModelSpec::Gpt);
        ddp_workbook::models::named_parameters(&vs).into_iter().map(|(n, t)| (n, t.numel() * 8)).collect()
    };
    let (last, full) = torch.after_training.split_last().expect("PyTorch has buckets");
    for (total, names) in full {
        let without_last = total - sizes[names.last().unwrap()];
        assert!(
            *total >= cap && without_last < cap,
            "PyTorch's bucket {names:?} ({total} B) does not close at the cap"
        );
    }
    assert!(last.0 <= cap + sizes[last.1.last().unwrap()]);
    for (total, names) in run.layout_after.iter().zip(&run.names_after) {
        assert!(
            *total <= cap || names.len() == 1,
            "the workbook's bucket {names:?} ({total} B) passes the cap"
        );
    }
    assert_ne!(run.layout_after, bytes(&torch.after_training));
}
