//! How examples/bench_vs_pytorch.rs runs
//! the programs it measures (its own MPI workers, the PyTorch scripts in
//! `.venv`) and reads the numbers they print. Included by bench_vs_pytorch.rs
//! and bench_sizes.rs:
//! `cargo run --release --features mpi --example bench_vs_pytorch`.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long one measured program may run before it counts as hung: each is
/// sized to take well under a minute, but a rank of PyTorch's once hung in
/// its interpreter's shutdown after printing, which would stall the whole
/// benchmark.
pub const DEADLINE: Duration = Duration::from_secs(600);

/// Runs a command and returns its stdout; fails with its output if it
/// fails, or if it runs past [`DEADLINE`] (then it is killed, with every
/// process it started: mpirun's ranks, PyTorch's spawned ones).
pub fn stdout_of(mut command: Command) -> anyhow::Result<String> {
    // Its own process group, so that a kill reaches its children too.
    command.process_group(0).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command.spawn().map_err(|e| anyhow::anyhow!("{command:?} could not start: {e}"))?;
    let read = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = Vec::new();
            let _ = pipe.read_to_end(&mut text);
            String::from_utf8_lossy(&text).into_owned()
        })
    };
    let stdout = read(Box::new(child.stdout.take().expect("piped")));
    let stderr = read(Box::new(child.stderr.take().expect("piped")));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if started.elapsed() > DEADLINE {
            let group = format!("-{}", child.id());
            let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (stdout, stderr) = (stdout.join().unwrap_or_default(), stderr.join().unwrap_or_default());
    match status {
        Some(status) if status.success() => Ok(stdout),
        Some(status) => anyhow::bail!("{command:?} failed ({status}): {stdout}{stderr}"),
        None => anyhow::bail!(
            "{command:?} ran past {DEADLINE:?} and was killed: it hung, or the machine is too busy for \
             these step counts (give fewer --steps). Its output: {stdout}{stderr}"
        ),
    }
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
