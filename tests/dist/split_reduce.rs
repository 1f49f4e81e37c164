//! The in-process all_reduce finished in place by its ranks
//! (`src/dist/local/split_reduce.rs`): ranks that wait on their handles in
//! different orders do not block each other, and the sum is the one of the
//! rank-ordered reduction, bitwise, whoever computes which slice.
//! Run: `cargo test --test dist split_reduce`

use ddp_workbook::dist::ReduceOp;
use ddp_workbook::tch::{Kind, Tensor};

use super::{assert_same_on_every_rank, bytes, input, run_ok};

#[test]
fn handles_waited_in_opposite_orders_all_complete() {
    let results = run_ok(3, |pg| {
        let tensors: Vec<Tensor> = (0..4).map(|i| input(pg.rank(), Kind::Float, &[64 + i])).collect();
        let mut works: Vec<_> =
            tensors.iter().map(|t| pg.all_reduce_async(t, ReduceOp::Sum)).collect::<Result<_, _>>()?;
        if pg.rank() == 1 {
            works.reverse(); // rank 1 waits for the last call first
        }
        for work in works {
            work.wait()?;
        }
        Ok(tensors)
    });
    for call in 0..4 {
        let per_rank: Vec<Tensor> = results.iter().map(|r| r[call].shallow_clone()).collect();
        assert_same_on_every_rank(&per_rank, &format!("call {call}"));
    }
}

#[test]
fn every_op_equals_the_rank_ordered_reduction_bitwise() {
    for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Product, ReduceOp::Min, ReduceOp::Max] {
        for world_size in [2, 3, 4] {
            let shape = [37, 3]; // slices of unequal length
            let results = run_ok(world_size, |pg| {
                let mut t = input(pg.rank(), Kind::Double, &shape);
                pg.all_reduce(&mut t, op)?;
                Ok(t)
            });
            // ((x0 op x1) op x2) op ..., then / N for Avg: the order the docs promise.
            let mut expected = input(0, Kind::Double, &shape);
            for rank in 1..world_size {
                let x = input(rank, Kind::Double, &shape);
                expected = match op {
                    ReduceOp::Sum | ReduceOp::Avg => &expected + &x,
                    ReduceOp::Product => &expected * &x,
                    ReduceOp::Min => expected.minimum(&x),
                    ReduceOp::Max => expected.maximum(&x),
                };
            }
            if op == ReduceOp::Avg {
                expected /= world_size as f64;
            }
            for (rank, got) in results.iter().enumerate() {
                assert!(
                    bytes(got) == bytes(&expected),
                    "{op:?} on {world_size} ranks, rank {rank}: not bitwise"
                );
            }
        }
    }
}

#[test]
fn ranks_whose_tensors_share_memory_get_the_sum_of_their_inputs() {
    // Ranks 1 and 2 are handed the same tensor x; rank 0 its own x0. Each
    // rank's input counts once: x0 + x + x (reduced in place along the
    // ranks, the shared memory would be counted twice over: 2 (x0 + x)).
    let shared = std::sync::Mutex::new(Tensor::from_slice(&[1.0f64, 2.0, 3.0, 4.0]));
    let results = run_ok(3, |pg| {
        let mut t = match pg.rank() {
            0 => Tensor::from_slice(&[10.0f64, 20.0, 30.0, 40.0]),
            _ => shared.lock().unwrap().shallow_clone(),
        };
        pg.all_reduce(&mut t, ReduceOp::Sum)?;
        Ok(Vec::<f64>::try_from(&t)?)
    });
    for (rank, got) in results.iter().enumerate() {
        assert_eq!(got, &vec![12.0, 24.0, 36.0, 48.0], "rank {rank}: x0 + 2x");
    }
}
