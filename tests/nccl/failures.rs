//! A call that misses its deadline aborts the
//! communicator and fails in words, and its tensors stay out of libtorch's
//! caching allocator while the GPU may still run the aborted call on them.
//! Needs a GPU (one is enough); run with
//!   cargo test --features nccl --test nccl -- --include-ignored

use std::time::{Duration, Instant};

use ddp_workbook::dist::{nccl, ReduceOp};
use ddp_workbook::tch::{Cuda, Device, Kind, Tensor};

use crate::gpus;

/// Queues about `seconds` of matrix products on libtorch's stream of `gpu`
/// (measured on a few first), so that whatever is queued behind them waits.
/// The products are large (16384 square, about a second's tenth each on an
/// H100) so that few are queued: the driver holds about a thousand launches,
/// and a host that queues more blocks until the GPU catches up, which would
/// leave less than `seconds` of work queued when this returns.
fn keep_busy(gpu: Device, seconds: f64) -> Tensor {
    let Device::Cuda(index) = gpu else { unreachable!("a GPU") };
    // Scaled by 1/sqrt(16384): a product of normal entries then keeps its
    // entries' size, so the chain stays finite, one kernel per product.
    let a = Tensor::randn([16384, 16384], (Kind::Float, gpu)) / 128.0;
    let mut x = a.matmul(&a);
    Cuda::synchronize(index as i64);
    let started = Instant::now();
    for _ in 0..3 {
        x = x.matmul(&a);
    }
    Cuda::synchronize(index as i64);
    let each = started.elapsed().as_secs_f64() / 3.0;
    for _ in 0..(seconds / each.max(1e-6)).ceil() as usize {
        x = x.matmul(&a);
    }
    x
}

#[test]
#[ignore = "needs a GPU: one is enough"]
fn a_call_past_its_deadline_fails_and_keeps_its_tensor_from_the_allocator() {
    let (_, _turn) = gpus();
    // NCCL's first start in a process is slow: done here, with the default
    // deadline, so that the short one below only ever meets the all-reduce.
    nccl::spawn_on_gpus(1, |_| Ok(())).unwrap();
    let deadline = Duration::from_secs(2);
    nccl::spawn_on_gpus_with_timeout(1, deadline, |pg| {
        let gpu = Device::Cuda(0);
        // 40 MiB: a block of its own in the caching allocator, of a size
        // nothing else here allocates (keep_busy's tensors take 1 GiB).
        let mut t = Tensor::ones([10 << 20], (Kind::Float, gpu));
        let address = t.data_ptr() as usize;
        // The all-reduce waits on the GPU behind 6 s of libtorch's work: it
        // cannot finish within its 2 s deadline, and the communicator is
        // aborted while the call is still queued.
        let busy = keep_busy(gpu, 6.0);
        let error = pg.all_reduce(&mut t, ReduceOp::Sum).expect_err("the deadline passes first").to_string();
        anyhow::ensure!(error.contains("DDP_TIMEOUT_SECS") && error.contains("aborted"), "{error}");
        // Had the call let go of the tensor, dropping ours would give its
        // block back to the allocator, and the next tensor of that size
        // would get it: memory the aborted all-reduce may still write.
        drop(t);
        let fresh = Tensor::empty([10 << 20], (Kind::Float, gpu));
        let reused = fresh.data_ptr() as usize == address;
        anyhow::ensure!(!reused, "a new tensor got the failed all-reduce's memory while the GPU may use it");
        // Every later call fails, naming the first failure.
        let later = pg.barrier().expect_err("an aborted communicator carries nothing").to_string();
        anyhow::ensure!(later.contains("DDP_TIMEOUT_SECS"), "{later}");
        drop(busy);
        Cuda::synchronize(0); // the next test starts on an idle GPU
        Ok(())
    })
    .unwrap();
}
