//! Chapter 13 tests, part 1: `reduce_scatter_bucket` and `keep_shard` on one
//! bucket built by hand. Compiled into `cargo test --test chapter_13`.
//!
//! Three ranks; the bucket has three members of 3, 2 and 2 elements (the
//! second without a gradient on every rank), 7 elements padded to 9. Rank
//! r's gradients are known in advance, so the sum every rank must receive
//! is computed here, in one process, adding rank 0's, 1's and 2's in that
//! order, as every backend reduces, then divided by 3 as DDP divides. The
//! values are chosen so that every rank's chunk holds an element where a
//! multiplication by 1/3 rounds otherwise than that division.

use ddp_workbook::ch13_sharded_gradients::{learner, shard_of};
use ddp_workbook::check::same_bits;
use ddp_workbook::ddp;
use ddp_workbook::dist::Group;
use ddp_workbook::tch::{Device, Kind, Tensor};

use crate::common::run;

const WORLD: usize = 3;
const NUMELS: [i64; 3] = [3, 2, 2];

/// Rank `rank`'s gradient of member `m` (None: the member gets none).
fn gradient(rank: usize, m: usize) -> Option<Tensor> {
    (m != 1).then(|| {
        let base = Tensor::arange(NUMELS[m], (Kind::Double, Device::Cpu)) * 0.1 + 1.0 / 9.0;
        base * (rank as f64 + 1.0) + m as f64
    })
}

/// The members of rank `rank`, with their gradients in place.
fn members(rank: usize) -> Vec<(String, Tensor)> {
    (0..NUMELS.len())
        .map(|m| {
            let param = Tensor::zeros([NUMELS[m]], (Kind::Double, Device::Cpu)).set_requires_grad(true);
            if let Some(grad) = gradient(rank, m) {
                (&param * &grad).sum(Kind::Double).backward(); // d/dparam = grad
            }
            (format!("member{m}"), param)
        })
        .collect()
}

/// Rank `rank`'s whole padded buffer.
fn flat(rank: usize) -> Tensor {
    let mut pieces: Vec<Tensor> = (0..NUMELS.len())
        .map(|m| gradient(rank, m).unwrap_or_else(|| Tensor::zeros([NUMELS[m]], (Kind::Double, Device::Cpu))))
        .collect();
    pieces.push(Tensor::zeros([2], (Kind::Double, Device::Cpu)));
    Tensor::cat(&pieces, 0)
}

/// The ranks' padded buffers summed in rank order, as every backend sums.
fn ranks_sum() -> Tensor {
    (1..WORLD).fold(flat(0), |sum, r| flat(r) + sum)
}

/// DDP's average of the padded buffer: the sum divided by 3, as DDP's
/// `f_div_scalar_` divides its all-reduced bucket.
fn ddp_average() -> Tensor {
    let mut average = ranks_sum();
    let _ = average.f_div_scalar_(WORLD as f64).expect("dividing the sum");
    average
}

/// Rank `rank`'s chunk of `buffer` (3 of the 9 elements).
fn chunk_of(buffer: &Tensor, rank: usize) -> Tensor {
    buffer.narrow(0, 3 * rank as i64, 3)
}

#[test]
fn reduce_scatter_bucket_sends_the_padded_gradients_and_lets_the_full_ones_go() {
    let got = run(WORLD, |pg: Group| {
        let rank = pg.rank();
        let members = members(rank);
        let shard = shard_of(7, WORLD, rank);
        let in_flight = learner::reduce_scatter_bucket(pg.as_ref(), &members, shard)?;
        let kept: Vec<bool> = members.iter().map(|(_, p)| p.grad().defined()).collect();
        let sent = in_flight.flat.copy();
        let chunk = ddp::keep_shard(pg.as_ref(), in_flight)?; // the library's: this test is about the launch
        Ok((kept, sent, chunk))
    });
    let average = ddp_average();
    for (rank, (kept, sent, chunk)) in got.into_iter().enumerate() {
        assert!(
            !kept.iter().any(|&k| k),
            "rank {rank}: members {kept:?} still hold a gradient after their bucket left: once the buffer \
             holds their values, let them go (clear_grad), or ZeRO-2 keeps DDP's full gradient"
        );
        assert_eq!(sent.size(), vec![9], "rank {rank}: the buffer that leaves is 7 elements padded to 9");
        assert!(
            same_bits(&sent, &flat(rank)),
            "rank {rank}: the buffer that left is {sent:?}, expected the gradients back to back \
             (zeros for the member without one), then two zeros of padding"
        );
        let mine = chunk_of(&average, rank);
        assert!(
            same_bits(&chunk, &mine),
            "rank {rank}: after the library's finish, the shard is not DDP's average of chunk {rank}: \
             the library's keep_shard divides the chunk that lands by the world size, as DDP divides, \
             so the chunk that lands must be the ranks' sum (`InFlight::chunk`)"
        );
    }
}

#[test]
fn keep_shard_holds_this_ranks_chunk_of_ddps_average() {
    let got = run(WORLD, |pg: Group| {
        let rank = pg.rank();
        let shard = shard_of(7, WORLD, rank);
        let in_flight = ddp::reduce_scatter_bucket(pg.as_ref(), &members(rank), shard)?; // the library's
        Ok(learner::keep_shard(pg.as_ref(), in_flight)?)
    });
    let average = ddp_average();
    for (rank, chunk) in got.into_iter().enumerate() {
        let mine = chunk_of(&average, rank);
        let sum = chunk_of(&ranks_sum(), rank);
        let times_a_third = &sum * (1.0 / WORLD as f64);
        // The test's own teeth: a multiplication by 1/3 must fail on every rank.
        assert!(
            !same_bits(&times_a_third, &mine),
            "the test's gradients no longer tell a multiplication by 1/3 from DDP's division in chunk {rank}"
        );
        let cause = if same_bits(&chunk, &sum) {
            "no division: the chunk that landed is the ranks' sum, and DDP keeps their average"
        } else if same_bits(&chunk, &times_a_third) {
            "a multiplication by 1/N, which rounds otherwise than DDP's division by N"
        } else {
            "compare with DDP: the sum over the ranks, then divided by the world size"
        };
        assert!(
            same_bits(&chunk, &mine),
            "rank {rank}: keep_shard kept {chunk:?}, DDP's average of chunk {rank} is {mine:?}. Likely: {cause}"
        );
    }
}
