//! tests/nccl/training.rs: DDP on GPUs through NCCL, against one process on
//! the global batch, and an NCCL group joined over a CPU group (the
//! `mpirun` path). Needs a GPU; run with
//!   cargo test --features nccl --test nccl -- --include-ignored

use ddp_workbook::ddp::SimpleDistributedDataParallelism;
use ddp_workbook::dist::{nccl, spawn, Group, ProcessGroup, ReduceOp};
use ddp_workbook::models::Mlp;
use ddp_workbook::tch::nn::{Module, OptimizerConfig, Sgd, VarStore};
use ddp_workbook::tch::{Device, Kind, Reduction, Tensor};

use crate::{gpus, with_one_gpu};

const FLOAT_CPU: (Kind, Device) = (Kind::Float, Device::Cpu);
const SIZES: [i64; 4] = [4, 32, 32, 1];
const PER_RANK: i64 = 8;

/// The global batch of `world` ranks, the same on every call.
fn global_batch(world: usize) -> (Tensor, Tensor) {
    let rows = PER_RANK * world as i64;
    ddp_workbook::with_seed(7, || (Tensor::randn([rows, 4], FLOAT_CPU), Tensor::randn([rows, 1], FLOAT_CPU)))
}

/// One SGD step of one process, on the CPU, on `x` and `y`: the parameters after it.
fn one_process_step(x: &Tensor, y: &Tensor) -> Vec<Tensor> {
    let (vs, mlp): (VarStore, Mlp) = Mlp::seeded(3, &SIZES, Kind::Float);
    let mut sgd = Sgd::default().build(&vs, 0.1).unwrap();
    sgd.zero_grad();
    mlp.forward(x).mse_loss(y, Reduction::Mean).backward();
    sgd.step();
    vs.trainable_variables()
}

/// The largest gap between two lists of parameters.
fn largest_gap(a: &[Tensor], b: &[Tensor]) -> f64 {
    a.iter().zip(b).map(|(a, b)| (a - b).abs().max().double_value(&[])).fold(0.0, f64::max)
}

/// Chapter 5's and 6's proof on CUDA: after `optimizer.step` the replicas
/// are equal, and the step equals one process on the global batch (f32:
/// within 1e-5; the summation order differs from one process's).
#[test]
#[ignore = "needs a GPU: with one, the CUDA path (hooks, buckets) against one process; averaging across ranks needs two"]
fn ddp_on_cuda_matches_one_process_on_the_global_batch() {
    let (world, _turn) = gpus();
    with_one_gpu(world, "averaging gradients across ranks");
    let weights = nccl::spawn_on_gpus(world, |pg| {
        let (gpu, (x, y)) = (Device::Cuda(pg.rank()), global_batch(world));
        let (mut vs, mlp) = Mlp::seeded(3, &SIZES, Kind::Float);
        vs.set_device(gpu);
        let ddp = SimpleDistributedDataParallelism::new(mlp, &vs, pg.clone())?;
        let mut sgd = Sgd::default().build(&vs, 0.1)?;
        let rows = x.narrow(0, PER_RANK * pg.rank() as i64, PER_RANK).to_device(gpu);
        let targets = y.narrow(0, PER_RANK * pg.rank() as i64, PER_RANK).to_device(gpu);
        sgd.zero_grad();
        ddp.backward(&ddp.forward(&rows).mse_loss(&targets, Reduction::Mean))?;
        sgd.step();
        Ok(vs.trainable_variables().iter().map(|p| p.to_device(Device::Cpu)).collect::<Vec<_>>())
    })
    .unwrap();
    let (x, y) = global_batch(world);
    let one = one_process_step(&x, &y);
    for replica in &weights {
        for (i, (mine, first)) in replica.iter().zip(&weights[0]).enumerate() {
            assert!(mine.equal(first), "replicas differ in parameter {i} after the step");
        }
        let gap = largest_gap(replica, &one);
        assert!(gap < 1e-5, "a replica is {gap} from one process on the global batch");
    }
    if world > 1 {
        // The comparison can fail: rank 0's own rows alone give another step.
        let alone = one_process_step(&x.narrow(0, 0, PER_RANK), &y.narrow(0, 0, PER_RANK));
        let gap = largest_gap(&alone, &one);
        assert!(gap > 1e-4, "one rank's rows step like the global batch ({gap}): the test cannot tell");
    }
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
