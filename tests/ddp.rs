//! Tests of the finished DDP library (`src/ddp/`) beyond what the chapters
//! prove: the mistakes a user of the library can make, each caught with an
//! error that names the rank instead of replicas that silently drift apart.
//!
//! Run: `cargo test --test ddp`

mod common;
#[path = "ddp/construction.rs"]
mod construction;
#[path = "ddp/plan.rs"]
mod plan;

use common::{mse, spawn_options};
use ddp_workbook::data::Regression;
use ddp_workbook::ddp::{BucketCaps, SimpleDistributedDataParallelism};
use ddp_workbook::dist::{spawn_with, RankFailure};
use ddp_workbook::models::Mlp;
use ddp_workbook::tch::Kind;

const SIZES: &[i64] = &[4, 8, 1];
const SMALL: BucketCaps = BucketCaps { cap_bytes: 256, first_cap_bytes: 64 };

#[test]
fn no_sync_on_one_rank_only_fails_within_the_step_on_every_rank() {
    // Rank 1 wraps its first micro-batch in no_sync, rank 0 does not: rank
    // 0's first sync would pair with rank 1's second, and both would step
    // on averages of unrelated gradients.
    let result = spawn_with(spawn_options(2), |pg| {
        let (rank, data) = (pg.rank(), Regression::new(1, 8, 4, 1, Kind::Double));
        let (vs, model) = Mlp::seeded(2, SIZES, Kind::Double);
        let ddp = SimpleDistributedDataParallelism::with_bucket_caps(model, &vs, pg, SMALL)?;
        for micro_batch in 0..2 {
            let (x, y) = data.batch(4 * rank as i64 + 2 * micro_batch, 2);
            let loss = mse(&ddp.forward(&x), &y);
            if rank == 1 && micro_batch == 0 {
                let _no_sync = ddp.no_sync();
                ddp.backward(&loss)?;
            } else {
                ddp.backward(&loss)?;
            }
        }
        Ok(())
    });
    let error = result.expect_err("mis-paired syncs must not both succeed");
    println!("{error}");
    for rank in 0..2 {
        let Some(RankFailure::Error(failure)) = error.failure_of(rank) else {
            panic!("rank {rank} must fail with an error: {error}")
        };
        let message = format!("{failure:#}");
        assert!(
            message.contains("after 1 backward pass(es)") && message.contains("after 2 backward pass(es)"),
            "rank {rank}: the error must show the two ranks' different syncs: {message}"
        );
    }
}

#[test]
fn no_sync_guards_dropped_out_of_order_keep_sync_off_until_the_last_closes() {
    // Two guards, the first dropped first (possible with `drop` or by
    // moving a guard): while either is open nothing may sync, and once both
    // are closed every backward must sync again, as one process expects.
    let all_reduces = spawn_with(spawn_options(2), |pg| {
        let (rank, data) = (pg.rank(), Regression::new(1, 8, 4, 1, Kind::Double));
        let (vs, model) = Mlp::seeded(2, SIZES, Kind::Double);
        let ddp = SimpleDistributedDataParallelism::with_bucket_caps(model, &vs, pg, SMALL)?;
        let calls = || ddp.stats().all_reduce;
        let (x, y) = data.batch(4 * rank as i64, 4);
        let (first, second) = (ddp.no_sync(), ddp.no_sync());
        drop(first);
        let (on_inside, before) = (ddp.require_backward_grad_sync(), calls());
        ddp.backward(&mse(&ddp.forward(&x), &y))?;
        let inside = calls() - before;
        drop(second);
        let (on_after, before) = (ddp.require_backward_grad_sync(), calls());
        ddp.backward(&mse(&ddp.forward(&x), &y))?;
        Ok((on_inside, inside, on_after, calls() - before))
    })
    .unwrap_or_else(|e| panic!("{e}"));
    for (rank, &(on_inside, inside, on_after, after)) in all_reduces.iter().enumerate() {
        assert!(
            !on_inside && inside == 0,
            "rank {rank}: the second guard is open, yet it synced ({inside} all-reduces)"
        );
        assert!(on_after && after > 0, "rank {rank}: both guards are closed, yet it did not sync");
    }
}

#[test]
fn micro_batch_size_refuses_zero_ranks_and_overflow_instead_of_panicking() {
    use ddp_workbook::ddp::micro_batch_size;
    let zero_ranks = micro_batch_size(32, 0, 2).expect_err("zero ranks cannot share a batch").to_string();
    assert!(zero_ranks.contains("the world size") && zero_ranks.contains("got 0"), "{zero_ranks}");
    let overflow = micro_batch_size(i64::MAX, usize::MAX, 2).expect_err("the product overflows").to_string();
    assert!(overflow.contains("world size x accumulation steps"), "{overflow}");
    let negative = micro_batch_size(-1, 2, 2).expect_err("a negative batch").to_string();
    assert!(negative.contains("the global batch") && negative.contains("-1"), "{negative}");
    assert_eq!(micro_batch_size(32, 2, 2).expect("32 = 8 x 2 x 2"), 8);
}

