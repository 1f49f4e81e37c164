//! A test-only model with a branch that the
//! forward skips when told to, so that a rank leaves the branch's parameters
//! without a gradient in some steps (PyTorch's `find_unused_parameters`).
//! Its twin is `Branchy` in scripts/torch/oracle.py: the same names, the
//! same registration order (trunk, branch, head), the same operations.
//! Compiled into `cargo test --features solutions,mpi,nccl --test torch_oracle`.

use std::sync::atomic::{AtomicBool, Ordering};

use ddp_workbook::tch::nn::{self, Module};
use ddp_workbook::tch::Tensor;

#[derive(Debug)]
pub struct Branchy {
    trunk: nn::Linear,
    branch: nn::Linear,
    head: nn::Linear,
    /// Whether the next forward goes through `branch`; set before each step.
    use_branch: AtomicBool,
}

impl Branchy {
    /// `sizes = [inputs, hidden, outputs]`.
    pub fn new(path: &nn::Path, sizes: &[i64]) -> Branchy {
        let [inputs, hidden, outputs] = sizes else {
            panic!("Branchy wants [inputs, hidden, outputs], got {sizes:?}")
        };
        Branchy {
            trunk: nn::linear(path / "trunk", *inputs, *hidden, Default::default()),
            branch: nn::linear(path / "branch", *hidden, *outputs, Default::default()),
            head: nn::linear(path / "head", *hidden, *outputs, Default::default()),
            use_branch: AtomicBool::new(true),
        }
    }

    pub fn set_use_branch(&self, on: bool) {
        self.use_branch.store(on, Ordering::Relaxed);
    }
}

impl Module for Branchy {
    fn forward(&self, xs: &Tensor) -> Tensor {
        let h = self.trunk.forward(xs).tanh(); // [batch, hidden]
        let out = self.head.forward(&h); // [batch, outputs]
        if self.use_branch.load(Ordering::Relaxed) {
            out + self.branch.forward(&h)
        } else {
            out
        }
    }
}
