//! Buckets re-planned from the observed order: a model that registers its
//! output layer first but uses it last. Compiled into `cargo test --test
//! overlap` (see `tests/overlap.rs`).

use super::common::{mse, run, spawn_options};
use ddp_workbook::ddp::{agree_on_order, train_step_with, SimpleDistributedDataParallelism, StepOptimizer};
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
fn a_re_planned_layout_is_reported_once_as_the_buffers_that_now_hold_the_gradients() {
    let per_rank = run(2, |pg| {
        let (vs, model) = head_first();
        let ddp = SimpleDistributedDataParallelism::with_bucket_caps(model, &vs, pg.clone(), CAPS)?;
        let x = Tensor::ones([3, 4], (Kind::Double, Device::Cpu)) * (1.0 + pg.rank() as f64);
        let y = Tensor::zeros([3, 1], (Kind::Double, Device::Cpu));
        let first_buffers: Vec<usize> =
            ddp.flat_groups().iter().map(|(_, b)| b.data_ptr() as usize).collect();
        let mut reported = vec![];
        for _ in 0..3 {
            ddp.backward(&mse(&ddp.forward(&x), &y))?;
            reported.push(ddp.take_new_layout());
        }
        anyhow::ensure!(ddp.take_new_layout().is_none(), "a report is taken once");
        // What it reported, against the layout and the gradients as they are now.
        let members: Vec<Vec<usize>> = ddp.buckets().iter().map(|b| b.params.clone()).collect();
        let groups = reported[0].as_ref().ok_or_else(|| anyhow::anyhow!("the first step re-plans"))?;
        let reported_members: Vec<Vec<usize>> = groups.iter().map(|(m, _)| m.clone()).collect();
        anyhow::ensure!(reported_members == members, "reported {reported_members:?}, layout {members:?}");
        for (members, buffer) in groups {
            let (start, end) = (buffer.data_ptr() as usize, buffer.data_ptr() as usize + buffer.numel() * 8);
            anyhow::ensure!(!first_buffers.contains(&start), "a re-planned bucket gets a new buffer");
            for &m in members {
                let at = ddp.parameters()[m].1.grad().data_ptr() as usize;
                anyhow::ensure!((start..end).contains(&at), "parameter {m}'s gradient is not in its bucket");
            }
        }
        Ok(reported.iter().map(Option::is_some).collect::<Vec<bool>>())
    });
    for (rank, reported) in per_rank.iter().enumerate() {
        assert_eq!(reported, &[true, false, false], "rank {rank}: reported once, after the first step");
    }
}

/// AdamW as an optimizer that never lays itself out again: it notes each
/// new layout `train_step` hands it and keeps its own, one group per dtype,
/// into which each step copies the gradients.
struct NeverRegrouped(AdamW, Vec<Vec<Vec<usize>>>);

impl StepOptimizer for NeverRegrouped {
    fn zero_grad(&mut self) {
        self.0.zero_grad();
    }
    fn step(&mut self) -> Result<(), ddp_workbook::tch::TchError> {
        self.0.step()
    }
    fn regroup(&mut self, groups: ddp_workbook::ddp::FlatGroups) -> Result<(), String> {
        self.1.push(groups.into_iter().map(|(members, _)| members).collect());
        Ok(())
    }
}

#[test]
fn train_step_lays_adamw_out_on_the_re_planned_buckets_and_steps_as_if_it_had_not() {
    let train = |regroup: bool| {
        run(2, move |pg| {
            let (vs, model) = head_first();
            let ddp = SimpleDistributedDataParallelism::with_bucket_caps(model, &vs, pg.clone(), CAPS)?;
            let adamw = AdamW::with_groups(ddp.parameters(), 1e-2, 0.1, ddp.flat_groups());
            let (mut regrouped, mut kept) = (adamw, None);
            if !regroup {
                kept = Some(NeverRegrouped(AdamW::new(ddp.parameters(), 1e-2, 0.1), vec![]));
            }
            let x = Tensor::arange(24, (Kind::Double, Device::Cpu)).view([6, 4]) / 24.0 + pg.rank() as f64;
            let y = Tensor::ones([6, 1], (Kind::Double, Device::Cpu));
            let micro_batches: Vec<&[i64]> = vec![&[0, 1, 2], &[3, 4, 5]];
            let (mut called_back, mut layouts) = (vec![], vec![]);
            for _ in 0..3 {
                let loss = |rows: &[i64]| {
                    let index = Tensor::from_slice(rows);
                    mse(&ddp.forward(&x.index_select(0, &index)), &y.index_select(0, &index))
                };
                let after_backward = |i| called_back.push(i);
                layouts.push(ddp.buckets());
                match &mut kept {
                    Some(kept) => train_step_with(&ddp, kept, &micro_batches, loss, after_backward)?,
                    None => train_step_with(&ddp, &mut regrouped, &micro_batches, loss, after_backward)?,
                };
            }
            anyhow::ensure!(layouts[0] != layouts[1], "the test needs a re-plan after step 1");
            anyhow::ensure!(
                called_back == [0, 1, 0, 1, 0, 1],
                "called back after each backward: {called_back:?}"
            );
            if let Some(NeverRegrouped(_, handed)) = &kept {
                let members: Vec<Vec<usize>> = layouts[1].iter().map(|b| b.params.clone()).collect();
                anyhow::ensure!(handed == &[members], "the new layout is handed over once: {handed:?}");
            }
            Ok(ddp_workbook::check::snapshot(ddp.parameters()))
        })
    };
    let (regrouped, kept) = (train(true), train(false));
    for rank in 0..2 {
        for ((name, a), (_, b)) in regrouped[rank].iter().zip(&kept[rank]) {
            assert!(
                ddp_workbook::check::same_bits(a, b),
                "rank {rank}: `{name}`: AdamW laid out on the new buckets must step bitwise as one that copies"
            );
        }
    }
}

#[test]
fn a_layout_that_completes_in_order_is_never_reported() {
    let per_rank = run(2, |pg| {
        let (vs, model) = ddp_workbook::models::Mlp::seeded(3, &[4, 32, 32, 1], Kind::Double);
        let ddp = SimpleDistributedDataParallelism::with_bucket_caps(model, &vs, pg.clone(), CAPS)?;
        let x = Tensor::ones([3, 4], (Kind::Double, Device::Cpu)) * (1.0 + pg.rank() as f64);
        let y = Tensor::zeros([3, 1], (Kind::Double, Device::Cpu));
        let planned = ddp.bucket_names();
        let mut reported = vec![];
        for _ in 0..2 {
            ddp.backward(&mse(&ddp.forward(&x), &y))?;
            reported.push(ddp.take_new_layout().is_some());
        }
        anyhow::ensure!(planned.len() > 1 && ddp.bucket_names() == planned, "kept {planned:?}");
        Ok(reported)
    });
    for (rank, reported) in per_rank.iter().enumerate() {
        assert_eq!(reported, &[false, false], "rank {rank}: nothing to report");
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
