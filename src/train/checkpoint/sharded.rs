//! The sharded checkpoint of an FSDP run (`--shard full`), as
//! `torch.distributed.checkpoint` writes one: each rank saves the rows it
//! owns, and one more file says how to put them back together, so that a
//! resume can cut them again for another world size.
//!
//! For a checkpoint at `<path>` written by W ranks:
//! - `<path>.shard-<r>-of-<W>`, one per rank r, written by that rank: a
//!   checkpoint file ([`save`](super::save), checksummed, atomic, `.prev`
//!   kept) whose `model.<name>` are its rows of each parameter and whose
//!   `optim.exp_avg.<name>`, `optim.exp_avg_sq.<name>` are AdamW's moments
//!   of those rows;
//! - `<path>` itself, written by rank 0 once every shard is on disk: the
//!   model's buffers, the optimizer's step counts, where the loop stands,
//!   the run's settings, and the layout: per parameter its global shape
//!   (`optim.shards.shape.<name>`) and each file's rows of it
//!   (`optim.shards.rows.<name>`, `[W, 2]`: first row, rows), and each shard
//!   file's fingerprint (`optim.shards.files`), so that a shard of another
//!   save is refused.
//!
//! [`consolidate`] reads them all back into one whole [`Checkpoint`], the
//! one a plain run writes, which the resumed run then shards its own way.

use std::path::{Path, PathBuf};

use tch::Tensor;

use super::file::{fingerprint, load, Checkpoint, CheckpointError};
use crate::ddp::Named;

/// The file of rank `rank`'s shard of the sharded checkpoint at `path`,
/// written by `world_size` ranks.
pub fn shard_path(path: &Path, rank: usize, world_size: usize) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".shard-{rank}-of-{world_size}"));
    PathBuf::from(name)
}

/// One parameter as one rank holds it: its rows, AdamW's moments of them
/// (each `[rows, ...]`, shaped like the parameter), and its step count.
pub struct ShardOf {
    pub name: String,
    pub global_shape: Vec<i64>,
    /// `(first row, rows)` of the parameter in this shard.
    pub rows: (i64, i64),
    pub values: Tensor,
    pub exp_avg: Tensor,
    pub exp_avg_sq: Tensor,
    pub step: i64,
}

/// What rank `rank` saves: its shard file's contents.
pub fn shard_file(shards: &[ShardOf], template: &Checkpoint) -> Checkpoint {
    let mut model = vec![];
    let mut optimizer = vec![];
    for shard in shards {
        model.push((shard.name.clone(), shard.values.shallow_clone()));
        optimizer.push((format!("exp_avg.{}", shard.name), shard.exp_avg.shallow_clone()));
        optimizer.push((format!("exp_avg_sq.{}", shard.name), shard.exp_avg_sq.shallow_clone()));
        optimizer.push((format!("step.{}", shard.name), Tensor::from_slice(&[shard.step])));
    }
    Checkpoint { model, optimizer, progress: template.progress, settings: template.settings.clone() }
}

/// The file at `path` itself (rank 0's): `buffers`, the optimizer's `step`,
/// and the layout: `all_rows[r]` is rank r's `(first row, rows)` of each
/// parameter of `shards` (the same names on every rank), `files[r]` the
/// fingerprint of rank r's shard file.
pub fn layout_file(
    shards: &[ShardOf],
    all_rows: &[Vec<(i64, i64)>],
    files: &[i64],
    buffers: Vec<Named>,
    template: &Checkpoint,
) -> Checkpoint {
    let mut optimizer = vec![
        ("step".to_string(), Tensor::from_slice(&[template.progress.step])),
        ("shards.files".to_string(), Tensor::from_slice(files)),
    ];
    for (i, shard) in shards.iter().enumerate() {
        let rows: Vec<i64> = all_rows.iter().flat_map(|of_rank| [of_rank[i].0, of_rank[i].1]).collect();
        optimizer.push((format!("shards.shape.{}", shard.name), Tensor::from_slice(&shard.global_shape)));
        optimizer.push((format!("shards.rows.{}", shard.name), Tensor::from_slice(&rows).view([-1, 2])));
    }
    Checkpoint { model: buffers, optimizer, progress: template.progress, settings: template.settings.clone() }
}

/// Whether the checkpoint file `saved` is the layout of a sharded checkpoint.
pub fn is_sharded(saved: &Checkpoint) -> bool {
    saved.optimizer.iter().any(|(name, _)| name == "shards.files")
}

