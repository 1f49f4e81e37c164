//! Buckets re-planned from the observed order: a model that registers its
//! output layer first but uses it last. Compiled into `cargo test --test
//! overlap` (see `tests/overlap.rs`).

use super::common::{mse, run, spawn_options};
use ddp_workbook::ddp::{agree_on_order, naive, train_step_with, SimpleDistributedDataParallelism};
use ddp_workbook::dist::spawn_with;
use ddp_workbook::models::named_parameters;
use ddp_workbook::tch::nn::{self, Module, VarStore};
use ddp_workbook::tch::{Device, Kind, Tensor};
use ddp_workbook::train::AdamW;
use ddp_workbook::with_seed;

/// Registered head first, used head last: the first plan, which assumes
/// reverse registration order, puts the head's gradients (ready first) in
/// the last bucket, so no bucket can leave before backward ends.
#[derive(Debug)]
struct HeadFirst {
    head: nn::Linear,
    hidden: nn::Linear,
    input: nn::Linear,
}

impl Module for HeadFirst {
    fn forward(&self, x: &Tensor) -> Tensor {
        self.head.forward(&self.hidden.forward(&self.input.forward(x).relu()).relu())
    }
}

fn head_first() -> (VarStore, HeadFirst) {
    with_seed(9, || {
        let mut vs = VarStore::new(Device::Cpu);
        let root = vs.root();
        let head = nn::linear(&root / "head", 32, 1, Default::default());
        let hidden = nn::linear(&root / "hidden", 32, 32, Default::default());
        let input = nn::linear(&root / "input", 4, 32, Default::default());
        vs.set_kind(Kind::Double);
        (vs, HeadFirst { head, hidden, input })
    })
}

const CAPS: ddp_workbook::ddp::BucketCaps =
    ddp_workbook::ddp::BucketCaps { cap_bytes: 4096, first_cap_bytes: 512 };

#[test]
fn buckets_follow_the_order_gradients_became_ready_after_the_first_step() {
    let per_rank = run(2, |pg| {
        let (vs, model) = head_first();
        let names: Vec<String> = named_parameters(&vs).into_iter().map(|(n, _)| n).collect();
        anyhow::ensure!(names[0].starts_with("head."), "the test needs the head registered first: {names:?}");
        let ddp = SimpleDistributedDataParallelism::with_bucket_caps(model, &vs, pg.clone(), CAPS)?;
        let x = Tensor::ones([3, 4], (Kind::Double, Device::Cpu)) * (1.0 + pg.rank() as f64);
        let y = Tensor::zeros([3, 1], (Kind::Double, Device::Cpu));
        let planned = ddp.bucket_names();
        let mut steps = vec![];
        for _ in 0..2 {
            ddp.backward(&mse(&ddp.forward(&x), &y))?;
            let ready: Vec<usize> = ddp.last_step().launches.iter().map(|l| l.gradients_ready).collect();
            steps.push((ready, ddp.bucket_names()));
        }
        Ok((planned, steps, ddp.parameters().len()))
    });
    for (rank, (planned, steps, count)) in per_rank.iter().enumerate() {
        assert!(
            planned.last().unwrap().iter().any(|n| n.starts_with("head.")),
            "rank {rank}: first plan {planned:?}"
        );
        let (first_launches, replanned) = &steps[0];
        assert!(
            first_launches[0] == *count,
            "rank {rank}: with the first plan, bucket 0 can leave only when every gradient is ready: {first_launches:?}"
        );
        assert!(replanned[0].iter().any(|n| n.starts_with("head.")), "rank {rank}: re-planned {replanned:?}");
        assert_eq!(replanned, &per_rank[0].1[0].1, "rank {rank}: every rank re-planned the same layout");
        let (second_launches, kept) = &steps[1];
        assert_eq!(kept, replanned, "rank {rank}: the layout is re-planned once");
        assert!(
            second_launches[0] < *count,
            "rank {rank}: after re-planning, bucket 0 leaves while backward still runs: {second_launches:?}"
        );
    }
}

#[test]
fn a_re_plan_moves_the_gradients_into_the_new_buckets_back_to_back() {
    let per_rank = run(2, |pg| {
        let (vs, model) = head_first();
        let ddp = SimpleDistributedDataParallelism::with_bucket_caps(model, &vs, pg.clone(), CAPS)?;
        let x = Tensor::ones([3, 4], (Kind::Double, Device::Cpu)) * (1.0 + pg.rank() as f64);
        let y = Tensor::zeros([3, 1], (Kind::Double, Device::Cpu));
        let first = ddp.buckets();
        ddp.backward(&mse(&ddp.forward(&x), &y))?;
        let replanned = ddp.buckets();
        anyhow::ensure!(first != replanned, "the test needs a re-plan after the first step");
        // Within each new bucket, each gradient starts where the one before it ends.
        for bucket in &replanned {
            for pair in bucket.params.windows(2) {
                let (before, after) =
                    (ddp.parameters()[pair[0]].1.grad(), ddp.parameters()[pair[1]].1.grad());
                let end = before.data_ptr() as usize + before.numel() * 8;
                anyhow::ensure!(after.data_ptr() as usize == end, "parameters {pair:?} are not back to back");
            }
        }
        Ok(replanned.len())
    });
    assert!(per_rank.iter().all(|&buckets| buckets > 1), "the test needs several buckets: {per_rank:?}");
}

