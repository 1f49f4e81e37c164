//! Where things are in the repository, as the
//! source checks (layering, seams, stubs) see it: which modules are the
//! workbook's chapters, and the Rust files under a folder. Shared here so
//! that those checks depend on it and not on each other.

use std::fs;
use std::path::{Path, PathBuf};

/// The modules of `src/` that are the workbook's chapters: `ch01_collectives`, ...
pub fn is_chapter(module: &str) -> bool {
    let bytes = module.as_bytes();
    bytes.len() > 5
        && module.starts_with("ch")
        && bytes[2..4].iter().all(u8::is_ascii_digit)
        && bytes[4] == b'_'
}

/// The chapter folders that have an exercise: (`01`, src/ch01_collectives).
pub fn chapter_dirs(root: &Path) -> Vec<(String, PathBuf)> {
    let Ok(entries) = fs::read_dir(root.join("src")) else { return Vec::new() };
    let mut chapters: Vec<(String, PathBuf)> = entries
        .filter_map(|entry| entry.ok())
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let has_exercise = is_chapter(&name) && entry.path().join("exercise.rs").is_file();
            has_exercise.then(|| (name[2..4].to_string(), entry.path()))
        })
        .collect();
    chapters.sort();
    chapters
}

/// Every .rs file under `dir`, recursively, sorted; none if it is missing.
pub fn rust_files_under(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(folder) = pending.pop() {
        let Ok(entries) = fs::read_dir(&folder) else { continue };
        for path in entries.filter_map(|entry| Some(entry.ok()?.path())) {
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}
