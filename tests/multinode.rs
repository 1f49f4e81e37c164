//! Jobs on several machines, made on this one. Each
//! test brings up nodes with scripts/nodes.sh (network namespaces joined by
//! a bridge, each with its own hostname, /dev/shm and disk) and starts the
//! training example on them with scripts/launch.sh, as on a cluster: Open
//! MPI reaches every node through an agent instead of ssh, and the ranks
//! talk over TCP between nodes. It proves that the run on 2 nodes x 2 ranks
//! reaches its target and ends bitwise as the run on one node; that a rank
//! killed, or a link cut, on the second node ends the whole job, naming the
//! ranks, with nothing left running; that a resume needs no shared disk;
//! and that `scripts/launch.sh --max-restarts` brings a killed job back to
//! the uninterrupted run's end.
//!
//! Run:   cargo test --features mpi --test multinode     (as root)
//! Needs: root, ip and tc (iproute2), unshare (util-linux), Open MPI. A
//! plain `cargo test` leaves it out (Cargo.toml: `test = false`); the
//! suite's `multinode` check runs it where `scripts/nodes.sh check` says
//! nodes can be made, and reports its tests skipped, with the reason,
//! elsewhere. One cluster at a time: the tests take turns.

#[path = "multinode/cluster.rs"]
mod cluster;

#[path = "multinode/faults.rs"]
mod faults;
#[path = "multinode/nodes.rs"]
mod nodes;
#[path = "multinode/resume.rs"]
mod resume;
#[path = "multinode/training.rs"]
mod training;