/// The sharded checkpoint whose layout file `layout` was read from `path`,
/// read back whole: every shard file, checked against the layout, and
/// each parameter and moment put back together from its rows. The result
/// is what a plain run's checkpoint holds (model: parameters and buffers;
/// optimizer: AdamW's state by its names).
pub fn consolidate(path: &Path, layout: &Checkpoint) -> Result<Checkpoint, CheckpointError> {
    let invalid = |detail: String| CheckpointError::Invalid { path: path.to_path_buf(), detail };
    let entry = |name: &str| layout.optimizer.iter().find(|(n, _)| n == name).map(|(_, t)| t);
    let files = entry("shards.files").ok_or_else(|| invalid("it is not a sharded checkpoint".into()))?;
    let files: Vec<i64> =
        Vec::<i64>::try_from(files).map_err(|e: tch::TchError| invalid(format!("`shards.files`: {e}")))?;
    let world_size = files.len();
    let mut shards = Vec::with_capacity(world_size);
    for (rank, &expected) in files.iter().enumerate() {
        let file = shard_path(path, rank, world_size);
        if !file.is_file() {
            return Err(invalid(format!(
                "it was written by {world_size} ranks, and the shard file of rank {rank}, {}, is \
                 missing: every `{}.shard-*-of-{world_size}` file must lie next to it",
                file.display(),
                path.display()
            )));
        }
        let shard = load(&file)?;
        if fingerprint(&shard) != expected || shard.progress != layout.progress {
            return Err(invalid(format!(
                "the shard file {} belongs to another save (step {}; this one is of step {}): the \
                 files of one checkpoint were mixed with another's. Restore a matching set (the \
                 `.prev` files are the save before), or start again without --resume",
                file.display(),
                shard.progress.step,
                layout.progress.step
            )));
        }
        shards.push(shard);
    }
    let mut model: Vec<Named> = vec![];
    let mut optimizer: Vec<Named> = vec![];
    optimizer.extend(entry("step").map(|t| ("step".to_string(), t.copy())));
    for (key, shape) in layout.optimizer.iter().filter(|(n, _)| n.starts_with("shards.shape.")) {
        let name = &key["shards.shape.".len()..];
        let shape: Vec<i64> =
            Vec::<i64>::try_from(shape).map_err(|e: tch::TchError| invalid(format!("`{key}`: {e}")))?;
        let rows = entry(&format!("shards.rows.{name}"))
            .ok_or_else(|| invalid(format!("`{name}` has a shape but no rows")))?;
        let rows: Vec<i64> =
            Vec::<i64>::try_from(rows.reshape([-1])).map_err(|e: tch::TchError| invalid(e.to_string()))?;
        if rows.len() != 2 * world_size {
            return Err(invalid(format!(
                "`{name}` lists rows for {} ranks, not {world_size}",
                rows.len() / 2
            )));
        }
        let piece = |from: &[Named], rank: usize, key: String| -> Result<Tensor, CheckpointError> {
            let (_, t) = from.iter().find(|(n, _)| *n == key).ok_or_else(|| {
                let file = shard_path(path, rank, world_size);
                invalid(format!("the shard file {} has no `{key}`", file.display()))
            })?;
            let mut expected = shape.clone();
            expected[0] = rows[2 * rank + 1];
            if t.size() != expected {
                return Err(invalid(format!(
                    "rank {rank}'s `{key}` is {:?}, the layout says {expected:?}",
                    t.size()
                )));
            }
            Ok(t.shallow_clone())
        };
        let whole = |of: &dyn Fn(usize) -> Result<Tensor, CheckpointError>| {
            let first = of(0)?;
            let full = Tensor::zeros(shape.as_slice(), (first.kind(), tch::Device::Cpu));
            for rank in 0..world_size {
                let (start, len) = (rows[2 * rank], rows[2 * rank + 1]);
                if start < 0 || len < 0 || start + len > shape[0] {
                    return Err(invalid(format!("rank {rank}'s rows of `{name}` lie outside it")));
                }
                full.narrow(0, start, len).copy_(&of(rank)?);
            }
            Ok(full)
        };
        model.push((name.to_string(), whole(&|r| piece(&shards[r].model, r, name.to_string()))?));
        for moment in ["exp_avg", "exp_avg_sq"] {
            let key = format!("{moment}.{name}");
            optimizer.push((key.clone(), whole(&|r| piece(&shards[r].optimizer, r, key.clone()))?));
        }
        let step = format!("step.{name}");
        let (_, count) = shards[0]
            .optimizer
            .iter()
            .find(|(n, _)| *n == step)
            .ok_or_else(|| invalid(format!("the shard of rank 0 has no `{step}`")))?;
        optimizer.push((step, count.copy()));
    }
    model.extend(layout.model.iter().map(|(n, t)| (n.clone(), t.shallow_clone())));
    Ok(Checkpoint { model, optimizer, progress: layout.progress, settings: layout.settings.clone() })
}
