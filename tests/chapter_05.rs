//! Chapter 05 tests: bucketing. The bucketed sync must give bitwise the same
//! training as chapter 3's one-all-reduce-per-parameter sync, with one
//! all-reduce per bucket, and the layout must be the one the chapter explains.
//!
//! Your code:           `cargo test --test chapter_05`
//! The reference code:  `cargo test --features solutions --test chapter_05`
//! See the measured numbers: add `-- --nocapture`
//!
//! Three more modules, one test binary: `chapter_05/training.rs`, the shared
//! models and training loop; `chapter_05/layout_rules.rs`, the planner's
//! rules on hand-made sizes (when the first cap ends, a first cap and an open
//! bucket per dtype and device); `chapter_05/missing_gradients.rs`, a
//! parameter that had a gradient last step and has none now;
//! `chapter_05/no_sync.rs`, chapter 4's `no_sync`, kept by this stage.
//!
//! Why bitwise. The in-process all-reduce adds the ranks' tensors element by
//! element, in rank order. A gradient element gets the same additions, in the
//! same order, whether it travels alone or at some offset of a bucket; the
//! division by the world size and the copies change nothing either. So the
//! two syncs must agree exactly, and these tests use a tolerance of 0.

// `#[path]`, because a module file directly in `tests/` would be built as a
// test binary of its own.
mod common;
#[path = "chapter_05/layout_rules.rs"]
mod layout_rules;
#[path = "chapter_05/missing_gradients.rs"]
mod missing_gradients;
#[path = "chapter_05/no_sync.rs"]
mod no_sync;
#[path = "chapter_05/training.rs"]
mod training;

use common::{assert_matches_one_process, mse, Hints};
use ddp_workbook::ch05_bucketing::{
    learner, BucketCaps, LocalBackward, ParamMeta, SimpleDistributedDataParallelism, MIB,
};
use ddp_workbook::check::{max_reference_diff, max_replica_diff, snapshot};
use ddp_workbook::dist::spawn;
use ddp_workbook::models::named_parameters;
use ddp_workbook::tch::{Device, Kind};
use training::*;

/// Names per bucket, for hand-written expectations.
fn names(layout: &[&[&str]]) -> Vec<Vec<String>> {
    layout.iter().map(|b| b.iter().map(|n| n.to_string()).collect()).collect()
}

#[test]
fn layout_for_tiny_caps_is_the_one_the_chapter_explains() {
    // [4, 16, 16, 1] in f64, registration order (tch registers a layer's bias
    // before its weight), in bytes: layers.0.bias 128, layers.0.weight 512,
    // layers.1.bias 128, layers.1.weight 2048, layers.2.bias 8,
    // layers.2.weight 128. Walked backwards with a first cap of 128 B and a
    // cap of 1024 B (the table in chapters/05-bucketing.md):
    let expected = names(&[
        &["layers.2.weight"], // 128 B: fills the first cap by itself
        &["layers.2.bias"],   // 8 B: adding layers.1.weight would pass 1024
        &["layers.1.weight"], // 2048 B: larger than the cap, alone
        &["layers.1.bias", "layers.0.weight", "layers.0.bias"], // 768 B: what is left
    ]);
    let (vs, _) = mlp();
    let metas = ParamMeta::of(&named_parameters(&vs));
    let buckets = learner::plan_buckets(&metas, TINY_CAPS.cap_bytes, TINY_CAPS.first_cap_bytes);
    let planned: Vec<Vec<String>> =
        buckets.iter().map(|b| b.params.iter().map(|&p| metas[p].name.clone()).collect()).collect();
    assert_layout(
        &planned,
        &expected,
        "your plan_buckets(cap 1024 B, first cap 128 B) planned another layout than the chapter's table: walk \
         the parameters from the last to the first, close a bucket before it would pass its cap, and close a \
         bucket at once when one parameter fills it",
    );
    let bytes: Vec<usize> = buckets.iter().map(|b| b.bytes()).collect();
    assert_eq!(bytes, vec![128, 8, 2048, 768], "each bucket's numel must be the sum of its members' numel");

    // The wrapper plans the same layout, on every rank; with PyTorch's
    // defaults this whole model (2.8 KiB) fits in the first bucket.
    for (caps, expected) in [(TINY_CAPS, expected), (BucketCaps::default(), names(&[&REVERSED_MLP]))] {
        let layouts = spawn(3, |pg| {
            let (vs, model) = mlp();
            Ok(SimpleDistributedDataParallelism::with_bucket_caps(model, &vs, pg, caps)?.bucket_names())
        })
        .unwrap_or_else(|e| panic!("{e}"));
        for (rank, layout) in layouts.iter().enumerate() {
            assert_eq!(layout, &expected, "rank {rank}, caps ({caps}): the wrapper's bucket layout");
        }
    }
}

