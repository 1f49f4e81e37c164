//! A model's weights from a file, outside the training loop
//! ([`load_model_weights`]): either a training checkpoint of this crate (its `model.<name>` entries,
//! checksum checked; a sharded one's put back together from its shard files) or a PyTorch `state_dict` saved with safetensors, e.g.
//! `safetensors.torch.save_file(model.state_dict(), "gpt.safetensors")` of
//! the twin in scripts/torch/models.py, whose names are the model's own.

use std::path::Path;

use tch::nn::VarStore;
use tch::{TchError, Tensor};

use super::file::{copy_named, from_bytes, CheckpointError};
use crate::ddp::Named;

/// Names that only a checkpoint of this crate has (see `file.rs`).
const CHECKPOINT_PREFIXES: [&str; 4] = ["model.", "optim.", "run.", "train."];

/// The model's tensors in the file at `path`, by the model's names.
fn model_tensors(path: &Path) -> Result<Vec<Named>, CheckpointError> {
    if !path.is_file() {
        return Err(CheckpointError::Missing { path: path.to_path_buf() });
    }
    let unreadable = |cause| CheckpointError::Unreadable { path: path.to_path_buf(), cause };
    let bytes = std::fs::read(path).map_err(|error| unreadable(TchError::Io(error)))?;
    let file = safetensors::SafeTensors::deserialize(&bytes)
        .map_err(|err| unreadable(TchError::SafeTensorError { path: path.display().to_string(), err }))?;
    let names = file.names();
    // Any checkpoint name makes it a checkpoint, read (and checked) as one:
    // a checkpoint that lost its checksum must not pass for a state_dict.
    if names.iter().any(|name| CHECKPOINT_PREFIXES.iter().any(|prefix| name.starts_with(prefix))) {
        let saved = from_bytes(path, &bytes)?;
        if super::sharded::is_sharded(&saved) {
            // The layout of a sharded checkpoint: the weights are in its shard files.
            return Ok(super::sharded::consolidate(path, &saved)?.model);
        }
        return Ok(saved.model);
    }
    if let Some(wrapped) = names.iter().find(|name| name.starts_with("module.")) {
        let detail = format!(
            "`{wrapped}` is a name of PyTorch's DDP wrapper, not of the model: save \
             `model.module.state_dict()`, the model inside the wrapper"
        );
        return Err(CheckpointError::Invalid { path: path.to_path_buf(), detail });
    }
    let mut tensors = Vec::with_capacity(names.len());
    for (name, view) in file.tensors() {
        tensors.push((name, Tensor::try_from(view).map_err(unreadable)?));
    }
    Ok(tensors)
}

/// Fills every variable of `vs` (parameters and buffers) with the weights
/// of the checkpoint at `path`: how to use a trained model outside the loop.
/// `path` may also hold a PyTorch `state_dict` saved with safetensors.
pub fn load_model_weights(vs: &VarStore, path: &Path) -> Result<(), CheckpointError> {
    let saved = model_tensors(path)?;
    let mut variables: Vec<Named> = vs.variables().into_iter().collect();
    variables.sort_by(|a, b| a.0.cmp(&b.0)); // errors name the same variable every time
    copy_named(&saved, &variables)
        .map_err(|detail| CheckpointError::Invalid { path: path.to_path_buf(), detail })
}
