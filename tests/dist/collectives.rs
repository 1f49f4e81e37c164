//! Every collective gives the right result, bitwise the same on every rank,
//! for world sizes 1 to 4 and for f32, f64 and i64 tensors.
//! Run: `cargo test --test dist collectives`

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use approx::relative_eq;
use ddp_workbook::dist::ReduceOp;
use ddp_workbook::tch::{Kind, Tensor};

use super::{assert_same_on_every_rank, bytes, input, run_ok, values};

const SIZES: [usize; 4] = [1, 2, 3, 4];
const KINDS: [Kind; 3] = [Kind::Float, Kind::Double, Kind::Int64];
const OPS: [ReduceOp; 5] = [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min, ReduceOp::Max, ReduceOp::Product];
const SHAPE: [i64; 2] = [4, 3];

/// The reduction of `inputs` worked out in f64, element by element: an
/// independent answer that a fake all-reduce cannot match.
fn reference(inputs: &[Tensor], op: ReduceOp) -> Vec<f64> {
    let per_rank: Vec<Vec<f64>> = inputs.iter().map(values).collect();
    (0..per_rank[0].len())
        .map(|i| {
            let column = per_rank.iter().map(|v| v[i]);
            match op {
                ReduceOp::Sum => column.sum(),
                ReduceOp::Avg => column.sum::<f64>() / inputs.len() as f64,
                ReduceOp::Min => column.fold(f64::INFINITY, f64::min),
                ReduceOp::Max => column.fold(f64::NEG_INFINITY, f64::max),
                ReduceOp::Product => column.product(),
            }
        })
        .collect()
}

/// Integers must match exactly; floats within rounding (relative 1e-5 for
/// f32, 1e-12 for f64: a handful of additions of values near 1).
fn assert_close(got: &Tensor, want: &[f64], what: &str) {
    let tolerance = match got.kind() {
        Kind::Float => 1e-5,
        Kind::Double => 1e-12,
        _ => 0.0,
    };
    for (i, (g, w)) in values(got).iter().zip(want).enumerate() {
        assert!(
            relative_eq!(g, w, epsilon = tolerance, max_relative = tolerance),
            "{what}: element {i} is {g}, expected {w}"
        );
    }
}

fn supports(kind: Kind, op: ReduceOp) -> bool {
    op != ReduceOp::Avg || kind != Kind::Int64
}

#[test]
fn all_reduce_gives_every_rank_the_same_reduction() {
    for n in SIZES {
        for kind in KINDS {
            for op in OPS.into_iter().filter(|&op| supports(kind, op)) {
                let what = format!("all_reduce({op:?}) of {kind:?} on {n} rank(s)");
                let results = run_ok(n, |pg| {
                    let mut t = input(pg.rank(), kind, &SHAPE);
                    pg.all_reduce(&mut t, op)?;
                    Ok(t)
                });
                assert_same_on_every_rank(&results, &what);
                let inputs: Vec<Tensor> = (0..n).map(|r| input(r, kind, &SHAPE)).collect();
                assert_close(&results[0], &reference(&inputs, op), &what);
                // Deterministic across runs too, not only across ranks.
                let again = run_ok(n, |pg| {
                    let mut t = input(pg.rank(), kind, &SHAPE);
                    pg.all_reduce(&mut t, op)?;
                    Ok(t)
                });
                assert!(bytes(&again[0]) == bytes(&results[0]), "{what}: a second run gave other bits");
            }
        }
    }
}

