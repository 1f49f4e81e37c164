//! Two or three ranks as threads of this process
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

use ddp_workbook::dist::{spawn, ReduceOp};
use ddp_workbook::tch::{Cuda, Device, Kind, Tensor};

#[path = "nccl/one_step.rs"]
mod one_step;
use one_step::{assert_replicas_match_one_process, ddp_step_on};

const GPU: Device = Device::Cuda(0);
const FLOAT_CPU: (Kind, Device) = (Kind::Float, Device::Cpu);

/// Panics, saying so, where libtorch sees no GPU: a GPU test must not pass
/// by doing nothing.
fn need_a_gpu() {
    assert!(
        Cuda::device_count() > 0,
        "this test needs a GPU, and libtorch sees none here (Cuda::device_count() is 0). Run the GPU \
         tests where there is one: cargo test --test gpu_threads -- --include-ignored, or scripts/gpu_check.sh"
    );
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
    let weights = spawn(2, |pg| ddp_step_on(pg, GPU)).unwrap();
    assert_replicas_match_one_process(&weights);
}

/// The in-place all-reduce, synchronous and asynchronous, on 3 rank threads
/// whose tensors share cuda:0: the sum is bitwise ((x0 + x1) + x2) computed
/// on the host in rank order (an f32 addition rounds the same on both), and
/// stays on the GPU. From 1 float to 400 KB, odd lengths: small calls take
/// the backend's rank-order sum, large ones are split into uneven slices
/// (where the split starts depends on the cores: src/dist/local/).
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
