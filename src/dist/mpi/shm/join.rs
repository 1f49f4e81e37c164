//! How a process finds its node when the job
//! starts (`Node::join`), and the settings that decide whether the world's
//! all-reduces go through shared memory (`shm.rs`). Try it:
//! `cargo test --features mpi --test mpi shared_memory`.

use super::super::ffi::{self, Comm};
use super::Node;

/// What `DDP_MPI_SHM` lets the backend use: (shared memory at all, the
/// buffers of `alloc_buffer` in it). Unset, "on" or "1": both; "copy": the
/// window only, every tensor copied in and out (to measure what the
/// buffers save); "off" or "0": neither (messages: `ordered.rs`).
fn wanted_from_env() -> Result<(bool, bool), String> {
    match std::env::var("DDP_MPI_SHM").as_deref() {
        Err(_) | Ok("") | Ok("on") | Ok("1") => Ok((true, true)),
        Ok("copy") => Ok((true, false)),
        Ok("off") | Ok("0") => Ok((false, false)),
        Ok(other) => {
            Err(format!("DDP_MPI_SHM={other:?} is not \"on\", \"copy\" or \"off\"; fix it or unset it"))
        }
    }
}

/// `DDP_MPI_SHM_RANKS_PER_NODE`, a test hook: pretend that each machine is
/// several nodes of that many ranks (`tests/mpi/shared_memory.rs`).
fn pretend_node_size() -> Result<Option<usize>, String> {
    match std::env::var("DDP_MPI_SHM_RANKS_PER_NODE") {
        Err(_) => Ok(None),
        Ok(text) => match text.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(Some(n)),
            _ => Err(format!("DDP_MPI_SHM_RANKS_PER_NODE={text:?} is not a positive number of ranks")),
        },
    }
}

impl Node {
    /// Finds this process's node (collective over the world, once, when
    /// the job starts). `None`, on every rank alike, when the job must keep
    /// messages (`ordered.rs`): `DDP_MPI_SHM=off` on some rank, or a node
    /// whose ranks are not consecutive (`mpirun --map-by node`), where the
    /// sum could not stay in rank order.
    pub fn join(world: Comm, world_rank: usize, world_size: usize) -> Result<Option<Node>, String> {
        let (wanted, buffers) = wanted_from_env()?;
        let mut comm = ffi::node_of(world, world_rank)?;
        if let Some(per_node) = pretend_node_size()? {
            // Tests only: cut this machine into nodes of `per_node` ranks, so
            // that the path across nodes runs without a second machine.
            let (rank, _) = ffi::rank_and_size(comm)?;
            comm = ffi::split_by(comm, rank / per_node, world_rank)?;
        }
        let (rank, size) = ffi::rank_and_size(comm)?;
        let members = ffi::all_gather_blocking(comm, world_rank as i64, size)?;
        let consecutive = members.iter().enumerate().all(|(k, &r)| r == members[0] + k as i64);
        if ffi::min_blocking(world, i64::from(wanted && consecutive))? == 0 {
            return Ok(None);
        }
        let spread = size < world_size; // the same answer on every rank
        let leaders = match spread {
            false => None,
            true => match ffi::split(world, (rank == 0).then_some(world_rank))? {
                Some(leaders) => {
                    let (index, nodes) = ffi::rank_and_size(leaders)?;
                    Some((leaders, index, nodes))
                }
                None => None,
            },
        };
        let first = members[0] == 0;
        Ok(Some(Node {
            comm,
            rank,
            size,
            world_rank,
            first,
            leaders,
            spread,
            window: None,
            capacity: 0,
            buffers,
            regions: vec![],
            busy: false,
        }))
    }
}