#[test]
fn all_reduce_async_results_land_on_wait_in_any_order() {
    for n in SIZES {
        for kind in [Kind::Float, Kind::Double] {
            let results = run_ok(n, |pg| {
                let (a, b) = (input(pg.rank(), kind, &SHAPE), input(pg.rank() + 10, kind, &[5]));
                let work_a = pg.all_reduce_async(&a, ReduceOp::Sum)?;
                let work_b = pg.all_reduce_async(&b, ReduceOp::Max)?;
                work_b.wait()?; // waiting out of order must work too
                work_a.wait()?;
                Ok((a, b))
            });
            let what = format!("all_reduce_async of {kind:?} on {n} rank(s)");
            let (a, b): (Vec<Tensor>, Vec<Tensor>) = results.into_iter().unzip();
            assert_same_on_every_rank(&a, &what);
            assert_same_on_every_rank(&b, &what);
            let inputs_a: Vec<Tensor> = (0..n).map(|r| input(r, kind, &SHAPE)).collect();
            let inputs_b: Vec<Tensor> = (0..n).map(|r| input(r + 10, kind, &[5])).collect();
            assert_close(&a[0], &reference(&inputs_a, ReduceOp::Sum), &what);
            assert_close(&b[0], &reference(&inputs_b, ReduceOp::Max), &what);
        }
    }
}

#[test]
fn broadcast_copies_the_roots_tensor_from_every_root() {
    for n in SIZES {
        for kind in KINDS {
            for root in 0..n {
                let results = run_ok(n, |pg| {
                    let mut t = input(pg.rank(), kind, &SHAPE);
                    pg.broadcast(&mut t, root)?;
                    Ok(t)
                });
                let what = format!("broadcast of {kind:?} from root {root} of {n}");
                assert_same_on_every_rank(&results, &what);
                assert!(
                    bytes(&results[0]) == bytes(&input(root, kind, &SHAPE)),
                    "{what}: not the root's tensor"
                );
            }
        }
    }
}

#[test]
fn all_gather_returns_every_ranks_tensor_in_rank_order() {
    for n in SIZES {
        for kind in KINDS {
            let results = run_ok(n, |pg| pg.all_gather(&input(pg.rank(), kind, &SHAPE)).map_err(Into::into));
            for (rank, gathered) in results.iter().enumerate() {
                assert_eq!(
                    gathered.len(),
                    n,
                    "all_gather on {n} rank(s): rank {rank} got {} tensors",
                    gathered.len()
                );
                for (source, tensor) in gathered.iter().enumerate() {
                    let want = input(source, kind, &SHAPE);
                    assert!(
                        bytes(tensor) == bytes(&want),
                        "rank {rank}: entry {source} is not rank {source}'s {kind:?} tensor"
                    );
                }
            }
        }
    }
}

#[test]
fn reduce_scatter_gives_rank_i_chunk_i_of_the_all_reduce() {
    for n in SIZES {
        for kind in KINDS {
            for op in
                [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max].into_iter().filter(|&op| supports(kind, op))
            {
                let shape = [2 * n as i64, 3]; // two rows per rank
                let results = run_ok(n, |pg| {
                    let mine = input(pg.rank(), kind, &shape);
                    let chunk = pg.reduce_scatter(&mine, op)?; // [2, 3]
                    let mut whole = mine.copy();
                    pg.all_reduce(&mut whole, op)?; // [2n, 3]
                    Ok((chunk, whole))
                });
                let what = format!("reduce_scatter({op:?}) of {kind:?} on {n} rank(s)");
                for (rank, (chunk, whole)) in results.iter().enumerate() {
                    assert_eq!(chunk.size(), vec![2, 3], "{what}: rank {rank}'s chunk shape");
                    let row = 2 * rank as i64;
                    // The same reduction order as all_reduce: the same bits.
                    let from_all_reduce = whole.narrow(0, row, 2);
                    assert!(
                        bytes(chunk) == bytes(&from_all_reduce),
                        "{what}: rank {rank} got {chunk}, all_reduce gives {from_all_reduce}"
                    );
                }
                let inputs: Vec<Tensor> = (0..n).map(|r| input(r, kind, &shape)).collect();
                assert_close(&results[0].1, &reference(&inputs, op), &what);
            }
        }
    }
}

