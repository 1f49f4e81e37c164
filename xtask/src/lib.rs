//! The pieces of `cargo xtask test`, the ddp-workbook test
//! suite (scripts/test.sh runs it), and of `cargo workbook`, the learner's
//! command (`xtask/src/bin/workbook.rs`). `main.rs` runs the checks that the
//! command line (cli.rs, read by clap) asks for, in order; everything else
//! lives in these modules so that it can be unit-tested: `cargo test -p xtask`.
//!
//! This crate has no dependency on tch or libtorch on purpose: it builds in
//! seconds, and it can report a broken libtorch build instead of being one.

pub mod book_includes; // `includes`: every {{#include}} of the book resolves
pub mod cargo_json; // cargo's --message-format=json: test executables, errors
pub mod cli; // `cargo xtask`'s command line (clap): `test` and its checks, `waits`
pub mod expected_skips; // tests/expected_skips.toml: the skips a whole run may have, the least test count
pub mod figures_check; // `figures`: the book's figures are what examples/figures.rs draws
pub mod files_check; // `files`: every repository path the text mentions exists
pub mod gpu; // is there a GPU? then the GPU tests run, else they are skipped with their reason
pub mod history_check; // `history`: commit subjects fit 72 characters
pub mod layering_check; // `layering`: the library never imports a chapter, and the layers go one way
pub mod layout; // which modules are chapters, and the Rust files under a folder
pub mod libtest_json; // libtest's --format json events, counted per test
pub mod process; // running a command with a log, an optional time limit
pub mod pub_fns; // a Rust file's `pub fn`s, their docs, signatures and bodies, read with syn
pub mod report; // the OK/FAIL/SKIP lines and the closing summary line
pub mod rust_tokens; // a Rust file as proc-macro2 tokens, doc examples included, for paths in code
pub mod seams_check; // `layering`, part 2: only the chapters and their tests use `ddp::seams`
pub mod selection; // the checks, and which of them `--only`/`--skip` run
pub mod stubs_check; // `stubs`: exercises carry their solutions' docs
pub mod teeth_check; // `teeth`: on the stubs, each chapter test reaches the exercise or is a control
pub mod test_checks; // `solutions` and `runner`: test executables and their verdicts
pub mod test_executables; // building test executables and running one with JSON output
pub mod tool_checks; // fmt, book, notebooks, clippy, train: external tools
pub mod waits; // `cargo xtask waits`: the learner's waits, measured
pub mod waits_inner_loop; // `cargo xtask waits`: an exercise's scratch edit until its test reports
pub mod waits_log; // what a log of `bash .ci/run` says each part took; the waits table
pub mod workbook; // `cargo workbook`: the learner's command (chapters, tests, hints)

use std::path::{Path, PathBuf};

/// The repository root: the folder above this crate's manifest. The runner
/// works from there whatever the caller's current directory is.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask/ sits inside the repository").to_path_buf()
}

/// `CI` set (to anything but the empty string) means: a clean clone, run by a
/// machine. Then hung steps get time limits, and no chapter is skipped.
pub fn in_ci() -> bool {
    std::env::var_os("CI").is_some_and(|value| !value.is_empty())
}

/// Where the suite runs and what applies to it, shared by every check.
pub struct Context {
    pub root: PathBuf,
    /// target/test-logs/: one full log per command.
    pub log_dir: PathBuf,
    /// See [`in_ci`]: time limits on, no chapter skipped.
    pub ci: bool,
}

impl Context {
    pub fn new() -> std::io::Result<Context> {
        let root = repo_root();
        let log_dir = root.join("target").join("test-logs");
        std::fs::create_dir_all(&log_dir)?;
        Ok(Context { root, log_dir, ci: in_ci() })
    }

    pub fn log(&self, file_name: &str) -> PathBuf {
        self.log_dir.join(file_name)
    }

    /// `limit` in CI, no limit elsewhere (see process.rs for why).
    pub fn limit(&self, limit: std::time::Duration) -> Option<std::time::Duration> {
        self.ci.then_some(limit)
    }

    /// A `cargo` command run at the repository root, with the same cargo that
    /// runs us (`CARGO`, set by `cargo run`), so the toolchain never changes
    /// between the runner and the builds it starts.
    pub fn cargo(&self) -> std::process::Command {
        let program = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut command = std::process::Command::new(program);
        command.current_dir(&self.root);
        command
    }

    /// A path for messages: relative to the repository root when inside it.
    pub fn display<'a>(&self, path: &'a Path) -> std::borrow::Cow<'a, str> {
        path.strip_prefix(&self.root).unwrap_or(path).to_string_lossy()
    }
}
