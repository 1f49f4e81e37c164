//! Models for the chapters: a small [`Mlp`] and a tiny GPT ([`gpt`]), both
//! built with `tch::nn` into a `VarStore`, plus the helpers that list a
//! store's variables in a fixed order.
//!
//! Why a fixed order matters: `VarStore::variables()` is a `HashMap`, whose
//! iteration order differs from one map to the next. Two ranks walking their
//! parameters in different orders would pair up the wrong tensors in every
//! collective. Every rank must walk the same list in the same order.

pub mod gpt;
pub mod mlp;

pub use gpt::{Gpt, GptConfig};
pub use mlp::Mlp;

use tch::nn::VarStore;
use tch::Tensor;

/// A tensor with its name, as [`named_parameters`] lists them:
/// `("layers.0.weight", w)`. Also `ddp::Named`.
pub type Named = (String, Tensor);

/// The trainable variables of `vs` with their names, in registration order:
/// the order in which the model created them, from the first layer to the
/// last. Tensors are shallow handles: they share storage (and `.grad()`) with
/// the model.
pub fn named_parameters(vs: &VarStore) -> Vec<Named> {
    let variables = vs.variables_.lock().unwrap_or_else(|p| p.into_inner());
    variables
        .trainable_variables
        .iter()
        .map(|var| {
            let name = variables
                .named_variables
                .iter()
                .find(|(_, t)| t.data_ptr() == var.tensor.data_ptr())
                .map(|(name, _)| name.clone())
                .expect("every trainable variable of a VarStore has a name");
            (name, var.tensor.shallow_clone())
        })
        .collect()
}

/// The non-trainable variables of `vs` (buffers, such as running statistics),
/// sorted by name.
pub fn named_buffers(vs: &VarStore) -> Vec<Named> {
    let trainable: Vec<*mut std::ffi::c_void> =
        named_parameters(vs).iter().map(|(_, t)| t.data_ptr()).collect();
    let mut buffers: Vec<Named> =
        vs.variables().into_iter().filter(|(_, t)| !trainable.contains(&t.data_ptr())).collect();
    buffers.sort_by(|a, b| a.0.cmp(&b.0));
    buffers
}
