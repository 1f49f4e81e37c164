//! Chapter 12's claims about whole steps of the finished wrapper with the
//! learner's hook registered (`with_bf16_gradients`): the bytes of a step,
//! each step's gradients against the exact mean, the replicas after
//! `optimizer.step`. Part of `tests/chapter_12.rs` (`cargo test --test chapter_12`).

use crate::arithmetic::within_bound;
use crate::common::{mse, run, Optim};
use crate::in_flight::{no_read_before_wait, undefined_until_wait};
use ddp_workbook::ch12_bf16::{with_bf16_gradients, SimpleDistributedDataParallelism};
use ddp_workbook::check::same_bits;
use ddp_workbook::data::Regression;
use ddp_workbook::models::Mlp;
use ddp_workbook::tch::nn::Module;
use ddp_workbook::tch::{Kind, Tensor};

const SIZES: [i64; 4] = [8, 64, 64, 1];

/// Every parameter's gradient, flattened and concatenated in registration order.
fn flat_gradients(params: &[(String, Tensor)]) -> Tensor {
    Tensor::cat(&params.iter().map(|(_, p)| p.grad().detach().flatten(0, -1)).collect::<Vec<_>>(), 0)
}

/// Every parameter, flattened and concatenated in registration order.
fn flat_parameters(params: &[(String, Tensor)]) -> Tensor {
    Tensor::cat(&params.iter().map(|(_, p)| p.detach().flatten(0, -1)).collect::<Vec<_>>(), 0)
}

/// Bytes this rank hands to collectives during the second synced backward
/// (the first also agrees on the gradients' order), with `hook` or without.
fn bytes_of_a_step(bf16: bool) -> Vec<(u64, u64, u64)> {
    run(2, |pg| {
        let data = Regression::new(7, 64, SIZES[0], 1, Kind::Float);
        let (vs, mlp) = Mlp::seeded(3, &SIZES, Kind::Float);
        let ddp = if bf16 {
            with_bf16_gradients(mlp, &vs, pg)?
        } else {
            SimpleDistributedDataParallelism::new(mlp, &vs, pg)?
        };
        let (x, y) = data.batch(ddp.rank() as i64 * 32, 32);
        ddp.backward(&mse(&ddp.forward(&x), &y))?;
        let before = ddp.stats();
        ddp.backward(&mse(&ddp.forward(&x), &y))?;
        let after = ddp.stats();
        let bucket_bytes: usize = ddp.buckets().iter().map(|b| b.bytes()).sum();
        Ok((
            after.collective_bytes - before.collective_bytes,
            after.all_reduce - before.all_reduce,
            bucket_bytes as u64,
        ))
    })
}

#[test]
fn a_step_sends_half_the_bytes_of_its_buckets() {
    let (f32_step, bf16_step) = (bytes_of_a_step(false), bytes_of_a_step(true));
    for (rank, (&(f32_bytes, f32_calls, buckets), &(bf16_bytes, bf16_calls, _))) in
        f32_step.iter().zip(&bf16_step).enumerate()
    {
        println!("rank {rank}: f32 {f32_bytes} B in {f32_calls} all-reduces, bf16 {bf16_bytes} B; buckets {buckets} B");
        assert_eq!(bf16_calls, f32_calls, "rank {rank}: one all-reduce per bucket either way");
        // The same end-of-backward check either way; the buckets travel at half size.
        assert_eq!(f32_bytes - bf16_bytes, buckets / 2, "rank {rank}: the buckets did not travel as bf16");
    }
}

#[test]
fn each_step_is_within_the_bound_and_the_replicas_stay_bitwise_equal() {
    let worst = run(3, |pg| {
        let data = Regression::new(11, 4 * 3 * 16, SIZES[0], 1, Kind::Float);
        let (vs, mlp) = Mlp::seeded(5, &SIZES, Kind::Float);
        // All-reduces NaN until waited on: a hook that reads early shows.
        let ddp = with_bf16_gradients(mlp, &vs, undefined_until_wait(pg.clone()).0)?;
        let mut optimizer = Optim::Sgd.build(&vs)?;
        // One process's copy, to compute this rank's own gradient another way.
        let (mut local_vs, local) = Mlp::seeded(5, &SIZES, Kind::Float);
        let mut worst: f64 = 0.0;
        for step in 0..4 {
            let (x, y) = data.batch((step * 3 + ddp.rank() as i64) * 16, 16);
            local_vs.copy(&vs)?;
            let mut local_params = ddp_workbook::models::named_parameters(&local_vs);
            local_params.iter_mut().for_each(|(_, p)| p.zero_grad());
            mse(&local.forward(&x), &y).backward();
            let own = flat_gradients(&local_params);
            let everyone = pg.all_gather(&own)?; // the ranks' own gradients, for the exact mean
            optimizer.zero_grad();
            ddp.backward(&mse(&ddp.forward(&x), &y))?;
            let synced = flat_gradients(ddp.parameters());
            no_read_before_wait(&synced).map_err(|e| anyhow::anyhow!("step {step}: {e}"))?;
            worst =
                worst.max(within_bound(&synced, &everyone).map_err(|e| anyhow::anyhow!("step {step}: {e}"))?);
            ddp.optimizer_step(&mut optimizer)?;
            let replicas = pg.all_gather(&flat_parameters(ddp.parameters()))?;
            for (rank, replica) in replicas.iter().enumerate() {
                anyhow::ensure!(
                    same_bits(replica, &replicas[0]),
                    "step {step}: rank {rank}'s weights differ from rank 0's"
                );
            }
        }
        Ok(worst)
    });
    println!("worst gradient error over 4 steps: {:.3} of the bound", worst[0]);
}
