//! A small multi-layer perceptron: the model of chapters 2 to 5, small enough
//! to train in milliseconds, with a buffer to show that buffers need syncing
//! too. Run its checks with `cargo test --test models`.

use tch::nn::{self, Module, VarStore};
use tch::{Device, Kind, Tensor};

use crate::models::hooks::{LayerHooks, NoLayerHooks};
use crate::seed::with_seed;

/// Linear layers with tanh between them. `sizes = [4, 16, 16, 1]` gives
/// 4 inputs, two hidden layers of 16 and one output.
#[derive(Debug)]
pub struct Mlp {
    layers: Vec<nn::Linear>,
    /// A non-trainable buffer subtracted from the input: it stands in for the
    /// running statistics that real models (batch norm) keep outside autograd.
    input_shift: Tensor,
}

impl Mlp {
    /// Creates the layers under `path`: `layers.0.weight`, `layers.0.bias`, ...
    pub fn new(path: &nn::Path, sizes: &[i64]) -> Mlp {
        assert!(sizes.len() >= 2, "an MLP needs at least an input and an output size, got {sizes:?}");
        let layers = sizes
            .windows(2)
            .enumerate()
            .map(|(i, io)| nn::linear(path / "layers" / i, io[0], io[1], Default::default()))
            .collect();
        let input_shift = path.zeros_no_train("input_shift", &[sizes[0]]);
        Mlp { layers, input_shift }
    }

    /// Builds a CPU model of the given dtype from `seed`: the same seed gives
    /// bitwise the same weights on every rank and every run.
    pub fn seeded(seed: i64, sizes: &[i64], kind: Kind) -> (VarStore, Mlp) {
        with_seed(seed, || {
            let mut vs = VarStore::new(Device::Cpu);
            let mlp = Mlp::new(&vs.root(), sizes);
            vs.set_kind(kind);
            (vs, mlp)
        })
    }
}

impl Module for Mlp {
    fn forward(&self, xs: &Tensor) -> Tensor {
        self.forward_with_hooks(xs, &NoLayerHooks)
    }
}

impl Mlp {
    /// [`Module::forward`], with `hooks` run around each linear layer `i`
    /// (its tanh included): FSDP's per-layer units.
    pub fn forward_with_hooks(&self, xs: &Tensor, hooks: &dyn LayerHooks) -> Tensor {
        // xs: [batch, sizes[0]] -> [batch, sizes.last()]
        let mut h = xs - &self.input_shift;
        for (i, layer) in self.layers.iter().enumerate() {
            hooks.pre_forward(i);
            h = layer.forward(&h);
            if i + 1 < self.layers.len() {
                h = h.tanh();
            }
            hooks.post_forward(i, &h);
        }
        h
    }

    /// How many linear layers (units for per-layer FSDP).
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }
}
