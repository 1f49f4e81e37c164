//! Training checkpoints: one safetensors file that holds everything a run
//! needs to continue exactly where it stopped. Written by rank 0 alone,
//! atomically; on `--resume` read by rank 0, whose bytes the other ranks
//! receive (`train/resume.rs`).
//!
//! The file's tensors, by name:
//! - `model.<name>`: the unwrapped model's parameters and buffers, under
//!   their `VarStore` names (so [`load_model_weights`] fills a fresh model);
//! - `optim.<name>`: the optimizer's state ([`AdamW::state`](crate::train::AdamW::state));
//! - `train.step`, `train.epoch`, `train.position`: where the loop stands;
//! - `run.<setting>`: the settings that fix the run's numbers (seed, batch,
//!   learning rate, ...), so that a resume with other settings is refused;
//! - `train.checksum`: a hash of all the above, so that a damaged file is an
//!   error and not a silently different model.
//!
//! | file | what |
//! | --- | --- |
//! | `file.rs` | the file's contents, [`load`] and [`from_bytes`], and their errors |
//! | `saving.rs` | [`save`]: checked first, written atomically, the previous one kept |
//! | `sharded.rs` | the sharded checkpoint of `--shard full`: one file per rank, and the layout that puts them back together |
//! | `weights.rs` | [`load_model_weights`]: a checkpoint's, or a PyTorch `state_dict`'s, weights into a model |

mod file;
mod saving;
pub mod sharded;
mod weights;

pub use file::{
    fingerprint, from_bytes, load, previous_path, read, Checkpoint, CheckpointError, LoopPosition, Setting,
};
pub use saving::{check_writable, leftover_temporaries, save, save_step_by_step, temporary_path, SaveStep};
pub use weights::load_model_weights;
