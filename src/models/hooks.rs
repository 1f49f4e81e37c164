//! The hooks a model runs around each of its units in a forward pass, so
//! that FSDP can gather a unit's parameters before it computes and free
//! them after, without the model knowing about FSDP.

use tch::Tensor;

/// What runs around each unit of a model's forward pass: each transformer
/// block of a [`Gpt`](super::Gpt), each layer of an [`Mlp`](super::Mlp). FSDP gathers a unit's
/// parameters in `pre_forward` and frees them in `post_forward` (PyTorch
/// registers the same pair as forward pre- and post-hooks on each module
/// that `fully_shard` wraps). `Module::forward` runs [`NoLayerHooks`].
pub trait LayerHooks {
    /// Before layer `index` computes.
    fn pre_forward(&self, index: usize);
    /// After layer `index` computed `output`.
    fn post_forward(&self, index: usize, output: &Tensor);
}

/// Hooks that do nothing: the plain forward pass.
pub struct NoLayerHooks;

impl LayerHooks for NoLayerHooks {
    fn pre_forward(&self, _index: usize) {}
    fn post_forward(&self, _index: usize, _output: &Tensor) {}
}
