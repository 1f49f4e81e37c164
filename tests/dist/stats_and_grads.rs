//! The call counters, and collectives on what DDP really exchanges: model
//! parameters (which require grad) and their gradients (`p.grad()` handles).
//! Run: `cargo test --test dist stats_and_grads`

use ddp_workbook::dist::{CommStats, ReduceOp};
use ddp_workbook::models::{named_parameters, Mlp};
use ddp_workbook::tch::nn::Module;
use ddp_workbook::tch::{Device, Kind, Tensor};

use super::{assert_same_on_every_rank, bytes, run_ok, values};

#[test]
fn stats_count_every_call_and_byte() {
    let stats = run_ok(2, |pg| {
        let fresh = pg.stats();
        let f32s = |n: i64| Tensor::ones([n], (Kind::Float, Device::Cpu));
        pg.broadcast(&mut f32s(4), 0)?; // 16 bytes
        pg.all_reduce(&mut Tensor::ones([4], (Kind::Double, Device::Cpu)), ReduceOp::Sum)?; // 32 bytes
        pg.all_reduce_async(&f32s(2), ReduceOp::Max)?.wait()?; // 8 bytes
        pg.all_gather(&Tensor::ones([3], (Kind::Int64, Device::Cpu)))?; // 24 bytes
        let _chunk = pg.reduce_scatter(&f32s(4), ReduceOp::Sum)?; // 16 bytes
        pg.barrier()?;
        let other = 1 - pg.rank();
        pg.send(&f32s(5), other)?; // 20 bytes
        pg.recv(&mut f32s(5), other)?;
        Ok((fresh, pg.stats()))
    });
    let want = CommStats {
        broadcast: 1,
        all_reduce: 2,
        all_gather: 1,
        reduce_scatter: 1,
        barrier: 1,
        send: 1,
        recv: 1,
        collective_bytes: 16 + 32 + 8 + 24 + 16,
        p2p_bytes_sent: 20,
        broadcast_bytes: 16,
        all_reduce_bytes: 32 + 8,
        all_gather_bytes: 2 * 24, // the gathered output: both ranks' 24 bytes
        reduce_scatter_bytes: 16,
    };
    for (rank, (fresh, after)) in stats.iter().enumerate() {
        assert_eq!(fresh, &CommStats::default(), "rank {rank}: a new group has made no calls");
        assert_eq!(after, &want, "rank {rank}");
        assert_eq!(after.collectives(), 6, "rank {rank}: collectives() counts the five kinds, not send/recv");
        // A ring of 2: half of each reduce-scatter, all-gather and broadcast
        // byte crosses the wire, and twice that of each all-reduce byte.
        assert_eq!(after.ring_wire_bytes(2), 0.5 * (16.0 + 48.0 + 16.0) + 2.0 * 0.5 * 40.0, "rank {rank}");
        assert_eq!(after.since(fresh), want, "rank {rank}: since() subtracts the counts before");
    }
}

#[test]
fn reduce_scatter_async_leaves_what_reduce_scatter_returns() {
    let got = run_ok(3, |pg| {
        let values = Tensor::arange(6, (Kind::Double, Device::Cpu)) / 3.0 + pg.rank() as f64;
        let blocking = pg.reduce_scatter(&values, ReduceOp::Sum)?;
        let output = Tensor::zeros([2], (Kind::Double, Device::Cpu));
        pg.reduce_scatter_async(&values, ReduceOp::Sum, &output)?.wait()?;
        Ok((blocking, output, pg.stats().reduce_scatter))
    });
    for (rank, (blocking, output, calls)) in got.iter().enumerate() {
        // By hand: chunk r of (v + 0) + (v + 1) + (v + 2), added in rank order.
        let v = Tensor::arange(6, (Kind::Double, Device::Cpu)) / 3.0;
        let by_hand = ((&v + 1.0) + (&v + 0.0) + (&v + 2.0)).narrow(0, 2 * rank as i64, 2);
        assert!(
            output.equal(blocking),
            "rank {rank}: the asynchronous reduce-scatter left {output:?}, not {blocking:?}"
        );
        assert!(output.allclose(&by_hand, 0.0, 1e-15, false), "rank {rank}: {output:?}, by hand {by_hand:?}");
        assert_eq!(*calls, 2, "rank {rank}: both calls are counted");
    }
}

