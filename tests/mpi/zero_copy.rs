//! Buffers from `alloc_buffer` (the MPI backend
//! maps them into every rank of the node: `src/dist/mpi/shm/regions.rs`)
//! are all-reduced where they lie, with no copy, into bitwise the sum one
//! process computes by adding the ranks' tensors in rank order, for every
//! dtype and operation of `shared_memory.rs`, sizes that do not divide by
//! the ranks, a view at an offset and calls in flight together, on 1 to 4
//! processes. A counter proves the path was taken; ranks that pass
//! different offsets, or a plain tensor, get the right sum through the copy
//! path instead; one process (no peer on its node) gets plain tensors, and
//! so does `DDP_MPI_SHM=copy`.
//!
//! Run: cargo test --features mpi --test mpi zero_copy

use ddp_workbook::dist::{self, ProcessGroup, ReduceOp};
use ddp_workbook::tch::{Device, Kind, Tensor};

use crate::harness::{launch, on_ranks, tests_on_processes};
use crate::shared_memory::{in_rank_order, values, CALLS, SIZES};

/// A buffer from `alloc_buffer` holding this rank's values for the call.
fn shared(pg: &dyn ProcessGroup, numel: i64, kind: Kind) -> anyhow::Result<Tensor> {
    let mut buffer = pg.alloc_buffer(numel as usize, kind, Device::Cpu)?;
    anyhow::ensure!(buffer.equal(&buffer.zeros_like()), "a fresh buffer is not zeroed");
    buffer.copy_(&values(pg.rank(), numel, kind));
    Ok(buffer)
}

fn ensure_rank_order(pg: &dyn ProcessGroup, t: &Tensor, kind: Kind, op: ReduceOp) -> anyhow::Result<()> {
    let (rank, size, numel) = (pg.rank(), pg.world_size(), t.numel() as i64);
    let want = in_rank_order(size, numel, kind, op);
    anyhow::ensure!(
        t.equal(&want),
        "rank {rank}: all_reduce({op:?}) of a shared {kind:?}[{numel}] on {size} processes differs from the \
         rank-order result by {} at most",
        (t.to_kind(Kind::Double) - want.to_kind(Kind::Double)).abs().max().double_value(&[])
    );
    Ok(())
}

/// Every call of `CALLS` at every size of `SIZES` on shared buffers, then
/// two in flight at once and a view at an offset; returns the calls made.
fn every_shared_call_is_the_rank_order_sum(pg: &dyn ProcessGroup) -> anyhow::Result<u64> {
    let mut calls = 0;
    for numel in SIZES {
        for (kind, op) in CALLS {
            let mut t = shared(pg, numel, kind)?;
            pg.all_reduce(&mut t, op)?;
            ensure_rank_order(pg, &t, kind, op)?;
            calls += 1;
        }
        let (a, b) = (shared(pg, numel, Kind::Float)?, shared(pg, numel, Kind::Double)?);
        let (work_a, work_b) =
            (pg.all_reduce_async(&a, ReduceOp::Sum)?, pg.all_reduce_async(&b, ReduceOp::Max)?);
        work_b.wait()?;
        work_a.wait()?;
        ensure_rank_order(pg, &a, Kind::Float, ReduceOp::Sum)?;
        ensure_rank_order(pg, &b, Kind::Double, ReduceOp::Max)?;
        // The second half of a buffer twice as large: the first stays as it was.
        let mut whole = pg.alloc_buffer(2 * numel as usize, Kind::Float, Device::Cpu)?;
        let _ = whole.fill_(7.0);
        let mut half = whole.narrow(0, numel, numel);
        half.copy_(&values(pg.rank(), numel, Kind::Float));
        pg.all_reduce(&mut half, ReduceOp::Sum)?;
        ensure_rank_order(pg, &half, Kind::Float, ReduceOp::Sum)?;
        let first = whole.narrow(0, 0, numel);
        anyhow::ensure!(first.equal(&first.full_like(7.0)), "rank {}: the other half changed", pg.rank());
        calls += 3;
    }
    Ok(calls)
}