#[test]
fn barrier_releases_no_rank_before_all_have_arrived() {
    for n in SIZES {
        let arrivals = AtomicUsize::new(0);
        run_ok(n, |pg| {
            for round in 1..=3 {
                if pg.rank() == n - 1 {
                    // The last rank is slow: a barrier that does not wait would let the others run ahead.
                    std::thread::sleep(Duration::from_millis(30));
                }
                arrivals.fetch_add(1, Ordering::SeqCst);
                pg.barrier()?;
                let seen = arrivals.load(Ordering::SeqCst);
                anyhow::ensure!(
                    seen >= round * n,
                    "rank {} left barrier {round} after only {seen} arrivals",
                    pg.rank()
                );
            }
            Ok(())
        });
    }
}

#[test]
fn send_and_recv_deliver_messages_in_order_around_a_ring() {
    for n in [2, 3, 4] {
        for kind in KINDS {
            let received = run_ok(n, |pg| {
                let (rank, next, previous) = (pg.rank(), (pg.rank() + 1) % n, (pg.rank() + n - 1) % n);
                let mut buffer = Tensor::zeros([3], (kind, ddp_workbook::tch::Device::Cpu));
                for k in 0..3 {
                    let _ = buffer.fill_((rank * 100 + k) as f64);
                    pg.send(&buffer, next)?;
                }
                let _ = buffer.fill_(-1.0); // sends are copies: this must not reach the receiver
                let mut got = Vec::new();
                for _ in 0..3 {
                    pg.recv(&mut buffer, previous)?;
                    got.push(values(&buffer));
                }
                Ok(got)
            });
            for (rank, got) in received.iter().enumerate() {
                let previous = (rank + n - 1) % n;
                let want: Vec<Vec<f64>> = (0..3).map(|k| vec![(previous * 100 + k) as f64; 3]).collect();
                assert_eq!(got, &want, "{kind:?} on {n} ranks: rank {rank}'s messages from rank {previous}");
            }
        }
    }
}

/// Prints how long a 4-rank all-reduce of one 25 MiB f32 bucket (PyTorch's
/// default bucket size) takes, next to the cost of the plain tensor work
/// inside it. Not a pass/fail test: timings depend on the machine.
///
/// On the 2-core development machine (debug build; libtorch's kernels are
/// optimised either way): about 55 ms per call when quiet, 250 ms under heavy
/// load from other jobs, next to 14 ms for one 25 MiB copy and 12 ms for one
/// add. The call does one copy, three adds and four copy-outs (one per rank),
/// about 110 ms of work in a row; the copy-outs run outside the lock, in
/// parallel, which is how the call takes less.
/// Run: `cargo test --test dist timing -- --ignored --nocapture`
#[test]
#[ignore = "prints timings; run it on purpose"]
fn timing_of_a_25_mib_all_reduce() {
    use std::time::Instant;
    let numel = 25 * 1024 * 1024 / 4; // 25 MiB of f32
    let rounds = 10;
    let per_rank = run_ok(4, |pg| {
        let mut bucket = Tensor::ones([numel], (Kind::Float, ddp_workbook::tch::Device::Cpu));
        pg.barrier()?;
        let started = Instant::now();
        for _ in 0..rounds {
            pg.all_reduce(&mut bucket, ReduceOp::Sum)?;
        }
        Ok(started.elapsed() / rounds)
    });
    let (mut a, b) = (
        Tensor::ones([numel], (Kind::Float, ddp_workbook::tch::Device::Cpu)),
        Tensor::ones([numel], (Kind::Float, ddp_workbook::tch::Device::Cpu)),
    );
    let started = Instant::now();
    for _ in 0..rounds {
        a.copy_(&b);
    }
    let copy = started.elapsed() / rounds;
    let started = Instant::now();
    for _ in 0..rounds {
        let _ = a.f_add_(&b).expect("add");
    }
    let add = started.elapsed() / rounds;
    println!("4-rank all_reduce of 25 MiB f32: {per_rank:?} per call on each rank");
    println!(
        "one 25 MiB copy: {copy:?}; one 25 MiB add: {add:?}; intra-op threads: {}",
        ddp_workbook::tch::get_num_threads()
    );
}
