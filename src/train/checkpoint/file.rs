//! The checkpoint file: what it holds ([`Checkpoint`]), how it is read and
//! checked ([`load`], [`from_bytes`]), and why a read fails
//! ([`CheckpointError`], each error saying what to do).

use std::fmt;
use std::path::{Path, PathBuf};

use tch::{Kind, TchError, Tensor};

use crate::ddp::Named;
use crate::fingerprint::Fnv1a;

/// Where the training loop stands after `step` optimizer steps: the next
/// micro-batch is at `position` in this rank's shard of epoch `epoch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoopPosition {
    pub step: i64,
    pub epoch: i64,
    pub position: i64,
}

/// One value of a run setting, as the checkpoint stores it: a number, or a
/// word (a device, a dtype), stored as its UTF-8 bytes.
#[derive(Clone, Debug, PartialEq)]
pub enum Setting {
    Int(i64),
    Float(f64),
    Text(String),
}

impl fmt::Display for Setting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Setting::Int(value) => write!(f, "{value}"),
            Setting::Float(value) => write!(f, "{value}"),
            Setting::Text(value) => write!(f, "{value}"),
        }
    }
}

/// Everything in a checkpoint file, as named tensors and numbers.
pub struct Checkpoint {
    /// Parameters and buffers of the unwrapped model, by `VarStore` name.
    pub model: Vec<Named>,
    /// The optimizer's state, by the names its `state()` gave them.
    pub optimizer: Vec<Named>,
    pub progress: LoopPosition,
    /// The run settings this checkpoint was trained with.
    pub settings: Vec<(String, Setting)>,
}

/// Why a checkpoint could not be written or used. Each message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error(
        "--resume: there is no checkpoint file at {path}. Start the run without --resume \
         (with --checkpoint {path} it writes one), or point --checkpoint at an existing file"
    )]
    Missing { path: PathBuf },

    #[error(
        "cannot read the checkpoint {path}: {}. The file is damaged or is not a checkpoint of \
         this program. {}", one_line(.cause), fallback_advice(.path)
    )]
    Unreadable { path: PathBuf, cause: TchError },

    #[error("{path} is not a usable checkpoint of this training run: {detail}. {}", fallback_advice(.path))]
    Invalid { path: PathBuf, detail: String },

    #[error(
        "{path} was written by a run with other settings ({detail}). An exact resume needs the \
         same settings: rerun with those values, or start a new run without --resume"
    )]
    SettingsDiffer { path: PathBuf, detail: String },

    #[error(
        "{path} is the checkpoint of step {step}, the last step of this run: the run has finished, and \
         a resume would have no step left to run. Use its weights (`checkpoint::load_model_weights` \
         loads them into a model), or start a new run without --resume"
    )]
    Finished { path: PathBuf, step: usize },

    #[error("cannot write the checkpoint {path}: {detail}")]
    Write { path: PathBuf, detail: String },
}

/// What to do about a damaged checkpoint: resume from the one before it, if
/// `save` kept one, else start again.
fn fallback_advice(path: &Path) -> String {
    let previous = previous_path(path);
    if previous.is_file() {
        format!(
            "The checkpoint before it is kept as {prev}: resume from it with \
             `cp {prev} {path}` and --resume, or delete {path} and start again without --resume",
            prev = previous.display(),
            path = path.display()
        )
    } else {
        format!("Delete {} and start again without --resume", path.display())
    }
}

/// A libtorch or safetensors error in one line of words: libtorch appends
/// its C++ stack, and safetensors names its error kinds in code. tch puts
/// the file's path before a safetensors error; the message names it already.
fn one_line(error: &TchError) -> String {
    match error {
        TchError::SafeTensorError { err, .. } => crate::error_text::cause_in_words(&err.to_string()),
        other => crate::error_text::cause_in_words(&other.to_string()),
    }
}

/// The tensors of `checkpoint` under their file names, without the checksum.
fn entries(checkpoint: &Checkpoint) -> Vec<Named> {
    let mut tensors: Vec<Named> = Vec::new();
    for (name, tensor) in &checkpoint.model {
        tensors.push((format!("model.{name}"), tensor.detach().contiguous()));
    }
    for (name, tensor) in &checkpoint.optimizer {
        tensors.push((format!("optim.{name}"), tensor.detach().contiguous()));
    }
    let LoopPosition { step, epoch, position } = checkpoint.progress;
    for (name, value) in [("step", step), ("epoch", epoch), ("position", position)] {
        tensors.push((format!("train.{name}"), Tensor::from_slice(&[value])));
    }
    for (name, setting) in &checkpoint.settings {
        let value = match setting {
            Setting::Int(v) => Tensor::from_slice(&[*v]),
            Setting::Float(v) => Tensor::from_slice(&[*v]),
            Setting::Text(v) => Tensor::from_slice(v.as_bytes()),
        };
        tensors.push((format!("run.{name}"), value));
    }
    tensors
}

