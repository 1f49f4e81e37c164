//! What the runner's tests share: a made-up repository in a temporary
//! folder, for the checks that read a tree of files.

use std::path::PathBuf;

/// A fresh repository named `name` (unique to this test process) holding
/// `files` (path from the root, text).
pub fn repo(name: &str, files: &[(&str, &str)]) -> PathBuf {
    let root = std::env::temp_dir().join(format!("xtask-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    for (path, text) in files {
        let file = path.split('/').fold(root.clone(), |folder, part| folder.join(part));
        std::fs::create_dir_all(file.parent().expect("a folder")).expect("a temporary folder");
        std::fs::write(&file, text).expect("written");
    }
    root
}
