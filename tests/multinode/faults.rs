//! A failure on the second node ends the whole
//! job across both, names the rank(s) at fault, and leaves no process of
//! the job on either node (Open MPI's daemons and the deadline end them:
//! scripts/launch.sh's sweep, which would kill leftovers and say so, must
//! find nothing). A rank killed with SIGKILL ends the job at once; a link
//! taken down mid-run ends it at the deadline, naming the silent ranks.
//! The bounds on the time are there to catch hangs: the time it took is
//! printed.

use std::time::Duration;

use crate::cluster::{on_cluster, Cluster, Ended, Job};

/// The workbook's deadline for these jobs (DDP_TIMEOUT_SECS).
const DEADLINE: Duration = Duration::from_secs(10);
/// A run far longer than the tests wait: it must be ended by the fault.
const LONG_RUN: &[&str] =
    &["--backend", "mpi", "--batch-size", "8", "--threads", "1", "--steps", "100000", "--log-every", "10"];
/// Until the run has logged its first steps, the fault is not mid-run.
const RUNNING: &str = "step    20 |";

/// No process is left on any node, and the launcher had none to kill.
fn assert_nothing_left(cluster: &Cluster, ended: &Ended) {
    for node in [1, 2] {
        let left = cluster.processes(node);
        assert!(left.is_empty(), "processes left on node {node}: {left:?}; output:\n{}", ended.output);
    }
    assert!(
        !ended.output.contains("still ran 10 s after mpirun ended"),
        "the job's processes did not end by themselves; launch.sh killed them:\n{}",
        ended.output
    );
}

#[test]
fn a_rank_killed_on_the_second_node_ends_the_job_at_once_naming_it() {
    let cluster = Cluster::up(2, 2);
    let mut job = Job::start(&on_cluster(&cluster, 4, LONG_RUN), DEADLINE.as_secs());
    assert!(job.wait_for(RUNNING, Duration::from_secs(120)), "the run did not start:\n{}", job.output());
    let pid = cluster.rank_pid(2, 3).expect("rank 3 runs on node 2");
    _ = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status();
    let killed_at = std::time::Instant::now();
    let ended = job.finish(Duration::from_secs(600));
    let after_kill = killed_at.elapsed();
    assert!(!ended.success, "the job should have failed:\n{}", ended.output);
    let named = format!("process rank 3 with PID {pid} on node 10.77.0.2 exited on signal 9");
    assert!(ended.output.contains(&named), "the output should say {named:?}:\n{}", ended.output);
    assert!(after_kill < DEADLINE, "the job took {after_kill:?} after the kill to end:\n{}", ended.output);
    assert_nothing_left(&cluster, &ended);
    println!("killed rank 3 on node 2: the job ended {:.1} s later", after_kill.as_secs_f64());
}

#[test]
fn a_link_taken_down_mid_run_ends_the_job_at_the_deadline_naming_the_silent_ranks() {
    let cluster = Cluster::up(2, 2);
    let mut job = Job::start(&on_cluster(&cluster, 4, LONG_RUN), DEADLINE.as_secs());
    assert!(job.wait_for(RUNNING, Duration::from_secs(120)), "the run did not start:\n{}", job.output());
    crate::cluster::nodes_sh(&["link", "node2", "down"]);
    let cut_at = std::time::Instant::now();
    let ended = job.finish(Duration::from_secs(600));
    let after_cut = cut_at.elapsed();
    assert!(!ended.success, "the job should have failed:\n{}", ended.output);
    // Each rank of node 1 that reports its timeout names the ranks it
    // waited for: those of node 2 whose part of the call had not arrived
    // when the cable went (one of them may have sent its part just before),
    // and sometimes the other rank of node 1, still stuck in the call
    // before, whose last bytes from node 2 never came.
    let silent: Vec<&str> = ended
        .output
        .lines()
        .filter(|line| line.starts_with("rank 0 of 4 failed") || line.starts_with("rank 1 of 4 failed"))
        .filter_map(|line| line.split("waiting for rank(s) [").nth(1)?.split(']').next())
        .collect();
    assert!(!silent.is_empty(), "no rank of node 1 named the ranks it waited for:\n{}", ended.output);
    for named in &silent {
        let ranks: Vec<&str> = named.split(", ").collect();
        assert!(
            ranks.iter().any(|r| ["2", "3"].contains(r))
                && ranks.iter().all(|r| ["0", "1", "2", "3"].contains(r)),
            "a timeout that names none of node 2's ranks 2 and 3 ([{named}]):\n{}",
            ended.output
        );
    }
    // A limit against hangs: the deadline, TCP giving up on the silent node
    // (about 3 s with the nodes' tcp_retries2) and the launcher's checks.
    assert!(after_cut < DEADLINE * 3, "the job took {after_cut:?} after the cut to end:\n{}", ended.output);
    assert_nothing_left(&cluster, &ended);
    println!(
        "node 2's link down: the job ended {:.1} s later (deadline {} s)",
        after_cut.as_secs_f64(),
        DEADLINE.as_secs()
    );
}