/// The tensors a checkpoint file of `checkpoint` holds, on the CPU (a copy
/// of what lives on a GPU), without the checksum.
pub(super) fn contents(checkpoint: &Checkpoint) -> Vec<Named> {
    let on_cpu = |(name, t): Named| (name, t.to_device(tch::Device::Cpu));
    entries(checkpoint).into_iter().map(on_cpu).collect()
}

/// A fingerprint of the state in `checkpoint`: its weights, optimizer state
/// and progress, the same hash as the file's checksum but without the
/// settings. Two runs whose final states have the same fingerprint ended
/// in the same state, to the last bit, whatever settings got them there (a
/// ZeRO-1 run and a plain one can); the ranks of one run compare their
/// settings separately, before the first step.
pub fn fingerprint(checkpoint: &Checkpoint) -> i64 {
    let state = contents(checkpoint).into_iter().filter(|(name, _)| !name.starts_with("run."));
    checksum(&state.collect::<Vec<_>>())
}

/// FNV-1a, 64 bits, over every tensor's name, dtype, shape and bytes, in
/// name order. Not cryptographic: it catches damage, not tampering.
pub(super) fn checksum(tensors: &[Named]) -> i64 {
    let mut sorted: Vec<&Named> = tensors.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let mut hash = Fnv1a::new();
    for (name, tensor) in sorted {
        hash.write(name.as_bytes());
        hash.write(format!("{:?}{:?}", tensor.kind(), tensor.size()).as_bytes());
        let numel = tensor.numel();
        let mut bytes = vec![0u8; numel * tensor.kind().elt_size_in_bytes()];
        if tensor.f_copy_data_u8(&mut bytes, numel).is_err() {
            hash.write(b"unreadable");
        }
        hash.write(&bytes);
    }
    hash.finish()
}

// ANCHOR: load
/// Reads the checkpoint at `path` and checks its checksum. It does not
/// check that it fits a model: [`Checkpoint::check_settings`] and the
/// loaders that copy its tensors do.
pub fn load(path: &Path) -> Result<Checkpoint, CheckpointError> {
    read(path).map(|(checkpoint, _)| checkpoint)
}

/// [`load`], returning the file's bytes too (what rank 0 sends the others
/// on `--resume`).
pub fn read(path: &Path) -> Result<(Checkpoint, Vec<u8>), CheckpointError> {
    if !path.is_file() {
        return Err(CheckpointError::Missing { path: path.to_path_buf() });
    }
    let bytes = std::fs::read(path).map_err(|error| CheckpointError::Unreadable {
        path: path.to_path_buf(),
        cause: TchError::Io(error),
    })?;
    Ok((from_bytes(path, &bytes)?, bytes))
}

