//! The bytes a rank's collectives put on the wire, for bench_sizes.rs
//! (`cargo run --release --features mpi --example bench_sizes`): a process
//! group that forwards every call to the real one and adds, per call, what a
//! ring moves out of each rank. On N ranks an all-reduce of S bytes sends
//! 2(N-1)/N x S (a reduce-scatter, then an all-gather), a reduce-scatter of
//! S (its input) (N-1)/N x S, an all-gather of a shard s (N-1) x s.
//! scripts/bench_torch_ddp.py --count-bytes counts PyTorch's the same way.
//! Why not `CommStats::collective_bytes`: it counts the tensors handed in,
//! so a reduce-scatter and an all-gather look like two all-reduces' worth
//! where a ring sends one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ddp_workbook::dist::{DistError, Group, ReduceOp, Work};
use ddp_workbook::tch::Tensor;

#[allow(dead_code)] // the all-reduce replacement is the tests' own
#[path = "../../tests/common/forwarding.rs"]
mod forwarding;
use forwarding::{Forwarding, Intercept};

/// The running count, shared by the group and whoever reads it.
#[derive(Clone, Default)]
pub struct WireBytes(Arc<AtomicU64>);

impl WireBytes {
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    fn add(&self, tensor: &Tensor, times: f64) {
        let bytes = (tensor.numel() * tensor.kind().elt_size_in_bytes()) as f64;
        self.0.fetch_add((bytes * times).round() as u64, Ordering::Relaxed);
    }
}

struct Counting {
    wire: WireBytes,
    world_size: f64,
}

impl Intercept for Counting {
    fn all_reduce_async(&self, inner: &Group, tensor: &Tensor, op: ReduceOp) -> Result<Work, DistError> {
        self.wire.add(tensor, 2.0 * (self.world_size - 1.0) / self.world_size);
        inner.all_reduce_async(tensor, op)
    }
    fn reduce_scatter(&self, inner: &Group, tensor: &Tensor, op: ReduceOp) -> Result<Tensor, DistError> {
        self.wire.add(tensor, (self.world_size - 1.0) / self.world_size);
        inner.reduce_scatter(tensor, op)
    }
    fn all_gather(&self, inner: &Group, tensor: &Tensor) -> Result<Vec<Tensor>, DistError> {
        self.wire.add(tensor, self.world_size - 1.0);
        inner.all_gather(tensor)
    }
}

/// `inner`, counting its collectives' bytes into the returned `WireBytes`
/// (broadcasts, barriers and sends are not counted: the training run uses
/// them only to set up).
pub fn counted(inner: Group) -> (Group, WireBytes) {
    let wire = WireBytes::default();
    let world_size = inner.world_size() as f64;
    let group = Forwarding { inner, name: "counted", intercept: Counting { wire: wire.clone(), world_size } };
    (Arc::new(group), wire)
}
