//! Writing checkpoints so that no work is lost: the path is checked before
//! training starts, every write goes to a temporary file of its own and is
//! renamed into place, and the checkpoint it replaces is kept as
//! `<path>.prev`, the fallback when the newest one turns out damaged.
//!
//! Tested by `cargo test --test train`.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use tch::Tensor;

use super::checkpoint::{checksum, entries, Checkpoint, CheckpointError};

/// `<path><suffix>`, next to `path`.
fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// A file name of its own for one write of `path`: this process's id and a
/// counter, so that two runs (or two saves) never write the same file.
pub fn temporary_path(path: &Path) -> PathBuf {
    static WRITES: AtomicU64 = AtomicU64::new(0);
    let write = WRITES.fetch_add(1, Ordering::Relaxed);
    with_suffix(path, &format!(".{}-{write}.tmp", std::process::id()))
}

/// Temporary files of `path` that are still there (after a crash, say).
pub fn leftover_temporaries(path: &Path) -> Vec<PathBuf> {
    let (Some(folder), Some(name)) = (path.parent(), path.file_name()) else { return vec![] };
    let folder = if folder.as_os_str().is_empty() { Path::new(".") } else { folder };
    let prefix = format!("{}.", name.to_string_lossy());
    let Ok(entries) = std::fs::read_dir(folder) else { return vec![] };
    entries
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|p| {
            let file = p.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
            file.starts_with(&prefix) && file.ends_with(".tmp")
        })
        .collect()
}

/// Where `save` keeps the checkpoint that the newest one replaced.
pub fn previous_path(path: &Path) -> PathBuf {
    with_suffix(path, ".prev")
}

/// Checks, before a run trains for hours, that a checkpoint can be written
/// to `path`: not a folder, in a folder that exists and takes new files.
pub fn check_writable(path: &Path) -> Result<(), CheckpointError> {
    let fail = |detail: String| CheckpointError::Write { path: path.to_path_buf(), detail };
    if path.is_dir() {
        return Err(fail(
            "it is a folder; name a file in it, such as --checkpoint <folder>/run.safetensors".into(),
        ));
    }
    let folder = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if !folder.is_dir() {
        let detail = format!("the folder {} does not exist; create it first (mkdir -p)", folder.display());
        return Err(fail(detail));
    }
    // The only sure test is to write: permissions, read-only mounts and
    // special file systems (/proc) all refuse at this point.
    let probe = temporary_path(path);
    let written = File::create(&probe).and_then(|file| file.sync_all());
    let _ = std::fs::remove_file(&probe);
    written.map_err(|e| {
        fail(format!("a test write in {} failed ({e}); pick a folder you can write to", folder.display()))
    })
}

// ANCHOR: save
/// Writes `checkpoint` to `path` atomically: to a temporary file of its own
/// first, flushed to disk, then renamed over `path`. A crash at any moment
/// leaves either the previous checkpoint or the new one, never half a file.
/// The checkpoint it replaces stays as [`previous_path`].
pub fn save(path: &Path, checkpoint: &Checkpoint) -> Result<(), CheckpointError> {
    let fail = |detail: String| CheckpointError::Write { path: path.to_path_buf(), detail };
    // Optimizer state on a GPU is written from a CPU copy.
    let on_cpu = |(name, t): (String, Tensor)| (name, t.to_device(tch::Device::Cpu));
    let mut tensors: Vec<(String, Tensor)> = entries(checkpoint).into_iter().map(on_cpu).collect();
    tensors.push(("train.checksum".to_string(), Tensor::from_slice(&[checksum(&tensors)])));
    let tmp = temporary_path(path);
    let written = Tensor::write_safetensors(&tensors, &tmp)
        .map_err(|e| format!("writing {}: {e}", tmp.display()))
        // fsync: the bytes must be on disk before the rename makes them "the" checkpoint.
        .and_then(|()| {
            File::open(&tmp)
                .and_then(|f| f.sync_all())
                .map_err(|e| format!("flushing {}: {e}", tmp.display()))
        });
    if let Err(detail) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(fail(detail));
    }
    if path.is_file() {
        // The current checkpoint becomes the fallback: a hard link (no copy),
        // renamed into place so that `.prev` too is always whole.
        let previous_tmp = temporary_path(path);
        let kept = std::fs::hard_link(path, &previous_tmp)
            .or_else(|_| std::fs::copy(path, &previous_tmp).map(|_| ()))
            .and_then(|()| std::fs::rename(&previous_tmp, previous_path(path)));
        if let Err(e) = kept {
            let _ = std::fs::remove_file(&previous_tmp);
            let _ = std::fs::remove_file(&tmp);
            return Err(fail(format!(
                "keeping the previous checkpoint as {}: {e}",
                previous_path(path).display()
            )));
        }
    }
    std::fs::rename(&tmp, path).map_err(|e| fail(format!("renaming {} to it: {e}", tmp.display())))?;
    // And the renames themselves: flush the folder's entry list (best effort,
    // not every platform lets a folder be opened as a file).
    let folder = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if let Ok(dir) = File::open(folder) {
        let _ = dir.sync_all();
    }
    Ok(())
}
// ANCHOR_END: save
