//! Every collective of the MPI backend agrees
//! with the in-process backend: each rank runs the same script of calls on
//! MPI, then runs it again on an in-process world of the same size (all
//! ranks as threads of itself) and compares its own results, bitwise (the
//! data are whole numbers, so every order of addition gives the same bits).

use ddp_workbook::dist::{spawn, tagged, ProcessGroup, ReduceOp};
use ddp_workbook::tch::{Kind, Tensor};

use crate::harness::{launch, on_ranks};

/// What each rank prints when its body returned (`FINISHED` in harness.rs).
const RANK_FINISHED: &str = "mpi-test-rank-finished";

const KINDS: [Kind; 5] = [Kind::Float, Kind::Double, Kind::Int, Kind::Int64, Kind::Uint8];

/// Rank `rank`'s whole-number data: [6, 2], different on every rank.
fn data(rank: usize, kind: Kind) -> Tensor {
    (Tensor::arange(12, (Kind::Int64, ddp_workbook::tch::Device::Cpu)).reshape([6, 2]).remainder(5)
        + rank as i64
        + 1)
    .to_kind(kind)
}

/// Every call of the `ProcessGroup` trait, on every kind; returns what
/// this rank got, in order.
fn script(pg: &dyn ProcessGroup) -> anyhow::Result<Vec<Tensor>> {
    let (rank, size) = (pg.rank(), pg.world_size());
    let mut results = vec![];
    for kind in KINDS {
        let mut t = data(rank, kind);
        pg.broadcast(&mut t, size - 1)?;
        results.push(t);
        let ops: &[ReduceOp] = match kind {
            Kind::Float | Kind::Double => {
                &[ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min, ReduceOp::Max, ReduceOp::Product]
            }
            Kind::Uint8 => &[ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max],
            _ => &[ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max, ReduceOp::Product],
        };
        for &op in ops {
            let mut t = data(rank, kind);
            pg.all_reduce(&mut t, op)?;
            results.push(t);
        }
        // Asynchronous: two in flight at once, waited in reverse order.
        let (a, b) = (data(rank, kind), data(rank, kind) * 2);
        let (work_a, work_b) =
            (pg.all_reduce_async(&a, ReduceOp::Sum)?, pg.all_reduce_async(&b, ReduceOp::Max)?);
        work_b.wait()?;
        work_a.wait()?;
        results.extend([a, b]);
        // Not contiguous: the result must still land in the caller's tensor.
        let mut transposed = data(rank, kind).transpose(0, 1);
        pg.all_reduce(&mut transposed, ReduceOp::Sum)?;
        results.push(transposed);
        results.push(Tensor::stack(&pg.all_gather(&data(rank, kind))?, 0));
        results.push(pg.reduce_scatter(&data(rank, kind), ReduceOp::Sum)?);
    }
    pg.barrier()?;
    // Point to point around the ring.
    let (next, previous) = ((rank + 1) % size, (rank + size - 1) % size);
    pg.send(&data(rank, Kind::Float), next)?;
    let mut got = Tensor::zeros([6, 2], (Kind::Float, ddp_workbook::tch::Device::Cpu));
    pg.recv(&mut got, previous)?;
    results.push(got);
    // A sub-group of the first and the last rank.
    if let Some(sub) = pg.new_group(&[size - 1, 0])? {
        let mut t = data(rank, Kind::Int64);
        tagged("sub-group sum", || sub.all_reduce(&mut t, ReduceOp::Sum))?;
        results.push(t);
        results.push(Tensor::from(sub.rank() as i64));
    }
    Ok(results)
}

fn agree_with_in_process(pg: &dyn ProcessGroup) -> anyhow::Result<()> {
    let (rank, size) = (pg.rank(), pg.world_size());
    let over_mpi = script(pg)?;
    let mut in_process = spawn(size, |local| script(local.as_ref()))?;
    let expected = in_process.swap_remove(rank);
    anyhow::ensure!(
        over_mpi.len() == expected.len(),
        "{} results, expected {}",
        over_mpi.len(),
        expected.len()
    );
    for (i, (got, want)) in over_mpi.iter().zip(&expected).enumerate() {
        anyhow::ensure!(
            got.kind() == want.kind() && got.size() == want.size() && got.equal(want),
            "rank {rank}, result {i}: MPI gave {got:?} but the in-process backend {want:?}"
        );
    }
    Ok(())
}

#[test]
fn every_collective_agrees_with_the_in_process_backend_on_2_processes() {
    let name = "collectives::every_collective_agrees_with_the_in_process_backend_on_2_processes";
    on_ranks(2, name, |pg| agree_with_in_process(pg.as_ref()));
}

#[test]
fn every_collective_agrees_with_the_in_process_backend_on_3_processes() {
    let name = "collectives::every_collective_agrees_with_the_in_process_backend_on_3_processes";
    on_ranks(3, name, |pg| agree_with_in_process(pg.as_ref()));
}

#[test]
fn the_collectives_agree_with_the_signature_check_off_too() {
    let name = "collectives::the_collectives_agree_with_the_signature_check_off_too";
    let Some(job) = launch(2, name, &[("DDP_DEBUG", "off")], |pg| agree_with_in_process(pg.as_ref())) else {
        return;
    };
    // A job whose ranks ran no test (a name that matches none) exits 0 as
    // well: count the ranks that finished the body, as `on_ranks` does.
    let finished = job.output.matches(RANK_FINISHED).count();
    assert!(
        job.success && finished == 2,
        "exit {:?}, {finished} of 2 ranks finished the body:\n{}",
        job.code,
        job.output
    );
}

// Every call cut into MPI calls of at most 5 elements (5 bytes for sends),
// as a tensor of more than 2^31 - 1 elements is (`large.rs` sends one);
// shared memory off, so that the all-reduces are MPI's or in rank order.
#[test]
fn the_collectives_agree_when_every_call_is_cut_into_pieces() {
    let name = "collectives::the_collectives_agree_when_every_call_is_cut_into_pieces";
    let env = [("DDP_MPI_MOST_PER_CALL", "5"), ("DDP_MPI_SHM", "off")];
    let Some(job) = launch(3, name, &env, |pg| agree_with_in_process(pg.as_ref())) else { return };
    let finished = job.output.matches(RANK_FINISHED).count();
    assert!(
        job.success && finished == 3,
        "exit {:?}, {finished} of 3 ranks finished the body:\n{}",
        job.code,
        job.output
    );
}
