//! The model tensors of a weights file, for [`super::checkpoint::load_model_weights`]:
//! either a training checkpoint of this crate (its `model.<name>` entries,
//! checksum checked) or a PyTorch `state_dict` saved with safetensors, e.g.
//! `safetensors.torch.save_file(model.state_dict(), "gpt.safetensors")` of
//! the twin in scripts/torch/models.py, whose names are the model's own.

use std::path::Path;

use tch::{TchError, Tensor};

use super::checkpoint::{from_bytes, CheckpointError};
use crate::ddp::Named;

/// Names that only a checkpoint of this crate has (see `checkpoint.rs`).
const CHECKPOINT_PREFIXES: [&str; 4] = ["model.", "optim.", "run.", "train."];

/// The model's tensors in the file at `path`, by the model's names.
pub fn model_tensors(path: &Path) -> Result<Vec<Named>, CheckpointError> {
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
        return Ok(from_bytes(path, &bytes)?.model);
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
