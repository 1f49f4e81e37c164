//! The MPI backend's all-reduce through the
//! node's shared memory (`src/dist/mpi/shm.rs`) gives, bitwise on every
//! rank, the sum that one process computes by adding the ranks' tensors in
//! rank order, for every dtype and operation, sizes that do not divide by
//! the ranks, calls that grow the window, and several calls in flight; on 1
//! to 4 processes, on one node and across (pretend) nodes, whose sum must
//! stay in rank order too. Each test also counts the calls that went
//! through the window, so a silent fall-back to Open MPI fails it.
//!
//! Run: cargo test --features mpi --test mpi shared_memory

use ddp_workbook::dist::{self, DistError, ProcessGroup, ReduceOp};
use ddp_workbook::tch::{Device, Kind, Tensor};
use ddp_workbook::with_seed;

use crate::harness::{launch, tests_on_processes};

/// Elements per call: 1 (fewer than the ranks), primes, 1.2 and 2.4 MB of
/// float32 and float64 (more than the first window of 1 MiB: it must grow
/// twice), then small again.
pub(crate) const SIZES: [i64; 6] = [1, 7, 1000, 65_537, 300_001, 5];

/// Rank `rank`'s values for a call of `numel` elements: floats of spread
/// magnitudes (whose sum depends on the order of the additions), cut to
/// `kind`.
pub(crate) fn values(rank: usize, numel: i64, kind: Kind) -> Tensor {
    with_seed(1300 + rank as i64 + numel, || {
        let opts = (Kind::Double, Device::Cpu);
        let spread = Tensor::randn([numel], opts) * Tensor::randn([numel], opts).exp() * 50.0;
        match kind {
            Kind::Bool => spread.gt(0.0),
            Kind::Int | Kind::Int64 => spread.round().remainder(7).to_kind(kind),
            _ => spread.to_kind(kind),
        }
    })
}

/// The calls each test makes: (kind, operation).
pub(crate) const CALLS: [(Kind, ReduceOp); 11] = [
    (Kind::Float, ReduceOp::Sum),
    (Kind::Float, ReduceOp::Avg),
    (Kind::Float, ReduceOp::Max),
    (Kind::Float, ReduceOp::Min),
    (Kind::Float, ReduceOp::Product),
    (Kind::Double, ReduceOp::Sum),
    (Kind::BFloat16, ReduceOp::Sum),
    (Kind::BFloat16, ReduceOp::Avg),
    (Kind::Int64, ReduceOp::Sum),
    (Kind::Int, ReduceOp::Product),
    (Kind::Bool, ReduceOp::Sum),
];

/// What one process computes for the call: rank 0's tensor, then each
/// next rank's folded in, one element-wise operation at a time.
pub(crate) fn in_rank_order(size: usize, numel: i64, kind: Kind, op: ReduceOp) -> Tensor {
    in_group_order(&(0..size).collect::<Vec<_>>(), numel, kind, op)
}

/// [`in_rank_order`] for a group of these world ranks, in the group's order.
pub(crate) fn in_group_order(ranks: &[usize], numel: i64, kind: Kind, op: ReduceOp) -> Tensor {
    let size = ranks.len();
    let mut acc = values(ranks[0], numel, kind);
    for &rank in &ranks[1..] {
        let next = values(rank, numel, kind);
        acc = match op {
            ReduceOp::Sum | ReduceOp::Avg => &acc + &next,
            ReduceOp::Product => &acc * &next,
            ReduceOp::Min => acc.minimum(&next),
            ReduceOp::Max => acc.maximum(&next),
        };
    }
    if op == ReduceOp::Avg {
        acc /= size as f64;
    }
    acc
}

/// Every call of [`CALLS`] at every size of [`SIZES`], the floats also as
/// two calls in flight at once (waited in reverse order); each result must
/// equal [`in_rank_order`]'s bit for bit. Returns how many calls it made.
pub(crate) fn every_call_is_the_rank_order_sum(pg: &dyn ProcessGroup) -> anyhow::Result<u64> {
    let (rank, size) = (pg.rank(), pg.world_size());
    let mut calls = 0;
    for numel in SIZES {
        for (kind, op) in CALLS {
            let mut t = values(rank, numel, kind);
            pg.all_reduce(&mut t, op)?;
            let want = in_rank_order(size, numel, kind, op);
            anyhow::ensure!(
                t.equal(&want),
                "rank {rank}: all_reduce({op:?}) of {kind:?}[{numel}] on {size} processes differs from the \
                 rank-order result by {} at most",
                (t.to_kind(Kind::Double) - want.to_kind(Kind::Double)).abs().max().double_value(&[])
            );
            calls += 1;
        }
        let (a, b) = (values(rank, numel, Kind::Float), values(rank, numel, Kind::Double));
        let (work_a, work_b) =
            (pg.all_reduce_async(&a, ReduceOp::Sum)?, pg.all_reduce_async(&b, ReduceOp::Max)?);
        work_b.wait()?;
        work_a.wait()?;
        anyhow::ensure!(
            a.equal(&in_rank_order(size, numel, Kind::Float, ReduceOp::Sum)),
            "rank {rank}: async sum"
        );
        anyhow::ensure!(
            b.equal(&in_rank_order(size, numel, Kind::Double, ReduceOp::Max)),
            "rank {rank}: async max"
        );
        calls += 2;
    }
    Ok(calls)
}