#[test]
fn plan_buckets_follows_the_three_rules_on_hand_made_sizes() {
    let meta = |numel| ParamMeta { name: format!("p{numel}"), numel, kind: Kind::Float, device: Device::Cpu };
    let plan = |numels: &[usize], cap, first_cap| -> Vec<Vec<usize>> {
        let metas: Vec<ParamMeta> = numels.iter().map(|&n| meta(n)).collect();
        learner::plan_buckets(&metas, cap, first_cap).into_iter().map(|b| b.params).collect()
    };
    // Ten f32 tensors of 40 B; first cap 100 B, then 200 B.
    assert_layout(
        &plan(&[10; 10], 200, 100),
        &[vec![9, 8], vec![7, 6, 5, 4, 3], vec![2, 1, 0]],
        "your plan_buckets broke a rule: the first bucket holds at most first_cap_bytes (two tensors of \
         40 B), the next ones at most cap_bytes (five), and the last one what is left; indices from the last \
         parameter down",
    );
    // 40, 40, 4000, 40, 40 B with both caps 100 B.
    assert_eq!(
        plan(&[10, 10, 1000, 10, 10], 100, 100),
        vec![vec![4, 3], vec![2], vec![1, 0]],
        "#2 (4000 B, cap 100 B) must travel alone: close the open bucket [4, 3] before adding it (it would \
         pass the cap), and close #2's own bucket right after it"
    );
    // A tensor of exactly the cap fills its bucket: it is closed at once.
    assert_eq!(
        plan(&[10, 25, 10], 100, 100),
        vec![vec![2], vec![1], vec![0]],
        "a bucket of >= cap bytes is full"
    );

    // Mixed dtypes, 40 B each but #2 (f32, 4000 B): #2 closes its bucket
    // before the f64 bucket [3, 1], opened earlier, is complete. The buckets must still come out in
    // the order backward starts filling them.
    let kinds = [Kind::Float, Kind::Double, Kind::Float, Kind::Double];
    let metas: Vec<ParamMeta> =
        [10, 5, 1000, 5].iter().zip(kinds).map(|(&n, kind)| ParamMeta { kind, ..meta(n) }).collect();
    let planned: Vec<Vec<usize>> =
        learner::plan_buckets(&metas, 100, 100).into_iter().map(|b| b.params).collect();
    assert_eq!(
        planned,
        vec![vec![3, 1], vec![2], vec![0]],
        "sort the buckets by their first member, highest index first (not in the order you closed them)"
    );
}

#[test]
fn mixed_dtypes_get_separate_buckets_and_still_match_naive_bitwise() {
    let (vs, _) = mixed();
    let metas = ParamMeta::of(&named_parameters(&vs));
    let buckets = learner::plan_buckets(&metas, 25 * MIB, MIB);
    let planned: Vec<(Kind, Vec<String>)> =
        buckets.iter().map(|b| (b.kind, b.params.iter().map(|&p| metas[p].name.clone()).collect())).collect();
    let expected = vec![
        (Kind::Float, names(&[&["output.bias", "output.weight", "input_scale"]]).remove(0)),
        (Kind::Double, names(&[&["hidden.bias", "hidden.weight"]]).remove(0)),
    ];
    assert_layout(
        &planned,
        &expected,
        "your plan_buckets mixed dtypes or misordered them: one flat buffer holds one dtype, so keep an open \
         bucket per (kind, device), and order the buckets by their first member, highest index first",
    );
    let bucketed = train(2, Optim::Adam, Sync::Bucketed, BucketCaps::default(), mixed);
    let naive = train(2, Optim::Adam, Sync::Naive, BucketCaps::default(), mixed);
    assert_same_training(&bucketed, &naive, "mixed f32/f64 model, 2 ranks");
    assert!(
        bucketed.iter().all(|r| r.all_reduces == vec![2; STEPS]),
        "two dtypes, two buckets, two all-reduces"
    );
}