/// The checkpoint in `bytes`, the contents of a checkpoint file (`path`
/// names it in errors), its checksum checked: what [`load`] reads, and what
/// a resumed run's ranks receive from rank 0.
pub fn from_bytes(path: &Path, bytes: &[u8]) -> Result<Checkpoint, CheckpointError> {
    let invalid = |detail: String| CheckpointError::Invalid { path: path.to_path_buf(), detail };
    let unreadable = |cause| CheckpointError::Unreadable { path: path.to_path_buf(), cause };
    let file = safetensors::SafeTensors::deserialize(bytes)
        .map_err(|err| unreadable(TchError::SafeTensorError { path: path.display().to_string(), err }))?;
    let mut tensors = Vec::new();
    for (name, view) in file.tensors() {
        tensors.push((name, Tensor::try_from(view).map_err(unreadable)?));
    }
    let stored = match tensors.iter().position(|(name, _)| name == "train.checksum") {
        Some(i) => int_value(&tensors.swap_remove(i).1),
        None => None,
    };
    let stored = stored.ok_or_else(|| invalid("it has no `train.checksum` entry".into()))?;
    if stored != checksum(&tensors) {
        return Err(invalid("its checksum does not match its contents: the file was damaged".into()));
    }
    let mut checkpoint = Checkpoint {
        model: vec![],
        optimizer: vec![],
        progress: LoopPosition { step: -1, epoch: -1, position: -1 },
        settings: vec![],
    };
    for (name, tensor) in tensors {
        if let Some(rest) = name.strip_prefix("model.") {
            checkpoint.model.push((rest.to_string(), tensor));
        } else if let Some(rest) = name.strip_prefix("optim.") {
            checkpoint.optimizer.push((rest.to_string(), tensor));
        } else if let Some(rest) = name.strip_prefix("run.") {
            let setting = match tensor.kind() {
                Kind::Double if tensor.numel() == 1 => Setting::Float(tensor.double_value(&[0])),
                Kind::Uint8 => {
                    let bytes =
                        Vec::<u8>::try_from(&tensor).map_err(|e| invalid(format!("`{name}`: {e}")))?;
                    let text =
                        String::from_utf8(bytes).map_err(|_| invalid(format!("`{name}` is not UTF-8")))?;
                    Setting::Text(text)
                }
                _ => Setting::Int(
                    int_value(&tensor).ok_or_else(|| invalid(format!("`{name}` is not a number")))?,
                ),
            };
            checkpoint.settings.push((rest.to_string(), setting));
        } else {
            let value = int_value(&tensor).ok_or_else(|| invalid(format!("`{name}` is not a number")))?;
            match name.as_str() {
                "train.step" => checkpoint.progress.step = value,
                "train.epoch" => checkpoint.progress.epoch = value,
                "train.position" => checkpoint.progress.position = value,
                _ => return Err(invalid(format!("unknown entry `{name}`"))),
            }
        }
    }
    let LoopPosition { step, epoch, position } = checkpoint.progress;
    if step < 0 || epoch < 0 || position < 0 {
        return Err(invalid(format!(
            "train.step/epoch/position missing or negative ({step}/{epoch}/{position})"
        )));
    }
    Ok(checkpoint)
}
// ANCHOR_END: load

/// The single i64 in a one-element integer tensor.
fn int_value(tensor: &Tensor) -> Option<i64> {
    (tensor.kind() == Kind::Int64 && tensor.numel() == 1).then(|| tensor.int64_value(&[0]))
}

impl Checkpoint {
    /// Fails, listing every difference, unless this checkpoint was written
    /// with exactly the `expected` settings.
    pub fn check_settings(&self, path: &Path, expected: &[(String, Setting)]) -> Result<(), CheckpointError> {
        let mut differences = Vec::new();
        for (name, wanted) in expected {
            match self.settings.iter().find(|(n, _)| n == name) {
                Some((_, saved)) if saved == wanted => {}
                Some((_, saved)) => {
                    differences.push(format!("{name}: checkpoint {saved}, this run {wanted}"))
                }
                None => differences.push(format!("{name}: not in the checkpoint, this run {wanted}")),
            }
        }
        if differences.is_empty() {
            Ok(())
        } else {
            Err(CheckpointError::SettingsDiffer { path: path.to_path_buf(), detail: differences.join("; ") })
        }
    }

    /// Copies the saved model tensors into `named` (a model's parameters or
    /// buffers, by name), failing on a missing name, shape or dtype.
    pub fn restore_model(&self, path: &Path, named: &[Named]) -> Result<(), CheckpointError> {
        copy_named(&self.model, named)
            .map_err(|detail| CheckpointError::Invalid { path: path.to_path_buf(), detail })
    }
}

/// Copies `saved[name]` into each `(name, target)` of `targets`.
pub(super) fn copy_named(saved: &[Named], targets: &[Named]) -> Result<(), String> {
    for (name, target) in targets {
        let Some((_, value)) = saved.iter().find(|(n, _)| n == name) else {
            return Err(format!("the model has `{name}`, the checkpoint does not"));
        };
        if value.size() != target.size() || value.kind() != target.kind() {
            return Err(format!(
                "`{name}` is {:?} {:?} in the checkpoint but {:?} {:?} in the model",
                value.kind(),
                value.size(),
                target.kind(),
                target.size()
            ));
        }
        tch::no_grad(|| target.shallow_clone().copy_(value));
    }
    Ok(())
}

/// Where `save` keeps the checkpoint that the newest one replaced: the
/// fallback that a damaged checkpoint's error points to.
pub fn previous_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".prev");
    PathBuf::from(name)
}
