//! One DDP step of the MLP on a GPU, and the
//! reference both GPU DDP tests compare it with: one SGD step of one
//! process, on the CPU, on the global batch of all ranks. Used by
//! tests/nccl/training.rs (NCCL, one rank per GPU), tests/gpu_threads.rs
//! (rank threads sharing one GPU) and, on CPU ranks so that CI runs it on
//! every machine, tests/nccl.rs; run with
//!   cargo test --features nccl --test nccl -- --include-ignored
//!   cargo test --test gpu_threads -- --include-ignored

use ddp_workbook::ddp::SimpleDistributedDataParallelism;
use ddp_workbook::dist::Group;
use ddp_workbook::models::Mlp;
use ddp_workbook::tch::nn::{Module, OptimizerConfig, Sgd, VarStore};
use ddp_workbook::tch::{Device, Kind, Reduction, Tensor};

const FLOAT_CPU: (Kind, Device) = (Kind::Float, Device::Cpu);
const SIZES: [i64; 4] = [4, 32, 32, 1];
const MODEL_SEED: i64 = 3;
/// Rows of the global batch per rank.
const PER_RANK: i64 = 8;

/// The global batch of `world` ranks, the same on every call.
fn global_batch(world: usize) -> (Tensor, Tensor) {
    let rows = PER_RANK * world as i64;
    ddp_workbook::with_seed(7, || (Tensor::randn([rows, 4], FLOAT_CPU), Tensor::randn([rows, 1], FLOAT_CPU)))
}

/// This rank's DDP step on `device` (its parameters, gradients and buckets
/// all there) through the finished wrapper over `pg`, on its rows of the
/// global batch: its parameters after the step, on the CPU. Fails if an
/// averaged gradient is not on `device`: nothing may go through the host.
pub fn ddp_step_on(pg: Group, device: Device) -> anyhow::Result<Vec<Tensor>> {
    let (x, y) = global_batch(pg.world_size());
    let mine = |t: &Tensor| t.narrow(0, PER_RANK * pg.rank() as i64, PER_RANK).to_device(device);
    let (mut vs, mlp) = Mlp::seeded(MODEL_SEED, &SIZES, Kind::Float);
    vs.set_device(device);
    let ddp = SimpleDistributedDataParallelism::new(mlp, &vs, pg.clone())?;
    let mut sgd = Sgd::default().build(&vs, 0.1)?;
    sgd.zero_grad();
    ddp.backward(&ddp.forward(&mine(&x)).mse_loss(&mine(&y), Reduction::Mean))?;
    for (i, p) in vs.trainable_variables().iter().enumerate() {
        let on = p.grad().device();
        anyhow::ensure!(on == device, "rank {}: gradient {i} is on {on:?}, not {device:?}", pg.rank());
    }
    sgd.step();
    Ok(vs.trainable_variables().iter().map(|p| p.to_device(Device::Cpu)).collect())
}

/// One SGD step (learning rate 0.1) of one process, on the CPU, on `x` and
/// `y`: the parameters after it.
fn one_process_step(x: &Tensor, y: &Tensor) -> Vec<Tensor> {
    let (vs, mlp): (VarStore, Mlp) = Mlp::seeded(MODEL_SEED, &SIZES, Kind::Float);
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

/// Asserts what both tests claim of the replicas after one step: bitwise
/// equal to each other, within 1e-5 of one process on the global batch (f32;
/// the summation order differs), and, with two ranks or more, the control
/// that rank 0's rows alone step differently, so the comparison can fail.
pub fn assert_replicas_match_one_process(replicas: &[Vec<Tensor>]) {
    let world = replicas.len();
    let (x, y) = global_batch(world);
    let one = one_process_step(&x, &y);
    for replica in replicas {
        for (i, (mine, first)) in replica.iter().zip(&replicas[0]).enumerate() {
            assert!(mine.equal(first), "replicas differ in parameter {i} after the step");
        }
        let gap = largest_gap(replica, &one);
        assert!(gap < 1e-5, "a replica is {gap} from one process on the global batch");
    }
    if world > 1 {
        let alone = one_process_step(&x.narrow(0, 0, PER_RANK), &y.narrow(0, 0, PER_RANK));
        let gap = largest_gap(&alone, &one);
        assert!(gap > 1e-4, "one rank's rows step like the global batch ({gap}): the test cannot tell");
    }
}