/// A batch that differs per rank: [2, 4].
fn batch(rank: usize) -> Tensor {
    Tensor::arange(8, (Kind::Double, Device::Cpu)).reshape([2, 4]) / 8.0 - 0.3 * rank as f64
}

/// Each rank's parameters (after the broadcast) and averaged gradients.
type ParamsAndGrads = (Vec<Tensor>, Vec<Tensor>);

#[test]
fn parameters_broadcast_and_gradients_average_in_place() {
    for n in [1, 2, 3] {
        let per_rank: Vec<ParamsAndGrads> = run_ok(n, |pg| {
            // A different seed on every rank: only the broadcast makes them equal.
            let (vs, mlp) = Mlp::seeded(100 + pg.rank() as i64, &[4, 8, 1], Kind::Double);
            for (name, mut p) in named_parameters(&vs) {
                pg.broadcast(&mut p, 0)?;
                anyhow::ensure!(p.requires_grad() && p.is_leaf(), "{name} is no longer a trainable leaf");
            }
            mlp.forward(&batch(pg.rank())).pow_tensor_scalar(2).mean(Kind::Double).backward();
            for (_, p) in named_parameters(&vs) {
                pg.all_reduce(&mut p.grad(), ReduceOp::Avg)?; // writes into p's own gradient
            }
            // Read the gradients again through fresh handles: the all-reduce
            // must have changed the parameters' gradients, not a copy.
            let params = named_parameters(&vs).iter().map(|(_, p)| p.detach().copy()).collect();
            let grads = named_parameters(&vs).iter().map(|(_, p)| p.grad().copy()).collect();
            Ok((params, grads))
        });
        // What a single process computes: rank 0's weights, and the mean of
        // every rank's gradient on its own batch.
        let (vs, _) = Mlp::seeded(100, &[4, 8, 1], Kind::Double);
        let grads_of = |rank: usize| -> Vec<Tensor> {
            let (vs, mlp) = Mlp::seeded(100, &[4, 8, 1], Kind::Double); // fresh, zero gradients
            mlp.forward(&batch(rank)).pow_tensor_scalar(2).mean(Kind::Double).backward();
            named_parameters(&vs).iter().map(|(_, p)| p.grad().copy()).collect()
        };
        let local: Vec<Vec<Tensor>> = (0..n).map(grads_of).collect();
        for (i, (name, p)) in named_parameters(&vs).iter().enumerate() {
            let params: Vec<Tensor> = per_rank.iter().map(|(params, _)| params[i].shallow_clone()).collect();
            let grads: Vec<Tensor> = per_rank.iter().map(|(_, grads)| grads[i].shallow_clone()).collect();
            assert_same_on_every_rank(&params, &format!("parameter {name} on {n} rank(s)"));
            assert_same_on_every_rank(&grads, &format!("gradient of {name} on {n} rank(s)"));
            assert!(bytes(&params[0]) == bytes(&p.detach()), "{name}: not rank 0's weights");
            let mean =
                local.iter().map(|g| g[i].shallow_clone()).fold(p.zeros_like(), |acc, g| acc + g) / n as f64;
            let gap = (&grads[0] - &mean).abs().max().double_value(&[]);
            assert!(
                gap < 1e-12,
                "gradient of {name} on {n} rank(s) is {gap} away from the mean of the ranks' gradients"
            );
        }
    }
}

#[test]
fn tensors_that_require_grad_can_be_gathered_and_scattered() {
    let results = run_ok(2, |pg| {
        let p = (Tensor::ones([2, 3], (Kind::Float, Device::Cpu)) * (pg.rank() + 1) as f64)
            .set_requires_grad(true);
        let gathered = pg.all_gather(&p)?;
        let chunk = pg.reduce_scatter(&p, ReduceOp::Sum)?;
        Ok((gathered.iter().map(values).collect::<Vec<_>>(), values(&chunk), chunk.requires_grad()))
    });
    for (rank, (gathered, chunk, chunk_requires_grad)) in results.iter().enumerate() {
        assert_eq!(gathered, &vec![vec![1.0; 6], vec![2.0; 6]], "rank {rank}'s all_gather");
        assert_eq!(chunk, &vec![3.0; 3], "rank {rank}'s reduce_scatter chunk");
        assert!(
            !chunk_requires_grad,
            "rank {rank}: collective outputs are plain data, outside the autograd graph"
        );
    }
}
