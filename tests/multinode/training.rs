//! The training run on 2 nodes of 2 ranks
//! reaches its target, its replicas end bitwise equal, and it ends in the
//! same state, to the bit, as the same 4 ranks on one node: the MPI backend
//! sums the gradients in rank order on both (through shared memory on a
//! node, passing partial sums from node to node across them:
//! src/dist/mpi/shm.rs), so only the transport differs. And its gradients
//! really crossed the link.

use std::time::Duration;

use crate::cluster::{fingerprint, on_cluster, Cluster, Job};

/// The example's default run (600 steps, global batch 64) on 4 ranks:
/// micro-batches of 8, so the global batch stays 64; one libtorch thread
/// per rank on both runs (the thread count changes how sums round).
const RUN: &[&str] = &["--backend", "mpi", "--batch-size", "8", "--threads", "1", "--log-every", "100"];

#[test]
fn the_run_on_2_nodes_reaches_its_target_and_ends_as_the_run_on_one_node() {
    let cluster = Cluster::up(2, 2);
    let received_before = cluster.received_bytes(2);
    let across = Job::start(&on_cluster(&cluster, 4, RUN), 60).finish(Duration::from_secs(600));
    assert!(across.success, "the run on 2 nodes x 2 ranks failed or missed its target:\n{}", across.output);
    assert!(across.output.contains("PASS: reached"), "no PASS line:\n{}", across.output);
    let across_fingerprint = fingerprint(&across.output).expect("the replicas line");
    assert!(
        across.output.contains("replicas: bitwise equal on all 4 rank(s)"),
        "the 4 replicas did not end bitwise equal:\n{}",
        across.output
    );

    // Each step, node 2's ranks must at least receive node 1's share of the
    // gradients: one f32 per parameter (a ring or a tree, whatever MPI
    // picks, cannot do with less), 600 steps.
    let received = cluster.received_bytes(2) - received_before;
    let parameters: u64 = across
        .output
        .lines()
        .find_map(|line| line.strip_prefix("tiny GPT, ")?.split(' ').next()?.parse().ok())
        .expect("the run's `tiny GPT, N parameters` line");
    let at_least = 600 * parameters * 4;
    assert!(
        received >= at_least,
        "node 2 received {received} bytes over its link, fewer than the {at_least} its gradients need: \
         did the ranks talk through something else?"
    );

    // The same 4 ranks on one node (no host file: mpirun here, shared memory).
    let mut one_node: Vec<String> = vec!["-np".into(), "4".into(), cluster.train.display().to_string()];
    one_node.extend(RUN.iter().map(|s| s.to_string()));
    let here = Job::start(&one_node, 60).finish(Duration::from_secs(600));
    assert!(here.success, "the run on one node failed:\n{}", here.output);
    let here_fingerprint = fingerprint(&here.output).expect("the replicas line");
    assert_eq!(
        across_fingerprint, here_fingerprint,
        "2 nodes x 2 ranks ended in another state than 4 ranks on one node"
    );
    println!(
        "2 nodes x 2 ranks: {:.1} s, fingerprint {across_fingerprint}, {} MB over node 2's link; \
         4 ranks on one node: {:.1} s, the same fingerprint",
        across.elapsed.as_secs_f64(),
        received / 1_000_000,
        here.elapsed.as_secs_f64()
    );
}
