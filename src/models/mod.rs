//! Models for the chapters: a small [`Mlp`] and a tiny GPT ([`gpt`]), both
//! built with `tch::nn` into a `VarStore`, plus the helpers that list a
//! store's variables in a fixed order.
//!
//! Why a fixed order matters: `VarStore::variables()` is a `HashMap`, whose
//! iteration order differs from one map to the next. Two ranks walking their
//! parameters in different orders would pair up the wrong tensors in every
//! collective. Every rank must walk the same list in the same order.

pub mod gpt;
mod hooks;
pub mod mlp;

pub use gpt::GptSize;
pub use gpt::{Gpt, GptConfig};
pub use hooks::{LayerHooks, NoLayerHooks};
pub use mlp::Mlp;

use tch::nn::VarStore;
use tch::Tensor;

/// A tensor with its name, as [`named_parameters`] lists them:
/// `("layers.0.weight", w)`. Also `ddp::Named`.
pub type Named = (String, Tensor);

/// The trainable variables of `vs` with their names, in registration order:
/// the order in which the model created them, from the first layer to the
/// last. Tensors are shallow handles: they share storage (and `.grad()`) with
/// the model. A parameter frozen after building (`set_requires_grad(false)`)
/// is still listed, as in PyTorch's `named_parameters()`.
///
/// A tensor registered under several names (tied weights: one tensor used by
/// two layers, added with `path.add(name, tensor.shallow_clone(), true)`) is
/// listed once, as PyTorch's `named_parameters()` lists a shared parameter
/// once: at its first registration, under the first of its names in sorted
/// order (tch keeps no order of names, and every rank must pick the same one).
/// Listed twice, it would be stepped twice and its gradient sent twice.
pub fn named_parameters(vs: &VarStore) -> Vec<Named> {
    let variables = vs.variables_.lock().unwrap_or_else(|p| p.into_inner());
    let mut names: Vec<(&String, &Tensor)> = variables.named_variables.iter().collect();
    names.sort_by(|a, b| a.0.cmp(b.0)); // a HashMap's order differs from map to map
    let mut listed: Vec<Named> = Vec::new();
    for var in &variables.trainable_variables {
        // `is_set_to`: the same storage, offset, sizes and strides, i.e. the
        // same tensor. (Data pointers would also pair two empty tensors.)
        if listed.iter().any(|(_, t)| t.is_set_to(&var.tensor)) {
            continue; // tied: already listed at its first registration
        }
        let name = names
            .iter()
            .find(|(_, t)| t.is_set_to(&var.tensor))
            .map(|(name, _)| (*name).clone())
            .expect("every trainable variable of a VarStore has a name");
        listed.push((name, var.tensor.shallow_clone()));
    }
    listed
}

/// The non-trainable variables of `vs` (buffers, such as running statistics),
/// sorted by name.
pub fn named_buffers(vs: &VarStore) -> Vec<Named> {
    let trainable = named_parameters(vs);
    let mut buffers: Vec<Named> =
        vs.variables().into_iter().filter(|(_, t)| !trainable.iter().any(|(_, p)| p.is_set_to(t))).collect();
    buffers.sort_by(|a, b| a.0.cmp(&b.0));
    buffers
}
