//! Scripts/nodes.sh itself. The nodes add
//! nothing to this machine's own network, their links are capped as asked,
//! a leftover of a killed run does not get in the way of the next, and
//! without root it says what is missing. scripts/launch.sh refuses
//! --max-restarts for a program that writes no checkpoint.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::cluster::{nodes_sh, repo, Cluster};

/// `ip ARGS` in this machine's own network namespace.
fn here(args: &[&str]) -> String {
    let output = Command::new("ip").args(args).output().expect("ip runs");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn the_nodes_add_nothing_to_this_machines_network_and_have_only_their_subnet() {
    let (links, addresses, routes) = (here(&["-br", "link"]), here(&["-br", "addr"]), here(&["route"]));
    let cluster = Cluster::up(2, 1);
    assert_eq!(here(&["-br", "link"]), links, "scripts/nodes.sh up added or changed an interface here");
    assert_eq!(here(&["-br", "addr"]), addresses, "scripts/nodes.sh up added or changed an address here");
    assert_eq!(here(&["route"]), routes, "scripts/nodes.sh up added or changed a route here");
    for node in [1, 2] {
        let inside = nodes_sh(&["exec", &format!("node{node}"), "ip", "-br", "addr"]);
        let addresses: Vec<&str> = inside.split_whitespace().filter(|word| word.contains('/')).collect();
        assert_eq!(addresses, ["127.0.0.1/8", &format!("10.77.0.{node}/24")], "node {node}:\n{inside}");
        let hostname = nodes_sh(&["exec", &format!("node{node}"), "hostname"]);
        assert_eq!(hostname.trim(), format!("ddpwb-test-node{node}"), "each node has its own hostname");
    }
    drop(cluster);
    assert_eq!(here(&["-br", "link"]), links, "scripts/nodes.sh down left an interface here");
}

#[test]
fn every_link_is_capped_at_the_rate_asked_for_at_both_ends() {
    let _cluster = Cluster::up(2, 1);
    nodes_sh(&["rate", "1gbit"]);
    for node in [1, 2] {
        let out_of_node = nodes_sh(&["exec", &format!("node{node}"), "tc", "qdisc", "show", "dev", "eth0"]);
        assert!(
            out_of_node.contains("tbf") && out_of_node.contains("rate 1Gbit"),
            "node {node}: {out_of_node}"
        );
    }
    let into_nodes =
        Command::new("ip").args(["netns", "exec", "ddpwb-test-hub", "tc", "qdisc", "show"]).output();
    let into_nodes = String::from_utf8_lossy(&into_nodes.expect("tc runs").stdout).into_owned();
    assert_eq!(into_nodes.matches("rate 1Gbit").count(), 2, "the bridge's ends of the links:\n{into_nodes}");
    nodes_sh(&["rate", "none"]);
    let uncapped = nodes_sh(&["exec", "node1", "tc", "qdisc", "show", "dev", "eth0"]);
    assert!(!uncapped.contains("tbf"), "rate none left a cap: {uncapped}");
}

#[test]
fn a_leftover_cluster_with_a_process_on_it_does_not_stop_the_next_up() {
    let cluster = Cluster::up(2, 1);
    // What a killed test run leaves: its nodes, and a process on one.
    let mut stray = Command::new("bash")
        .arg(repo().join("scripts/nodes.sh"))
        .args(["exec", "--name", "test", "node2", "sleep", "600"])
        .stdin(Stdio::null())
        .spawn()
        .expect("a process on node 2");
    let until = Instant::now() + Duration::from_secs(60);
    while cluster.processes(2).is_empty() {
        // A stray that failed to start would otherwise be waited for forever.
        let ended = stray.try_wait().expect("waiting for the stray process");
        assert!(ended.is_none(), "scripts/nodes.sh exec node2 sleep 600 ended at once ({ended:?})");
        assert!(Instant::now() < until, "the stray process did not appear on node 2 within 60 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    nodes_sh(&["up", "--nodes", "2", "--slots", "1"]);
    assert!(cluster.processes(2).is_empty(), "the leftover process still runs on the new node 2");
    let status = stray.wait().expect("the stray process ends");
    assert!(!status.success(), "the leftover process should have been killed, not finished");
}

#[test]
fn without_root_nodes_sh_says_so_and_makes_nothing() {
    let output = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "bash"])
        .arg(repo().join("scripts/nodes.sh"))
        .arg("check")
        .output()
        .expect("setpriv (util-linux) runs");
    let said = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "check as nobody: {said}");
    assert!(said.contains("cannot make nodes here: needs root"), "check as nobody said: {said}");
}

#[test]
fn launch_sh_refuses_max_restarts_for_a_program_without_checkpoints() {
    let output = Command::new("bash")
        .arg(repo().join("scripts/launch.sh"))
        .args(["--max-restarts", "2", "-np", "2", "true"])
        .output()
        .expect("bash runs scripts/launch.sh");
    let said = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{said}");
    assert!(said.contains("--max-restarts resumes from the program's checkpoint"), "{said}");
}