#[test]
fn bucketed_sync_equals_naive_sync_bitwise() {
    for world_size in [2, 3, 4] {
        for optim in [Optim::Sgd, Optim::Adam] {
            for caps in [TINY_CAPS, BucketCaps::default()] {
                let bucketed = train(world_size, optim, Sync::Bucketed, caps, mlp);
                let naive = train(world_size, optim, Sync::Naive, caps, mlp);
                let case = format!("{optim:?} on {world_size} ranks, {caps}");
                assert_same_training(&bucketed, &naive, &case);
                println!("{case}: bitwise equal to the naive sync over {STEPS} steps");
            }
        }
    }
}

#[test]
fn one_all_reduce_per_bucket_and_the_same_bytes_as_naive() {
    for (caps, buckets) in [(TINY_CAPS, 4), (BucketCaps::default(), 1)] {
        let bucketed = train(3, Optim::Sgd, Sync::Bucketed, caps, mlp);
        let naive = train(3, Optim::Sgd, Sync::Naive, caps, mlp);
        for (rank, (b, n)) in bucketed.iter().zip(&naive).enumerate() {
            assert_eq!(b.buckets.len(), buckets, "rank {rank}, caps ({caps}): the test model changed");
            assert_eq!(
                b.all_reduces,
                vec![buckets as u64; STEPS],
                "rank {rank}, caps ({caps}): one all-reduce per bucket and step (not one per parameter)"
            );
            assert_eq!(b.collectives, b.all_reduces, "rank {rank}: a step must make no other collective");
            assert_eq!(n.all_reduces, vec![6; STEPS], "the naive sync makes one all-reduce per parameter");
            assert_eq!(b.bytes, n.bytes, "rank {rank}: buckets carry the same bytes as the naive sync");
        }
        println!(
            "{caps}: {buckets} all-reduce(s) per step instead of 6, the same {} bytes per step",
            naive[0].bytes[0]
        );
    }
}

#[test]
fn replicas_match_and_ddp_equals_one_process_on_the_global_batch() {
    for (world_size, optim) in [(1, Optim::Sgd), (2, Optim::Sgd), (3, Optim::Adam), (4, Optim::Adam)] {
        let runs = train(world_size, optim, Sync::Bucketed, TINY_CAPS, mlp);
        let reference = one_process(optim, mlp);
        let per_rank: Vec<_> = runs.into_iter().map(|run| run.after_each_step).collect();
        let hints = Hints { replicas: HINT_REPLICAS, reference: HINT_MEAN };
        let case = format!("{optim:?}, {world_size} ranks");
        let largest = assert_matches_one_process(&case, &per_rank, &reference, TOLERANCE, &hints);
        println!("{optim:?} on {world_size} rank(s): largest difference from one process: {largest:e}");
        if world_size == 1 {
            assert_eq!(largest, 0.0, "on one rank the bucketed sync must leave every gradient as it is");
        }
    }
}

#[test]
fn a_parameter_without_gradient_sends_zeros_and_keeps_no_gradient() {
    let bucketed = train(2, Optim::Adam, Sync::Bucketed, BucketCaps::default(), mlp_with_unused);
    let naive = train(2, Optim::Adam, Sync::Naive, BucketCaps::default(), mlp_with_unused);
    for (rank, run) in bucketed.iter().enumerate() {
        assert_eq!(run.buckets.len(), 1, "rank {rank}: the whole model fits in the first bucket");
        assert!(run.buckets[0].contains(&"unused".to_string()), "the layout comes from sizes, not gradients");
        assert_eq!(
            run.unused_grad_defined,
            vec![false; STEPS],
            "rank {rank}: `unused` must keep no gradient"
        );
        assert_eq!(run.all_reduces, vec![1; STEPS], "rank {rank}: still one all-reduce per bucket");
    }
    // Zeros in its slot, no gradient after: the step is the naive one, bit for bit.
    assert_same_training(&bucketed, &naive, "model with an unused parameter, 2 ranks");
}

