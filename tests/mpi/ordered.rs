//! Reductions that do not go through the node's shared memory keep the
//! rank order too (`src/dist/mpi/ordered.rs`): with `DDP_MPI_SHM=off`, on
//! sub-groups whose ranks are out of order, and every reduce-scatter
//! (ZeRO-1's), on 4 processes, where Open MPI's own collectives add in an
//! order of their own. Each result must equal, bit for bit, what one
//! process computes by folding the ranks' tensors in the group's order.
//!
//! Run: cargo test --features mpi --test mpi ordered

use ddp_workbook::dist::{self, ProcessGroup, ReduceOp};
use ddp_workbook::tch::Kind;

use crate::shared_memory::{every_call_is_the_rank_order_sum, in_group_order, values, with_env};

/// (kind, operation) of the reduce-scatters and sub-group all-reduces.
const CALLS: [(Kind, ReduceOp); 7] = [
    (Kind::Float, ReduceOp::Sum),
    (Kind::Float, ReduceOp::Avg),
    (Kind::Float, ReduceOp::Product),
    (Kind::Double, ReduceOp::Sum),
    (Kind::BFloat16, ReduceOp::Sum),
    (Kind::Int64, ReduceOp::Sum),
    (Kind::Float, ReduceOp::Max),
];

/// Elements per rank's row of a reduce-scatter: fewer than the ranks, a
/// prime, and 1.2 MB of float32.
const ROWS: [i64; 3] = [1, 7, 300_001];

/// Every reduce-scatter of [`CALLS`] equals this rank's row of the fold.
fn every_reduce_scatter_is_in_rank_order(pg: &dyn ProcessGroup) -> anyhow::Result<()> {
    let (rank, size) = (pg.rank(), pg.world_size());
    let ranks: Vec<usize> = (0..size).collect();
    for row in ROWS {
        let numel = row * size as i64;
        for (kind, op) in CALLS {
            let got = pg.reduce_scatter(&values(rank, numel, kind), op)?;
            let want = in_group_order(&ranks, numel, kind, op).chunk(size as i64, 0).swap_remove(rank);
            anyhow::ensure!(
                got.equal(&want),
                "rank {rank}: reduce_scatter({op:?}) of {kind:?}[{numel}] on {size} processes differs from \
                 the rank-order fold by {} at most",
                (got.to_kind(Kind::Double) - want.to_kind(Kind::Double)).abs().max().double_value(&[])
            );
        }
    }
    Ok(())
}

/// Every all-reduce of [`CALLS`] on the sub-group [3, 0, 2] (its rank 0 is
/// world rank 3) equals the fold in the sub-group's order.
fn every_sub_group_all_reduce_is_in_group_order(pg: &dyn ProcessGroup) -> anyhow::Result<()> {
    let members = [3, 0, 2];
    let Some(sub) = pg.new_group(&members)? else { return Ok(()) };
    for numel in [1, 1000, 300_001] {
        for (kind, op) in CALLS {
            let mut t = values(pg.rank(), numel, kind);
            sub.all_reduce(&mut t, op)?;
            let want = in_group_order(&members, numel, kind, op);
            anyhow::ensure!(
                t.equal(&want),
                "world rank {}: all_reduce({op:?}) of {kind:?}[{numel}] on sub-group {members:?} differs from \
                 the fold in its order by {} at most",
                pg.rank(),
                (t.to_kind(Kind::Double) - want.to_kind(Kind::Double)).abs().max().double_value(&[])
            );
        }
    }
    Ok(())
}

fn all_in_rank_order(pg: dist::Group) -> anyhow::Result<()> {
    let before = dist::mpi::shared_memory_all_reduces();
    let calls = every_call_is_the_rank_order_sum(pg.as_ref())?;
    let through = dist::mpi::shared_memory_all_reduces() - before;
    let shm_off = std::env::var("DDP_MPI_SHM").is_ok_and(|v| v == "off");
    anyhow::ensure!(
        !shm_off || (calls > 0 && through == 0),
        "with DDP_MPI_SHM=off, {through} of {calls} calls went through shared memory"
    );
    every_reduce_scatter_is_in_rank_order(pg.as_ref())?;
    every_sub_group_all_reduce_is_in_group_order(pg.as_ref())
}

#[test]
fn with_shared_memory_off_every_reduction_is_in_rank_order_on_4_processes() {
    let name = "ordered::with_shared_memory_off_every_reduction_is_in_rank_order_on_4_processes";
    with_env(4, name, &[("DDP_MPI_SHM", "off")], all_in_rank_order);
}

#[test]
fn with_shared_memory_on_sub_groups_and_reduce_scatters_are_in_rank_order_on_4_processes() {
    let name =
        "ordered::with_shared_memory_on_sub_groups_and_reduce_scatters_are_in_rank_order_on_4_processes";
    with_env(4, name, &[], all_in_rank_order);
}
