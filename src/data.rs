//! Deterministic synthetic data sets with a real signal to learn.

use tch::{Kind, Tensor};

use crate::seed::with_seed;

/// A regression task whose targets come from a fixed random "teacher"
/// network plus a little noise, so a student model can really learn it.
#[derive(Debug)]
pub struct Regression {
    /// Inputs, `[n, in_dim]`.
    pub x: Tensor,
    /// Targets, `[n, out_dim]`.
    pub y: Tensor,
}

impl Regression {
    /// `n` examples drawn from `seed`; the same seed always gives the same data.
    pub fn new(seed: i64, n: i64, in_dim: i64, out_dim: i64, kind: Kind) -> Regression {
        with_seed(seed, || {
            let opts = (Kind::Double, tch::Device::Cpu);
            let x = Tensor::randn([n, in_dim], opts); // [n, in_dim]
            let w1 = Tensor::randn([in_dim, 8], opts) / (in_dim as f64).sqrt();
            let w2 = Tensor::randn([8, out_dim], opts) / 8f64.sqrt();
            let noise = Tensor::randn([n, out_dim], opts) * 0.01;
            let y = x.matmul(&w1).tanh().matmul(&w2) + noise; // [n, out_dim]
            Regression { x: x.to_kind(kind), y: y.to_kind(kind) }
        })
    }

    pub fn len(&self) -> i64 {
        self.x.size()[0]
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rows `start..start + len` as `(x, y)`.
    pub fn batch(&self, start: i64, len: i64) -> (Tensor, Tensor) {
        (self.x.narrow(0, start, len), self.y.narrow(0, start, len))
    }
}