#[test]
fn a_parameter_used_on_one_rank_only_is_an_error_not_a_silent_drift() {
    let result = spawn(2, |pg| {
        let (vs, model) = mlp_with_unused();
        let ddp = SimpleDistributedDataParallelism::with_bucket_caps(model, &vs, pg, BucketCaps::default())?;
        let rank = ddp.rank() as i64;
        let unused =
            ddp.parameters().iter().find(|(n, _)| n == "unused").expect("the model has it").1.shallow_clone();
        let (x, y) = data().batch(rank * 6, 6); // [6, 4], [6, 1]
        let mut loss = mse(&ddp.forward(&x), &y);
        if rank == 0 {
            loss += unused.sum(Kind::Double); // only rank 0 uses `unused`
        }
        ddp.backward_local(&loss)?;
        ddp.sync_gradients()?;
        Ok(())
    });
    let error = result.expect_err("rank 1 must refuse to go on without `unused`'s update").to_string();
    println!("{error}");
    assert!(
        error.contains("rank 1") && error.contains("`unused`"),
        "the error must name rank 1 and `unused`"
    );
}

#[test]
fn negative_controls_without_sync_or_with_empty_buckets_the_replicas_drift() {
    let naive = train(2, Optim::Sgd, Sync::Naive, TINY_CAPS, mlp);
    for sync in [Sync::None, Sync::EmptyBuckets] {
        let runs = train(2, Optim::Sgd, sync, TINY_CAPS, mlp);
        let last: Vec<_> = runs.iter().map(|r| snapshot(&r.after_each_step[STEPS - 1])).collect();
        let drift = max_replica_diff(&last);
        let off = max_reference_diff(&last[0], &naive[0].after_each_step[STEPS - 1]);
        println!("{sync:?}: replicas {drift:e} apart, rank 0 {off:e} from the naive sync");
        assert!(
            drift > 1e6 * TOLERANCE,
            "{sync:?}: the replicas still agree to {drift:e}: the checks have no teeth"
        );
        assert!(off > 1e6 * TOLERANCE, "{sync:?}: rank 0 still matches the naive sync to {off:e}");
    }
}

#[test]
fn bad_caps_give_a_clear_error() {
    let bad_caps = [
        (BucketCaps { cap_bytes: 0, first_cap_bytes: MIB }, "the bucket cap"),
        (BucketCaps { cap_bytes: 25 * MIB, first_cap_bytes: 0 }, "the first bucket's cap"),
    ];
    for (caps, what) in bad_caps {
        let result = spawn(2, |pg| {
            let (vs, model) = mlp();
            SimpleDistributedDataParallelism::with_bucket_caps(model, &vs, pg, caps)?;
            Ok(())
        });
        let error = result.expect_err("a cap of 0 bytes must be refused").to_string();
        println!("{error}");
        assert!(
            error.contains(what) && error.contains("at least 1 byte"),
            "unclear error for ({caps}): {error}"
        );
    }
    // A first cap above the cap: the first bucket is meant to be the small one.
    let result = spawn(2, |pg| {
        let (vs, model) = mlp();
        SimpleDistributedDataParallelism::with_bucket_caps(
            model,
            &vs,
            pg,
            BucketCaps { cap_bytes: 1000, first_cap_bytes: 2000 },
        )?;
        Ok(())
    });
    let error = result.expect_err("a first cap above the cap must be refused").to_string();
    assert!(
        error.contains("first bucket's cap (2000 B) is larger"),
        "unclear error for a large first cap: {error}"
    );
    // Different caps on different ranks: their buckets would not pair up.
    let result = spawn(2, |pg| {
        let cap_bytes = if pg.rank() == 0 { TINY_CAPS.cap_bytes } else { 2 * TINY_CAPS.cap_bytes };
        let (vs, model) = mlp();
        SimpleDistributedDataParallelism::with_bucket_caps(
            model,
            &vs,
            pg,
            BucketCaps { cap_bytes, ..TINY_CAPS },
        )?;
        Ok(())
    });
    let error = result.expect_err("ranks with different caps must be refused").to_string();
    println!("{error}");
    assert!(error.contains("different bucket layouts"), "unclear error for unequal caps: {error}");
}
