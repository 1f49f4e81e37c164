//! How examples/bench_vs_pytorch.rs runs
//! the programs it measures (its own MPI workers, the PyTorch scripts in
//! `.venv`) and reads the numbers they print. Included by bench_vs_pytorch.rs:
//! `cargo run --release --features mpi --example bench_vs_pytorch`.

use std::process::Command;

/// Runs a command and returns its stdout; fails with its output if it fails.
pub fn stdout_of(mut command: Command) -> anyhow::Result<String> {
    let output = command.output()?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    anyhow::ensure!(output.status.success(), "{command:?} failed: {stdout}{stderr}");
    Ok(stdout)
}

/// The `prefix` lines of `stdout`, split into numbers.
pub fn lines_of(stdout: &str, prefix: &str) -> anyhow::Result<Vec<Vec<f64>>> {
    let values: Vec<Vec<f64>> = stdout
        .lines()
        .filter_map(|line| line.strip_prefix(prefix))
        .map(|rest| rest.split_whitespace().filter_map(|v| v.parse().ok()).collect())
        .collect();
    anyhow::ensure!(!values.is_empty(), "no `{prefix}` line in {stdout:?}");
    Ok(values)
}

/// The repository's root.
pub fn root() -> &'static std::path::Path {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `.venv`'s Python running `script` (relative to the repository) with `script_args`.
pub fn python(script: &str, script_args: &[&str]) -> anyhow::Result<Command> {
    let python = root().join(".venv/bin/python");
    anyhow::ensure!(python.is_file(), "{} is missing: run scripts/setup.sh", python.display());
    let mut command = Command::new(python);
    command.arg(root().join(script)).args(script_args);
    Ok(command)
}
