//! Bf16 tensors on the MPI backend, for chapter 12's
//! hook. MPI has neither a bfloat16 type nor a sum for it: the backend
//! carries bf16 as 16-bit words (half the bytes of float32) and sums them
//! with an operation of its own (`src/dist/mpi/ffi.rs`) that adds as
//! libtorch adds bf16, each pair widened to float32, added and rounded back.
//! So a bf16 all-reduce over MPI must give the bits of the in-process
//! backend, which adds with libtorch, and the hook must work on MPI.
//!
//! Run: cargo test --features mpi --test mpi bf16

use ddp_workbook::ddp::bf16_compress_hook;
use ddp_workbook::dist::{spawn, ProcessGroup, ReduceOp};
use ddp_workbook::tch::{Device, Kind, Tensor};
use ddp_workbook::with_seed;

use crate::harness::on_ranks;

const NUMEL: i64 = 4096;

/// Rank `rank`'s float32 values, of magnitudes spread over several powers of two.
fn values(rank: usize) -> Tensor {
    with_seed(1200 + rank as i64, || {
        let opts = (Kind::Double, Device::Cpu);
        (Tensor::randn([NUMEL], opts) * Tensor::randn([NUMEL], opts).exp()).to_kind(Kind::Float)
    })
}

/// This rank's bf16 sum and hook result, and the bytes the sum handed over.
fn sum_and_hook(pg: &dyn ProcessGroup) -> anyhow::Result<(Tensor, Tensor, u64)> {
    let mut sum = values(pg.rank()).to_kind(Kind::BFloat16);
    let before = pg.stats().collective_bytes;
    pg.all_reduce(&mut sum, ReduceOp::Sum)?;
    let bytes = pg.stats().collective_bytes - before;
    let bucket = values(pg.rank());
    bf16_compress_hook(pg, &bucket)?.wait()?;
    Ok((sum, bucket, bytes))
}

fn agrees_with_in_process(pg: &dyn ProcessGroup) -> anyhow::Result<()> {
    let (rank, size) = (pg.rank(), pg.world_size());
    let (sum, hooked, bytes) = sum_and_hook(pg)?;
    anyhow::ensure!(bytes == NUMEL as u64 * 2, "rank {rank}: the bf16 sum handed over {bytes} bytes");
    let mut in_process = spawn(size, |local| sum_and_hook(local.as_ref()))?;
    let (want_sum, want_hooked, _) = in_process.swap_remove(rank);
    anyhow::ensure!(sum.equal(&want_sum), "rank {rank}: MPI's bf16 sum differs from the in-process one");
    anyhow::ensure!(
        hooked.equal(&want_hooked),
        "rank {rank}: the hook's mean differs from the in-process one"
    );
    Ok(())
}

#[test]
fn a_bf16_sum_and_the_hook_agree_with_the_in_process_backend_on_2_processes() {
    let name = "bf16::a_bf16_sum_and_the_hook_agree_with_the_in_process_backend_on_2_processes";
    on_ranks(2, name, |pg| agrees_with_in_process(pg.as_ref()));
}

#[test]
fn a_bf16_sum_and_the_hook_agree_with_the_in_process_backend_on_3_processes() {
    let name = "bf16::a_bf16_sum_and_the_hook_agree_with_the_in_process_backend_on_3_processes";
    on_ranks(3, name, |pg| agrees_with_in_process(pg.as_ref()));
}
