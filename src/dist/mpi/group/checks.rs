//! What `MpiProcessGroup` refuses before a
//! call reaches the communication thread (so before any peer waits on it):
//! tensors MPI cannot carry, ranks outside the group, reductions MPI has no
//! operation for. Try it: `cargo test --features mpi --test mpi`.

use tch::{Device, Tensor};

use super::super::ffi;
use super::MpiProcessGroup;
use crate::dist::{DistError, ReduceOp};

impl MpiProcessGroup {
    /// Rejects what MPI cannot carry, before any peer waits.
    pub(super) fn check_tensor(&self, op: &str, tensor: &Tensor) -> Result<(), DistError> {
        if !tensor.defined() {
            return Err(self.invalid(op, "the tensor is undefined (a gradient that was never computed?)"));
        }
        if tensor.device() != Device::Cpu {
            let detail = format!("the mpi backend moves CPU tensors, got one on {:?}: use the nccl backend for GPUs, or `.to(Device::Cpu)`", tensor.device());
            return Err(self.invalid(op, detail));
        }
        if ffi::datatype(tensor.kind()).is_none() {
            return Err(self.invalid(op, format!("the mpi backend cannot carry {:?} tensors", tensor.kind())));
        }
        Ok(())
    }

    pub(super) fn check_rank(&self, op: &str, what: &str, peer: usize) -> Result<(), DistError> {
        if peer >= self.global.len() {
            return Err(
                self.invalid(op, format!("{what} {peer} is not a rank of a group of {}", self.global.len()))
            );
        }
        Ok(())
    }

    pub(super) fn check_reduction(
        &self,
        op: &str,
        tensor: &Tensor,
        reduce: ReduceOp,
    ) -> Result<(), DistError> {
        let kind = tensor.kind();
        if reduce == ReduceOp::Avg && !crate::dist::is_float(kind) {
            return Err(self.invalid(op, format!("avg needs a floating-point tensor, got {kind:?}")));
        }
        ffi::reduction(kind, reduce).map(|_| ()).map_err(|detail| self.invalid(op, detail))
    }
}
