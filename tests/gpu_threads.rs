//! tests/gpu_threads.rs: two or three ranks as threads of this process
//! sharing ONE GPU through the in-process backend (`dist::spawn`), with CUDA
//! tensors: the learner with a single GPU. No NCCL: NCCL refuses two ranks
//! of one communicator on the same GPU, while the in-process backend's
//! all-reduce is libtorch's own in-place operations, which run on whatever
//! device the tensors are on, queued on that GPU's one default stream in
//! the order the ranks' threads call them.
//!
//! Every test here needs a GPU. They are ignored, with the reason, so that a
//! machine without one reports them as skipped; the suite's runner includes
//! them where it finds a GPU, and so does scripts/gpu_check.sh. By hand:
//!   cargo test --test gpu_threads -- --include-ignored
//! Asked for without a GPU, each fails and says so.

use ddp_workbook::ddp::SimpleDistributedDataParallelism;
use ddp_workbook::dist::{spawn, ReduceOp};
use ddp_workbook::models::Mlp;
use ddp_workbook::tch::nn::{Module, OptimizerConfig, Sgd, VarStore};
use ddp_workbook::tch::{Cuda, Device, Kind, Reduction, Tensor};

const GPU: Device = Device::Cuda(0);
const FLOAT_CPU: (Kind, Device) = (Kind::Float, Device::Cpu);
const SIZES: [i64; 4] = [4, 32, 32, 1];
const PER_RANK: i64 = 8;

/// Panics, saying so, where libtorch sees no GPU: a GPU test must not pass
/// by doing nothing.
fn need_a_gpu() {
    assert!(
        Cuda::device_count() > 0,
        "this test needs a GPU, and libtorch sees none here (Cuda::device_count() is 0). Run the GPU \
         tests where there is one: cargo test --test gpu_threads -- --include-ignored, or scripts/gpu_check.sh"
    );
}

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

/// The finished wrapper (buckets that leave during backward, through the
/// communication thread) on 2 rank threads whose parameters, gradients and
/// buckets all live on the same GPU: after `optimizer.step` the replicas are
/// bitwise equal, and equal one process on the global batch on the CPU
/// (f32: within 1e-5, the summation order differs).
#[test]
#[ignore = "needs a GPU: 2 in-process ranks share cuda:0; the DDP step against one process on the global batch"]
fn ddp_on_two_rank_threads_sharing_one_gpu_matches_one_process() {
    need_a_gpu();
    let world = 2;
    let weights = spawn(world, |pg| {
        let (x, y) = global_batch(world);
        let (mut vs, mlp) = Mlp::seeded(3, &SIZES, Kind::Float);
        vs.set_device(GPU);
        let ddp = SimpleDistributedDataParallelism::new(mlp, &vs, pg.clone())?;
        let mut sgd = Sgd::default().build(&vs, 0.1)?;
        let rows = x.narrow(0, PER_RANK * pg.rank() as i64, PER_RANK).to_device(GPU);
        let targets = y.narrow(0, PER_RANK * pg.rank() as i64, PER_RANK).to_device(GPU);
        sgd.zero_grad();
        ddp.backward(&ddp.forward(&rows).mse_loss(&targets, Reduction::Mean))?;
        // The averaged gradients are where the parameters are: nothing went through the host.
        for (i, p) in vs.trainable_variables().iter().enumerate() {
            anyhow::ensure!(
                p.grad().device() == GPU,
                "rank {}: gradient {i} is on {:?}",
                pg.rank(),
                p.grad().device()
            );
        }
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
    // The comparison can fail: rank 0's own rows alone give another step.
    let alone = one_process_step(&x.narrow(0, 0, PER_RANK), &y.narrow(0, 0, PER_RANK));
    let gap = largest_gap(&alone, &one);
    assert!(gap > 1e-4, "one rank's rows step like the global batch ({gap}): the test cannot tell");
}

/// The in-place all-reduce, synchronous and asynchronous, on 3 rank threads
/// whose tensors share cuda:0: the sum is bitwise ((x0 + x1) + x2) computed
/// on the host in rank order (an f32 addition rounds the same on both), and
/// stays on the GPU. Odd lengths, so the slices the ranks split the work
/// into are uneven.
#[test]
#[ignore = "needs a GPU: 3 in-process ranks share cuda:0; the in-place all-reduce against the host's sum"]
fn all_reduce_of_tensors_on_one_gpu_is_the_hosts_rank_order_sum() {
    need_a_gpu();
    let world = 3;
    let held = |rank: usize, numel: i64| {
        ddp_workbook::with_seed(11 + rank as i64, || Tensor::randn([numel], FLOAT_CPU))
    };
    for numel in [1, 1001, 100_003] {
        let mut want = held(0, numel);
        for rank in 1..world {
            want += held(rank, numel);
        }
        let results = spawn(world, |pg| {
            let mut sync = held(pg.rank(), numel).to_device(GPU);
            pg.all_reduce(&mut sync, ReduceOp::Sum)?;
            let queued = held(pg.rank(), numel).to_device(GPU);
            pg.all_reduce_async(&queued, ReduceOp::Sum)?.wait()?;
            anyhow::ensure!(sync.device() == GPU && queued.device() == GPU, "a result left the GPU");
            Ok([sync, queued].map(|t| t.to_device(Device::Cpu)))
        })
        .unwrap();
        for (rank, pair) in results.iter().enumerate() {
            for (how, got) in ["all_reduce", "all_reduce_async"].iter().zip(pair) {
                let gap = (got - &want).abs().max().double_value(&[]);
                assert!(got.equal(&want), "{numel} floats, rank {rank}, {how}: {gap} from the host's sum");
            }
        }
        // The comparison can fail: one rank's own values are not the sum.
        assert!(!held(0, numel).equal(&want));
    }
}

/// A rank whose tensor is on the CPU while another's is on the GPU: every
/// rank gets an error (libtorch's, naming both devices), never a hang and
/// never a result computed from half the ranks.
#[test]
#[ignore = "needs a GPU: one rank's tensor on cuda:0, the other's on the CPU, must fail on both ranks"]
fn a_cpu_tensor_meeting_a_gpu_tensor_is_an_error_on_every_rank() {
    need_a_gpu();
    let errors = spawn(2, |pg| {
        let device = if pg.rank() == 0 { Device::Cpu } else { GPU };
        let mut t = Tensor::ones([1000], (Kind::Float, device));
        Ok(pg.all_reduce(&mut t, ReduceOp::Sum).err().map(|e| e.to_string()))
    })
    .unwrap();
    for (rank, error) in errors.iter().enumerate() {
        let error =
            error.as_deref().unwrap_or_else(|| panic!("rank {rank}: a CPU and a GPU tensor were summed"));
        assert!(error.contains("device"), "rank {rank}: {error}");
    }
}
