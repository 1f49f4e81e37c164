//! A group that notes every all-reduce, reduce-scatter and all-gather it is
//! handed, with the bytes of the tensor, then makes the call: the bytes of
//! each call, counted outside the library, where its `stats()` only sums
//! them. And what those calls put on a ring, worked out per call. Chapter
//! 11 compares ZeRO-1's calls with DDP's; chapter 14, FSDP's.

use std::sync::{Arc, Mutex};

use ddp_workbook::dist::{DistError, Group, ReduceOp, Work};
use ddp_workbook::tch::{Kind, Tensor};

use super::forwarding::{Forwarding, Intercept};

/// One collective call: which one, and the bytes this rank handed to it.
pub type Call = (&'static str, usize);

/// The calls noted so far; `take` empties it.
#[derive(Clone, Default)]
pub struct CountCalls(Arc<Mutex<Vec<Call>>>);

impl CountCalls {
    fn note(&self, op: &'static str, tensor: &Tensor) {
        let bytes = tensor.numel() * tensor.kind().elt_size_in_bytes();
        // DDP's end-of-backward check all-reduces int32 flags (2 per
        // parameter and 1 per rank), not gradients: noted apart.
        let op = if tensor.kind() == Kind::Int { "flags" } else { op };
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push((op, bytes));
    }

    /// The calls noted since the last `take`.
    pub fn take(&self) -> Vec<Call> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl Intercept for CountCalls {
    fn all_reduce_async(&self, inner: &Group, tensor: &Tensor, op: ReduceOp) -> Result<Work, DistError> {
        self.note("all_reduce", tensor);
        inner.all_reduce_async(tensor, op)
    }
    fn reduce_scatter(&self, inner: &Group, tensor: &Tensor, op: ReduceOp) -> Result<Tensor, DistError> {
        self.note("reduce_scatter", tensor);
        inner.reduce_scatter(tensor, op)
    }
    fn all_gather(&self, inner: &Group, tensor: &Tensor) -> Result<Vec<Tensor>, DistError> {
        self.note("all_gather", tensor);
        inner.all_gather(tensor)
    }
}

/// `pg`, with every collective call noted by the returned counter.
pub fn counted(pg: &Group) -> (Group, CountCalls) {
    let calls = CountCalls::default();
    (Arc::new(Forwarding { inner: pg.clone(), name: "counting", intercept: calls.clone() }), calls)
}

/// What a rank sends on a ring for `calls`: (N - 1)/N of what it hands an
/// all-reduce, twice; (N - 1)/N of a reduce-scatter's input; N - 1 times an
/// all-gather's. DDP's flags are left out.
pub fn ring_bytes(calls: &[Call], world_size: usize) -> f64 {
    let n = world_size as f64;
    calls
        .iter()
        .map(|&(op, bytes)| match op {
            "all_reduce" => 2.0 * (n - 1.0) / n * bytes as f64,
            "reduce_scatter" => (n - 1.0) / n * bytes as f64,
            "all_gather" => (n - 1.0) * bytes as f64,
            _ => 0.0,
        })
        .sum()
}