#[test]
fn training_through_a_re_plan_steps_bitwise_as_one_all_reduce_per_gradient() {
    // Each element's average is the same two-rank sum, divided by two,
    // whichever bucket carries it: a re-plan must change no bit of a step.
    let train = |bucketed: bool| {
        run(2, move |pg| {
            let (vs, model) = head_first();
            let ddp = SimpleDistributedDataParallelism::with_bucket_caps(model, &vs, pg.clone(), CAPS)?;
            let mut adamw = AdamW::new(ddp.parameters(), 1e-2, 0.1);
            let x = Tensor::arange(24, (Kind::Double, Device::Cpu)).view([6, 4]) / 24.0 + pg.rank() as f64;
            let y = Tensor::ones([6, 1], (Kind::Double, Device::Cpu));
            let micro_batches: Vec<&[i64]> = vec![&[0, 1, 2], &[3, 4, 5]];
            let mut layouts = vec![];
            for _ in 0..3 {
                let loss = |rows: &[i64]| {
                    let index = Tensor::from_slice(rows);
                    mse(&ddp.forward(&x.index_select(0, &index)), &y.index_select(0, &index))
                };
                layouts.push(ddp.buckets());
                if bucketed {
                    train_step_with(&ddp, &mut adamw, &micro_batches, loss, |_| {})?;
                    continue;
                }
                // The reference: every backward local, then one all-reduce per gradient.
                adamw.zero_grad();
                for rows in &micro_batches {
                    let _no_sync = ddp.no_sync();
                    ddp.backward(&(loss(rows) / micro_batches.len() as f64))?;
                }
                naive::sync_gradients(pg.as_ref(), ddp.parameters())?;
                adamw.step()?;
            }
            anyhow::ensure!(!bucketed || layouts[0] != layouts[1], "the test needs a re-plan after step 1");
            Ok(ddp_workbook::check::snapshot(ddp.parameters()))
        })
    };
    let (bucketed, reference) = (train(true), train(false));
    for rank in 0..2 {
        for ((name, a), (_, b)) in bucketed[rank].iter().zip(&reference[rank]) {
            assert!(
                ddp_workbook::check::same_bits(a, b),
                "rank {rank}: `{name}` after a re-plan differs from the per-gradient all-reduce's"
            );
        }
    }
}

#[test]
fn a_layout_that_completes_in_order_is_kept() {
    let per_rank = run(2, |pg| {
        let (vs, model) = ddp_workbook::models::Mlp::seeded(3, &[4, 32, 32, 1], Kind::Double);
        let ddp = SimpleDistributedDataParallelism::with_bucket_caps(model, &vs, pg.clone(), CAPS)?;
        let x = Tensor::ones([3, 4], (Kind::Double, Device::Cpu)) * (1.0 + pg.rank() as f64);
        let y = Tensor::zeros([3, 1], (Kind::Double, Device::Cpu));
        let planned = ddp.bucket_names();
        let grad_at =
            |ddp: &SimpleDistributedDataParallelism<_>| ddp.parameters()[0].1.grad().data_ptr() as usize;
        ddp.backward(&mse(&ddp.forward(&x), &y))?;
        let after_first = grad_at(&ddp);
        ddp.backward(&mse(&ddp.forward(&x), &y))?;
        anyhow::ensure!(planned.len() > 1 && ddp.bucket_names() == planned, "kept {planned:?}");
        Ok(after_first == grad_at(&ddp))
    });
    for (rank, stayed) in per_rank.iter().enumerate() {
        assert!(stayed, "rank {rank}: a kept layout keeps its buffers: the gradient moved");
    }
}

#[test]
fn every_rank_adopts_rank_0s_order_completed_with_what_it_never_saw() {
    let orders = spawn_with(spawn_options(3), |pg| {
        // Rank 0 saw 3, 1 and 4 (0 and 2 got no gradient); the others saw other orders.
        let observed: Vec<usize> = if pg.rank() == 0 { vec![3, 1, 4] } else { vec![4, 3, 2, 1, 0] };
        Ok(agree_on_order(pg.as_ref(), &observed, 5)?)
    })
    .unwrap_or_else(|e| panic!("{e}"));
    for (rank, order) in orders.iter().enumerate() {
        assert_eq!(order, &vec![3, 1, 4, 2, 0], "rank {rank}: rank 0's order, then the rest from the last");
    }
}