#[test]
fn gradients_live_in_the_buckets_after_the_first_sync_and_stay_there() {
    let placed = spawn_with(spawn_options(2), |pg| {
        let (rank, data) = (pg.rank(), Regression::new(1, 8, 4, 1, Kind::Double));
        let (vs, model) = Mlp::seeded(2, SIZES, Kind::Double);
        let ddp = SimpleDistributedDataParallelism::with_bucket_caps(model, &vs, pg, SMALL)?;
        let mut optimizer = ddp_workbook::train::AdamW::new(ddp.parameters(), 1e-3, 0.0);
        let mut where_after_each_step = vec![];
        for step in 0..3 {
            optimizer.zero_grad();
            let (x, y) = data.batch(4 * rank as i64, 4);
            ddp.backward(&mse(&ddp.forward(&x), &y))?;
            optimizer.step()?;
            // A bucket's gradients lie back to back in its one buffer, in
            // the bucket's order: each starts where the one before it ends.
            for bucket in ddp.buckets() {
                for pair in bucket.params.windows(2) {
                    let ((name, before), (_, after)) =
                        (&ddp.parameters()[pair[0]], &ddp.parameters()[pair[1]]);
                    let (before, after) = (before.grad(), after.grad());
                    let end = before.data_ptr() as usize + before.numel() * before.kind().elt_size_in_bytes();
                    anyhow::ensure!(
                        after.data_ptr() as usize == end,
                        "step {step}: the gradient after `{name}`'s is not next to it in the bucket"
                    );
                }
            }
            where_after_each_step.push(ddp.parameters()[0].1.grad().data_ptr() as usize);
        }
        Ok(where_after_each_step)
    })
    .unwrap_or_else(|e| panic!("{e}"));
    for (rank, pointers) in placed.iter().enumerate() {
        assert!(pointers.windows(2).all(|w| w[0] == w[1]), "rank {rank}: a gradient moved between steps");
    }
}

#[test]
fn train_step_and_check_micro_batches_refuse_the_same_micro_batches_in_the_same_words() {
    use ddp_workbook::ddp::{check_micro_batches, train_step};
    use ddp_workbook::tch::{nn, nn::OptimizerConfig, Tensor};
    let refusals = spawn_with(spawn_options(2), |pg| {
        let (vs, model) = Mlp::seeded(2, SIZES, Kind::Double);
        let ddp = SimpleDistributedDataParallelism::with_bucket_caps(model, &vs, pg, SMALL)?;
        let mut sgd = nn::Sgd::default().build(&vs, 0.1)?;
        let data = Regression::new(1, 8, 4, 1, Kind::Double);
        let mut refused = vec![];
        for sizes in [vec![2, 1], vec![0, 0], vec![]] {
            // Consecutive rows: [0, 1], [2] for sizes [2, 1].
            let lists: Vec<Vec<i64>> = sizes
                .iter()
                .scan(0, |start, &n| {
                    *start += n;
                    Some((*start - n..*start).collect())
                })
                .collect();
            let lists: Vec<&[i64]> = lists.iter().map(Vec::as_slice).collect();
            let stepped = train_step(&ddp, &mut sgd, &lists, |rows| {
                let index = Tensor::from_slice(rows);
                mse(&ddp.forward(&data.x.index_select(0, &index)), &data.y.index_select(0, &index))
            });
            let tensors: Vec<(Tensor, Tensor)> =
                sizes.iter().map(|&n| (data.x.narrow(0, 0, n), data.y.narrow(0, 0, n))).collect();
            let checked = check_micro_batches(&tensors);
            match (stepped, checked) {
                (Err(step), Err(check)) => refused.push((step.to_string(), check.to_string())),
                other => anyhow::bail!("sizes {sizes:?} must be refused by both: {other:?}"),
            }
        }
        Ok(refused)
    })
    .unwrap_or_else(|e| panic!("{e}"));
    for (rank, refused) in refusals.iter().enumerate() {
        for (step, check) in refused {
            assert!(step.starts_with(&format!("rank {rank}: invalid train_step: ")), "{step}");
            assert!(step.ends_with(check.as_str()), "the same words:\n  {step}\n  {check}");
        }
    }
}

#[test]
fn sampler_options_name_pytorchs_keyword_arguments_with_its_defaults() {
    use ddp_workbook::ddp::{permutation, shard_indices, DistributedSampler, SamplerOptions};
    // torch.utils.data.DistributedSampler(shuffle=True, seed=0, drop_last=False)
    assert_eq!(SamplerOptions::default(), SamplerOptions { shuffle: true, seed: 0, drop_last: false });
    let shards = spawn_with(spawn_options(3), |pg| {
        let options = SamplerOptions { seed: 7, ..SamplerOptions::default() };
        let mut sampler = DistributedSampler::sharded(pg.as_ref(), 10, options)?;
        sampler.set_epoch(2);
        Ok(sampler.indices())
    })
    .unwrap_or_else(|e| panic!("{e}"));
    // The same shards from the sampler's parts: the order drawn from seed + epoch, padded, strided.
    let order = permutation(10, 9);
    for (rank, shard) in shards.iter().enumerate() {
        assert_eq!(shard, &shard_indices(&order, 3, rank, false), "rank {rank}");
    }
}