/// The tests' body: every call right, every one in place when the node has
/// peers (and none on one process, whose buffers are plain tensors).
fn in_place(pg: dist::Group) -> anyhow::Result<()> {
    let (before, copied_before) =
        (dist::mpi::zero_copy_all_reduces(), dist::mpi::shared_memory_all_reduces());
    let calls = every_shared_call_is_the_rank_order_sum(pg.as_ref())?;
    let zero_copy = dist::mpi::zero_copy_all_reduces() - before;
    let copied = dist::mpi::shared_memory_all_reduces() - copied_before;
    let want = if pg.world_size() > 1 { (calls, 0) } else { (0, calls) };
    anyhow::ensure!(
        (zero_copy, copied) == want,
        "rank {}: of {calls} calls, {zero_copy} went in place and {copied} through the window; want {want:?}",
        pg.rank()
    );
    Ok(())
}

tests_on_processes! { "zero_copy", in_place;
    shared_buffers_on_1_process_are_plain_tensors_and_sum_right: 1;
    shared_buffers_are_summed_in_place_in_rank_order_on_2_processes: 2;
    shared_buffers_are_summed_in_place_in_rank_order_on_3_processes: 3;
    shared_buffers_are_summed_in_place_in_rank_order_on_4_processes: 4;
}

/// Rank 0 and the others disagree on where the tensor lies: every rank
/// must take the copy path together, and get the right sum.
fn disagreeing_ranks_take_the_copy_path(pg: dist::Group) -> anyhow::Result<()> {
    let (rank, numel) = (pg.rank(), 1001);
    let before = (dist::mpi::zero_copy_all_reduces(), dist::mpi::shared_memory_all_reduces());
    // Different offsets in one region.
    let whole = pg.alloc_buffer(numel as usize + 1, Kind::Float, Device::Cpu)?;
    let mut t = whole.narrow(0, i64::from(rank > 0), numel);
    t.copy_(&values(rank, numel, Kind::Float));
    pg.all_reduce(&mut t, ReduceOp::Sum)?;
    ensure_rank_order(pg.as_ref(), &t, Kind::Float, ReduceOp::Sum)?;
    // Rank 0 a shared buffer, the others a plain tensor (every rank
    // allocates: alloc_buffer is a collective).
    let buffer = shared(pg.as_ref(), numel, Kind::Double)?;
    let mut t = match rank {
        0 => buffer,
        _ => values(rank, numel, Kind::Double),
    };
    pg.all_reduce(&mut t, ReduceOp::Sum)?;
    ensure_rank_order(pg.as_ref(), &t, Kind::Double, ReduceOp::Sum)?;
    let after = (dist::mpi::zero_copy_all_reduces(), dist::mpi::shared_memory_all_reduces());
    anyhow::ensure!(
        (after.0 - before.0, after.1 - before.1) == (0, 2),
        "rank {rank}: {} calls went in place and {} through the window; want 0 and 2",
        after.0 - before.0,
        after.1 - before.1
    );
    Ok(())
}

#[test]
fn different_offsets_or_a_plain_tensor_on_one_rank_take_the_copy_path_on_2_processes() {
    let name = "zero_copy::different_offsets_or_a_plain_tensor_on_one_rank_take_the_copy_path_on_2_processes";
    on_ranks(2, name, disagreeing_ranks_take_the_copy_path);
}

#[test]
fn different_offsets_or_a_plain_tensor_on_one_rank_take_the_copy_path_on_3_processes() {
    let name = "zero_copy::different_offsets_or_a_plain_tensor_on_one_rank_take_the_copy_path_on_3_processes";
    on_ranks(3, name, disagreeing_ranks_take_the_copy_path);
}

#[test]
fn with_shared_memory_copy_the_buffers_are_plain_and_copied_through_the_window() {
    let name = "zero_copy::with_shared_memory_copy_the_buffers_are_plain_and_copied_through_the_window";
    let Some(job) = launch(2, name, &[("DDP_MPI_SHM", "copy")], |pg| {
        let before = (dist::mpi::zero_copy_all_reduces(), dist::mpi::shared_memory_all_reduces());
        let calls = every_shared_call_is_the_rank_order_sum(pg.as_ref())?;
        let after = (dist::mpi::zero_copy_all_reduces(), dist::mpi::shared_memory_all_reduces());
        let (in_place, copied) = (after.0 - before.0, after.1 - before.1);
        anyhow::ensure!((in_place, copied) == (0, calls), "{in_place} in place, {copied} copied of {calls}");
        Ok(())
    }) else {
        return;
    };
    let finished = job.output.matches("mpi-test-rank-finished").count();
    assert!(
        job.success && finished == 2,
        "exit {:?}, {finished} of 2 ranks finished:\n{}",
        job.code,
        job.output
    );
}
