//! Checkpoints without a shared file system.
//! Each node has its own disk (scripts/nodes.sh), so the checkpoint that
//! rank 0 writes on node 1 is out of reach of the ranks on node 2. A run
//! stopped after a checkpoint and resumed must still end byte for byte where
//! the uninterrupted run ends, and must have run only the steps after the
//! checkpoint (it says which; a fresh start would end with the same bytes,
//! the run being deterministic). `scripts/launch.sh --max-restarts 1` does
//! the same by itself when a rank is killed mid-run.

use std::path::Path;
use std::time::Duration;

use crate::cluster::{on_cluster, Cluster, Ended, Job, LOCAL_DISK};

const STEPS: usize = 60;
const LIMIT: Duration = Duration::from_secs(300);

/// A short run (the target does not matter here) writing checkpoints to
/// `file` on the node-local disk every 10 steps, plus `extra` arguments.
fn run(cluster: &Cluster, file: &str, extra: &[&str]) -> Vec<String> {
    let checkpoint = format!("{LOCAL_DISK}/{file}");
    let steps = STEPS.to_string();
    let mut args = vec!["--backend", "mpi", "--batch-size", "8", "--threads", "1", "--steps", &steps];
    args.extend(["--log-every", "10", "--checkpoint-every", "10", "--target-accuracy", "0"]);
    args.extend(["--checkpoint", &checkpoint]);
    args.extend(extra);
    on_cluster(cluster, 4, &args)
}

fn succeeded(what: &str, ended: Ended) -> Ended {
    assert!(ended.success, "{what} failed:\n{}", ended.output);
    ended
}

/// The step a resumed run restarted after, and how many steps it ran,
/// from its `resuming after step N` and `K steps in` lines.
fn resumed_steps(output: &str) -> (usize, usize) {
    let after = output
        .lines()
        .find_map(|line| line.strip_prefix("resuming after step ")?.split(' ').next()?.parse().ok());
    let ran = output.lines().rev().find_map(|line| line.split(" steps in ").next()?.parse().ok());
    (after.expect("a `resuming after step N` line"), ran.expect("a `K steps in` line"))
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn a_run_resumed_on_2_nodes_from_rank_0s_disk_ends_as_the_uninterrupted_run() {
    let cluster = Cluster::up(2, 2);
    succeeded("the uninterrupted run", Job::start(&run(&cluster, "whole", &[]), 60).finish(LIMIT));
    let stopped = Job::start(&run(&cluster, "cut", &["--stop-after", "30"]), 60).finish(LIMIT);
    assert!(succeeded("the run stopped after step 30", stopped).output.contains("stopped after step 30"));
    for file in ["whole", "cut"] {
        assert!(!cluster.disk(2).join(file).exists(), "node 2's disk has a checkpoint `{file}`");
    }
    let resumed =
        succeeded("the resumed run", Job::start(&run(&cluster, "cut", &["--resume"]), 60).finish(LIMIT));
    assert_eq!(resumed_steps(&resumed.output), (30, STEPS - 30), "the resumed run:\n{}", resumed.output);
    assert!(
        read(&cluster.disk(1).join("whole")) == read(&cluster.disk(1).join("cut")),
        "the resumed run's final checkpoint differs from the uninterrupted run's"
    );
    assert!(!cluster.disk(2).join("cut").exists(), "node 2's disk has a checkpoint: a shared disk?");
}

#[test]
fn max_restarts_resumes_a_job_whose_rank_was_killed_and_ends_as_the_uninterrupted_run() {
    let cluster = Cluster::up(2, 2);
    succeeded("the uninterrupted run", Job::start(&run(&cluster, "whole", &[]), 60).finish(LIMIT));
    let mut args = vec!["--max-restarts".to_string(), "1".into()];
    args.extend(run(&cluster, "restarted", &[]));
    let mut job = Job::start(&args, 60);
    // Kill rank 2 mid-run: after step 20 is logged, the checkpoint of step
    // 10 is on disk (the one of step 20 may be too).
    assert!(job.wait_for("step    20 |", LIMIT), "the run did not get going:\n{}", job.output());
    let pid = cluster.rank_pid(2, 2).expect("rank 2 runs on node 2");
    _ = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status();
    let ended = succeeded("the job with --max-restarts 1", job.finish(LIMIT));
    let why =
        format!("mpirun noticed that process rank 2 with PID {pid} on node 10.77.0.2 exited on signal 9");
    let restart = ended.output.lines().find(|line| line.contains("restart 1 of 1")).unwrap_or_default();
    assert!(restart.contains(&why), "the restart should say why ({why:?}):\n{}", ended.output);
    let (after, ran) = resumed_steps(&ended.output);
    assert!(after >= 10 && after % 10 == 0 && after < STEPS, "resumed after step {after}:\n{}", ended.output);
    assert_eq!(ran, STEPS - after, "the restarted run ran other steps than those after its checkpoint");
    assert!(
        read(&cluster.disk(1).join("whole")) == read(&cluster.disk(1).join("restarted")),
        "the restarted job's final checkpoint differs from the uninterrupted run's"
    );
    println!("killed rank 2 after step 20 was logged; restarted after step {after}, ran {ran} steps, ended bitwise equal");
}

#[test]
fn a_resume_without_a_checkpoint_on_rank_0s_disk_fails_with_rank_0s_reason() {
    let cluster = Cluster::up(2, 2);
    // A checkpoint on node 2's disk only: rank 0, on node 1, cannot see it,
    // and the ranks on node 2 must not use it.
    succeeded("the run on 2 nodes", Job::start(&run(&cluster, "elsewhere", &[]), 60).finish(LIMIT));
    std::fs::rename(cluster.disk(1).join("elsewhere"), cluster.disk(2).join("elsewhere")).expect("a move");
    let ended = Job::start(&run(&cluster, "elsewhere", &["--resume"]), 60).finish(LIMIT);
    assert!(!ended.success, "a resume without rank 0's checkpoint should fail:\n{}", ended.output);
    let reason = format!("--resume: there is no checkpoint file at {LOCAL_DISK}/elsewhere");
    assert!(ended.output.contains(&reason), "the output should say {reason:?}:\n{}", ended.output);
    assert!(!ended.output.contains("timed out"), "a rank waited instead of failing:\n{}", ended.output);
}
