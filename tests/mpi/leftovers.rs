//! Files of /dev/shm that `alloc_buffer` makes (`src/dist/mpi/shm/regions.rs`)
//! and unlinks a few milliseconds later: a job killed in between leaves
//! one, holding memory until reboot. Jobs that allocate without pause are
//! killed (`kill -9` of the rank that creates the files) at random early
//! moments; the test counts the files each left, then requires that the
//! next job removes them all: a job of the backend started by plain
//! `mpirun` (the backend's own sweep), and, after more kills,
//! `scripts/launch.sh` alone (the launcher's).
//!
//! Run: cargo test --features mpi --test mpi leftovers

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use ddp_workbook::dist::Group;
use ddp_workbook::tch::{Device, Kind};

use crate::harness::{job_command, turn, RANK_MARKER};

const NAME: &str = "leftovers::files_left_by_jobs_killed_early_are_removed_by_the_next_job";
/// In the ranks: "allocate" (until killed), or "once".
const MODE: &str = "DDP_TEST_LEFTOVERS";
/// In the ranks: where rank 0 writes its process id.
const PID_FILE: &str = "DDP_TEST_LEFTOVERS_PID";
/// Jobs killed per round, at most: a round ends once kills left 2 files.
const KILLS: usize = 12;

fn body(pg: Group) -> anyhow::Result<()> {
    let allocations = match std::env::var(MODE).as_deref() {
        Ok("allocate") => 20_000,
        _ => 1,
    };
    if pg.rank() == 0 {
        if let Ok(path) = std::env::var(PID_FILE) {
            std::fs::write(path, std::process::id().to_string())?;
        }
    }
    for _ in 0..allocations {
        _ = pg.alloc_buffer(1024, Kind::Float, Device::Cpu)?; // mapped until the process ends
    }
    println!("mpi-test-rank-finished {}", pg.rank());
    Ok(())
}

/// The files of /dev/shm that process `pid` made.
fn files_of(pid: u32) -> usize {
    let prefix = format!("ddp-workbook-{pid}-");
    std::fs::read_dir("/dev/shm")
        .map(|dir| dir.flatten().filter(|e| e.file_name().to_string_lossy().starts_with(&prefix)).count())
        .unwrap_or(0)
}

/// A pseudo-random pause of 0 to 150 ms.
fn random_pause() -> Duration {
    let nanos = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
    Duration::from_millis(u64::from(nanos.wrapping_mul(2_654_435_761) % 150))
}

/// Starts allocating jobs and kills each early; the killed processes, and
/// the files they left (each counted right after its kill: the next job's
/// launcher may remove it).
fn kill_jobs_early(round: &str) -> (Vec<u32>, usize) {
    let _turn = turn();
    let (mut pids, mut left) = (vec![], 0);
    for kill in 0..KILLS {
        let pid_file =
            std::env::temp_dir().join(format!("ddp-leftovers-{}-{round}-{kill}", std::process::id()));
        _ = std::fs::remove_file(&pid_file);
        let path = pid_file.to_string_lossy().into_owned();
        let mut job = job_command(2, NAME, &[(MODE, "allocate"), (PID_FILE, &path)])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("bash runs scripts/launch.sh");
        let started = Instant::now();
        let pid = loop {
            if let Some(pid) =
                std::fs::read_to_string(&pid_file).ok().and_then(|t| t.trim().parse::<u32>().ok())
            {
                break pid;
            }
            assert!(started.elapsed() < Duration::from_secs(60), "rank 0 never wrote its process id");
            std::thread::sleep(Duration::from_millis(5));
        };
        std::thread::sleep(random_pause());
        _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        let status = job.wait().expect("waiting for the job");
        assert!(!status.success(), "a job whose rank 0 was killed ended with success");
        _ = std::fs::remove_file(&pid_file);
        left += files_of(pid);
        pids.push(pid);
        if left >= 2 {
            break;
        }
    }
    assert!(
        left > 0,
        "none of {KILLS} kills landed between a file's creation and its unlink: the test proves nothing \
         (a faster machine? allocate longer)"
    );
    (pids, left)
}

/// [`kill_jobs_early`] until some of the killed jobs' files are still there
/// when it returns, with how many: the other MPI tests of this binary run
/// beside this one, and their jobs' first allocations sweep such files too,
/// sometimes in the moment between the kills and the count.
fn kill_until_files_remain(round: &str) -> (Vec<u32>, usize, usize) {
    for _ in 0..3 {
        let (pids, left) = kill_jobs_early(round);
        let before: usize = pids.iter().map(|&p| files_of(p)).sum();
        if before > 0 {
            return (pids, left, before);
        }
    }
    panic!("three times, the files the killed jobs left were gone before the next job started (swept by another test's job)");
}

#[test]
fn files_left_by_jobs_killed_early_are_removed_by_the_next_job() {
    if std::env::var_os(RANK_MARKER).is_some() {
        ddp_workbook::dist::mpi::run(body);
        return;
    }
    // Round 1: the next job is the backend's, started without the launcher.
    let (pids, left, before) = kill_until_files_remain("backend");
    let exe = std::env::current_exe().expect("the test binary's path");
    let plain = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "--bind-to", "none"])
        .args(["--mca", "btl_vader_single_copy_mechanism", "none", "-np", "2"])
        .arg(&exe)
        .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
        .env(RANK_MARKER, "1")
        .env(MODE, "once")
        .output()
        .expect("mpirun starts");
    let finished = String::from_utf8_lossy(&plain.stdout).matches("mpi-test-rank-finished").count();
    assert!(
        plain.status.success() && finished == 2,
        "the next job failed:\n{}",
        String::from_utf8_lossy(&plain.stderr)
    );
    let after: usize = pids.iter().map(|&p| files_of(p)).sum();
    println!(
        "{} jobs killed early left {left} files, {before} still there; after the backend's next job: {after}",
        pids.len()
    );
    assert_eq!(after, 0, "the backend's next job left {after} of the {before} files of the killed jobs");

    // Round 2: the launcher alone, running a program that is no rank of ours.
    let (pids, left, before) = kill_until_files_remain("launcher");
    let launched = Command::new("bash")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/launch.sh"))
        .args(["-np", "1", "true"])
        .output()
        .expect("bash runs scripts/launch.sh");
    assert!(launched.status.success(), "launch.sh -np 1 true: {}", String::from_utf8_lossy(&launched.stderr));
    let after: usize = pids.iter().map(|&p| files_of(p)).sum();
    println!(
        "{} jobs killed early left {left} files, {before} still there; after the launcher's next job: {after}",
        pids.len()
    );
    assert_eq!(after, 0, "scripts/launch.sh left {after} of the {before} files of the killed jobs");
}
