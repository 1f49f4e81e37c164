//! scripts/launch.sh when a process outlives mpirun holding mpirun's
//! stderr, as a node agent does on a cluster whose node is slow to end:
//! the launcher must not wait for it, neither before a restart nor before
//! it exits, and must still have read what mpirun wrote (it names the
//! failure). An `mpirun` of the test's own, first on PATH, plays the part:
//! it leaves a process behind that holds its stderr for 8 s, and fails.
//!
//! Run: cargo test --features mpi --test mpi launcher

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// How long the process left behind holds mpirun's stderr.
const HELD_SECS: u64 = 8;

/// The stand-in: says why it failed, as a rank does, leaves `sleep`
/// holding its stderr (not its stdout, which the test reads to the end;
/// its pid written to `held`), and exits 1.
fn fake_mpirun(dir: &Path, held: &Path) {
    let script = format!(
        "#!/bin/sh\n\
         echo 'rank 0 of 1 failed, ending the whole job: on purpose' >&2\n\
         sleep {HELD_SECS} >/dev/null &\n\
         echo $! >>'{}'\n\
         exit 1\n",
        held.display()
    );
    let path = dir.join("mpirun");
    std::fs::write(&path, script).expect("writing the stand-in mpirun");
    Command::new("chmod").arg("+x").arg(&path).status().expect("chmod");
}

#[test]
fn a_process_holding_mpiruns_stderr_does_not_hold_the_launcher() {
    let dir = std::env::temp_dir().join(format!("ddp-launcher-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary folder");
    let held = dir.join("held.pids");
    fake_mpirun(&dir, &held);
    let path = format!("{}:{}", dir.display(), std::env::var("PATH").unwrap_or_default());
    let started = Instant::now();
    let ended = Command::new("bash")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/launch.sh"))
        .args(["--max-restarts", "1", "-np", "1", "true", "--checkpoint", "unused.safetensors"])
        .env("PATH", path)
        .output()
        .expect("bash runs scripts/launch.sh");
    let elapsed = started.elapsed();
    // Leave nothing behind: the processes that held the pipe.
    for pid in std::fs::read_to_string(&held).unwrap_or_default().split_whitespace() {
        _ = Command::new("kill").arg(pid).status();
    }
    _ = std::fs::remove_dir_all(&dir);
    let stderr = String::from_utf8_lossy(&ended.stderr);
    assert_eq!(ended.status.code(), Some(1), "the launcher's status; its stderr:\n{stderr}");
    assert!(
        stderr.contains("restart 1 of 1") && stderr.contains("rank 0 of 1 failed, ending the whole job"),
        "the launcher restarted once and named the failure it read from mpirun's stderr:\n{stderr}"
    );
    // Two attempts, each followed by a wait of at most 1 s for the pipe's last lines.
    assert!(
        elapsed < Duration::from_secs(HELD_SECS - 2),
        "the launcher took {elapsed:?} for two attempts that ended at once: it waited for the process \
         holding mpirun's stderr ({HELD_SECS} s each)\n{stderr}"
    );
    println!("two failed attempts took the launcher {:.1} s", elapsed.as_secs_f64());
}