/// The body of the tests below: every call right, and every one through the window.
fn through_the_window(pg: dist::Group) -> anyhow::Result<()> {
    let before = dist::mpi::shared_memory_all_reduces();
    let calls = every_call_is_the_rank_order_sum(pg.as_ref())?;
    let through = dist::mpi::shared_memory_all_reduces() - before;
    anyhow::ensure!(
        through == calls,
        "rank {}: {through} of {calls} calls went through shared memory",
        pg.rank()
    );
    Ok(())
}

tests_on_processes! { "shared_memory", through_the_window;
    every_all_reduce_is_the_rank_order_sum_on_1_process: 1;
    every_all_reduce_is_the_rank_order_sum_on_2_processes: 2;
    every_all_reduce_is_the_rank_order_sum_on_3_processes: 3;
    every_all_reduce_is_the_rank_order_sum_on_4_processes: 4;
}

/// Runs [`through_the_window`] with `env` and requires every rank to finish.
pub(crate) fn with_env(
    np: usize,
    test: &str,
    env: &[(&str, &str)],
    body: fn(dist::Group) -> anyhow::Result<()>,
) {
    let Some(job) = launch(np, test, env, body) else { return };
    let finished = job.output.matches("mpi-test-rank-finished").count();
    assert!(
        job.success && finished == np,
        "exit {:?}, {finished} of {np} ranks finished:\n{}",
        job.code,
        job.output
    );
}

// The leaders pass partial sums along and broadcast the total.
#[test]
fn across_2_nodes_of_2_the_sum_stays_in_rank_order() {
    let name = "shared_memory::across_2_nodes_of_2_the_sum_stays_in_rank_order";
    with_env(4, name, &[("DDP_MPI_SHM_RANKS_PER_NODE", "2")], through_the_window);
}

// A sum longer than the leaders pass on in one message (2 GiB; 4000 bytes
// here, under the test hook) is folded over messages in pieces instead:
// the same rank-order bits, and the shorter calls still use the window.
#[test]
fn across_2_nodes_of_2_a_sum_too_long_for_one_message_stays_in_rank_order() {
    let name = "shared_memory::across_2_nodes_of_2_a_sum_too_long_for_one_message_stays_in_rank_order";
    let env = [("DDP_MPI_SHM_RANKS_PER_NODE", "2"), ("DDP_MPI_MOST_PER_CALL", "4000")];
    with_env(4, name, &env, |pg| {
        let calls = every_call_is_the_rank_order_sum(pg.as_ref())?;
        let through = dist::mpi::shared_memory_all_reduces();
        anyhow::ensure!(
            through > 0 && through < calls,
            "{through} of {calls} calls went through shared memory: the long ones must not"
        );
        Ok(())
    });
}

#[test]
fn across_a_node_of_2_and_a_node_of_1_the_sum_stays_in_rank_order() {
    let name = "shared_memory::across_a_node_of_2_and_a_node_of_1_the_sum_stays_in_rank_order";
    with_env(3, name, &[("DDP_MPI_SHM_RANKS_PER_NODE", "2")], through_the_window);
}

// On 4 processes, where Open MPI's order would differ: `ordered.rs`.
#[test]
fn with_shared_memory_off_no_call_goes_through_the_window_on_2_processes() {
    let name = "shared_memory::with_shared_memory_off_no_call_goes_through_the_window_on_2_processes";
    with_env(2, name, &[("DDP_MPI_SHM", "off")], |pg| {
        let calls = every_call_is_the_rank_order_sum(pg.as_ref())?;
        let through = dist::mpi::shared_memory_all_reduces();
        anyhow::ensure!(calls > 0 && through == 0, "{through} calls went through shared memory");
        Ok(())
    });
}

#[test]
fn different_sizes_without_the_signature_check_are_a_mismatch_not_a_crash() {
    let name = "shared_memory::different_sizes_without_the_signature_check_are_a_mismatch_not_a_crash";
    with_env(2, name, &[("DDP_DEBUG", "off")], |pg| {
        // Rank 1's tensor is larger than the window rank 0 would make.
        let mut t = Tensor::ones([if pg.rank() == 0 { 4 } else { 1 << 20 }], (Kind::Float, Device::Cpu));
        match pg.all_reduce(&mut t, ReduceOp::Sum) {
            Err(error @ DistError::Mismatch { .. }) => {
                anyhow::ensure!(error.to_string().contains("different sizes"), "{error}")
            }
            other => anyhow::bail!("rank {}: expected a Mismatch, got {other:?}", pg.rank()),
        }
        let mut t = Tensor::ones([3], (Kind::Float, Device::Cpu));
        pg.all_reduce(&mut t, ReduceOp::Sum)?;
        anyhow::ensure!(t.equal(&(Tensor::ones([3], (Kind::Float, Device::Cpu)) * 2)), "after it: {t:?}");
        Ok(())
    });
}
