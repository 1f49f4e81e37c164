//! Writing checkpoints so that no work is lost: the path is checked before
//! training starts, every write goes to a temporary file of its own and is
//! renamed into place, and the checkpoint it replaces is kept as
//! `<path>.prev`, the fallback when the newest one turns out damaged. A
//! save killed at any step leaves a whole checkpoint to resume from, and
//! the next save removes the temporary files it left.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use tch::Tensor;

use super::file::{checksum, contents, previous_path, Checkpoint, CheckpointError};
use crate::ddp::Named;

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
/// The steps of [`save`], in order. A kill after any of them leaves
/// `<path>` whole: the checkpoint before this save, or this save's; the
/// next save removes whatever else it left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SaveStep {
    /// The temporary file exists, empty, locked by this save while it runs
    /// (a kill while writing leaves it so, or half written).
    Started,
    /// The new checkpoint is in the temporary file, flushed to disk.
    Written,
    /// The current checkpoint has a second, temporary name (a hard link, or
    /// a copy where links are not possible).
    PreviousLinked,
    /// That name became `<path>.prev`.
    PreviousKept,
    /// The temporary file was renamed over `<path>`.
    Replaced,
    /// The temporary files of interrupted saves are removed, and the
    /// folder's list of entries is flushed to disk.
    Finished,
}

impl SaveStep {
    /// Every step, in the order `save` takes them.
    pub const ALL: [SaveStep; 6] = [
        SaveStep::Started,
        SaveStep::Written,
        SaveStep::PreviousLinked,
        SaveStep::PreviousKept,
        SaveStep::Replaced,
        SaveStep::Finished,
    ];
}

/// Writes `checkpoint` to `path` atomically: to a temporary file of its own
/// first, flushed to disk, then renamed over `path`. A crash at any moment
/// leaves either the previous checkpoint or the new one, never half a file.
/// The checkpoint it replaces stays as [`previous_path`]. What an earlier,
/// killed save left behind is removed, so that after a save the folder
/// holds `path` and [`previous_path`] and nothing else of this checkpoint.
pub fn save(path: &Path, checkpoint: &Checkpoint) -> Result<(), CheckpointError> {
    save_step_by_step(path, checkpoint, &mut |_| {})
}

/// [`save`], calling `after` when each [`SaveStep`] is done: the tests kill
/// a process there to prove that a save interrupted anywhere loses nothing.
pub fn save_step_by_step(
    path: &Path,
    checkpoint: &Checkpoint,
    after: &mut dyn FnMut(SaveStep),
) -> Result<(), CheckpointError> {
    let fail = |detail: String| CheckpointError::Write { path: path.to_path_buf(), detail };
    let mut tensors = contents(checkpoint); // on the CPU: a GPU's optimizer state is copied
    tensors.push(("train.checksum".to_string(), Tensor::from_slice(&[checksum(&tensors)])));
    let tmp = temporary_path(path);
    let _locked = match write_locked(&tmp, &tensors, after) {
        Ok(file) => file, // stays locked until the save returns
        Err(detail) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(fail(detail));
        }
    };
    after(SaveStep::Written);
    if path.is_file() {
        let kept = keep_as_previous(path, after);
        if let Err(detail) = kept {
            let _ = std::fs::remove_file(&tmp);
            return Err(fail(detail));
        }
    }
    std::fs::rename(&tmp, path).map_err(|e| fail(format!("renaming {} to it: {e}", tmp.display())))?;
    after(SaveStep::Replaced);
    remove_leftovers(path);
    // And the renames themselves: flush the folder's entry list (best effort,
    // not every platform lets a folder be opened as a file).
    let folder = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if let Ok(dir) = File::open(folder) {
        let _ = dir.sync_all();
    }
    after(SaveStep::Finished);
    Ok(())
}

/// Writes `tensors` to `tmp` and flushes them to disk. Returns the file,
/// locked until it is dropped: the lock says "a save is writing this", so
/// other saves leave it alone, and it ends with this process, however that
/// ends.
fn write_locked(tmp: &Path, tensors: &[Named], after: &mut dyn FnMut(SaveStep)) -> Result<File, String> {
    let file = File::create(tmp).map_err(|e| format!("creating {}: {e}", tmp.display()))?;
    let _ = file.lock(); // a file system without locks: see `remove_leftovers`
    after(SaveStep::Started);
    // Written through its name: the same file, which stays locked.
    Tensor::write_safetensors(tensors, tmp).map_err(|e| format!("writing {}: {e}", tmp.display()))?;
    // fsync: the bytes must be on disk before the rename makes them "the" checkpoint.
    file.sync_all().map_err(|e| format!("flushing {}: {e}", tmp.display()))?;
    Ok(file)
}

/// Makes the current checkpoint the fallback, `.prev`: a second name for
/// it (a hard link, no copy) renamed into place, so that `.prev` too is
/// always whole.
fn keep_as_previous(path: &Path, after: &mut dyn FnMut(SaveStep)) -> Result<(), String> {
    let previous = previous_path(path);
    let fail = |e: std::io::Error| format!("keeping the previous checkpoint as {}: {e}", previous.display());
    let second_name = temporary_path(path);
    let linked = std::fs::hard_link(path, &second_name)
        .or_else(|_| std::fs::copy(path, &second_name).map(|_| ()))
        .map_err(fail);
    linked.inspect(|()| after(SaveStep::PreviousLinked))?;
    if let Err(e) = std::fs::rename(&second_name, &previous) {
        let _ = std::fs::remove_file(&second_name);
        return Err(fail(e));
    }
    // A save killed between its two renames left `.prev` as a second name
    // of the checkpoint itself. A rename onto another name of the same file
    // does nothing, and leaves the temporary name: remove it.
    if second_name.exists() {
        std::fs::remove_file(&second_name).map_err(fail)?;
    }
    after(SaveStep::PreviousKept);
    Ok(())
}

/// Removes the temporary files of `path` that no running save holds: what
/// saves killed before their end left. A save still running (another run
/// on the same path) holds its file locked. Where the file system has no
/// locks, nothing can be told apart and the files stay.
fn remove_leftovers(path: &Path) {
    for leftover in leftover_temporaries(path) {
        let Ok(file) = File::open(&leftover) else { continue }; // gone already
        if file.try_lock().is_ok() {
            let _ = std::fs::remove_file(&leftover);
        }
    }
}
// ANCHOR_END: save
