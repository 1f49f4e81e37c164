//! Runs the project's PyTorch (`.venv`, made by
//! scripts/setup.sh) for the tests that compare the workbook with PyTorch:
//! tests/torch_sampler.rs, tests/torch_checkpoint.rs, tests/torch_twins.rs.
//! Each includes it with `#[path = "torch/venv.rs"] mod venv;`; it is not a
//! test binary of its own.

#![allow(dead_code)] // each test binary uses its own part

use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository root: scripts and `.venv` are found from here.
pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `.venv/bin/<program>`, or a panic saying how to get it.
pub fn venv_program(program: &str) -> PathBuf {
    let path = repo().join(".venv/bin").join(program);
    assert!(
        path.exists(),
        "{} is missing: these tests compare the workbook with PyTorch and need the project's \
         .venv -> run scripts/setup.sh",
        path.display()
    );
    path
}

/// `.venv/bin/python <script> <args>` from the repository root: its stdout.
pub fn python(script: &str, args: &[&str]) -> String {
    let mut command = Command::new(venv_program("python"));
    command.current_dir(repo()).arg(script).args(args);
    stdout_within(command, &format!("python {script}"), std::time::Duration::from_secs(300))
}

/// Runs `command`, killing it after `deadline`: a launcher that hangs fails
/// the test with what it printed so far, never hangs the suite.
pub fn stdout_within(mut command: Command, what: &str, deadline: std::time::Duration) -> String {
    use std::io::Read;
    use std::process::Stdio;
    let started = std::time::Instant::now();
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: could not start: {e}"));
    // Read both pipes on threads, so that a full pipe never blocks the child.
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    let err = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for the child") {
            break Some(status);
        }
        if started.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let (stdout, stderr) = (out.join().unwrap(), err.join().unwrap());
    match status {
        Some(status) if status.success() => stdout,
        Some(status) => panic!("{what} failed ({status}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}"),
        None => panic!(
            "{what} did not finish within {deadline:?}, killed:\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
        ),
    }
}
