//! DDP on GPUs through NCCL, against one process on
//! the global batch, and an NCCL group joined over a CPU group (the
//! `mpirun` path). Needs a GPU; run with
//!   cargo test --features nccl --test nccl -- --include-ignored

use ddp_workbook::dist::{nccl, spawn, Group, ProcessGroup, ReduceOp};
use ddp_workbook::tch::{Device, Kind, Tensor};

use crate::one_step::{assert_replicas_match_one_process, ddp_step_on};
use crate::{gpus, with_one_gpu};

/// Chapter 5's and 6's proof on CUDA: after `optimizer.step` the replicas
/// are equal, and the step equals one process on the global batch (f32:
/// within 1e-5; the summation order differs from one process's).
#[test]
#[ignore = "needs a GPU: with one, the CUDA path (hooks, buckets) against one process; averaging across ranks needs two"]
fn ddp_on_cuda_matches_one_process_on_the_global_batch() {
    let (world, _turn) = gpus();
    with_one_gpu(world, "averaging gradients across ranks");
    let weights = nccl::spawn_on_gpus(world, |pg| ddp_step_on(pg.clone(), Device::Cuda(pg.rank()))).unwrap();
    assert_replicas_match_one_process(&weights);
}

/// What `mpirun` does, with rank threads: a CPU group exists first, rank 0
/// makes NCCL's id and broadcasts it over that group, and every rank joins
/// on its own GPU.
#[test]
#[ignore = "needs a GPU: one rank per GPU; with one, a world of one"]
fn bootstrap_over_a_cpu_group_then_all_reduce() {
    let (world, _turn) = gpus();
    with_one_gpu(world, "a sum across ranks");
    let sums = spawn(world, |pg: Group| {
        let gpu_group = nccl::bootstrap(pg.as_ref(), pg.rank())?;
        anyhow::ensure!(gpu_group.world_size() == world && gpu_group.rank() == pg.rank(), "ranks differ");
        let mut t = Tensor::full([4], pg.rank() as f64 + 2.0, (Kind::Float, Device::Cuda(pg.rank())));
        gpu_group.all_reduce(&mut t, ReduceOp::Sum)?;
        Ok(Vec::<f32>::try_from(t.to_device(Device::Cpu))?)
    })
    .unwrap();
    let want = (0..world).map(|r| r as f32 + 2.0).sum::<f32>();
    assert_eq!(sums, vec![vec![want; 4]; world]);
}
