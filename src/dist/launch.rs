//! What a launcher tells the processes it starts, read from the environment
//! the way torch.distributed reads it: this process's rank, the world size,
//! and its local rank (its index among the processes on this machine, which
//! picks its GPU). `torchrun` sets RANK, WORLD_SIZE, LOCAL_RANK and
//! LOCAL_WORLD_SIZE; Open MPI's `mpirun` sets OMPI_COMM_WORLD_RANK,
//! OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK and
//! OMPI_COMM_WORLD_LOCAL_SIZE; MPICH's sets PMI_RANK and PMI_SIZE.
//!
//! Try it: `scripts/launch.sh -np 2 target/release/examples/hello_ranks --backend mpi`.

use std::env;

/// Which launcher started this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    OpenMpi,
    Mpich,
    Torchrun,
}

/// One process's place in a launched job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchEnv {
    pub launcher: Launcher,
    pub rank: usize,
    pub world_size: usize,
    /// `None` where the launcher does not say (MPICH); the MPI backend asks
    /// MPI itself instead.
    pub local_rank: Option<usize>,
    pub local_world_size: Option<usize>,
}

impl LaunchEnv {
    /// The launcher's variables, `Ok(None)` when no launcher started this
    /// process, or an error naming a variable that is not a number or a
    /// rank outside the world.
    pub fn from_env() -> Result<Option<LaunchEnv>, String> {
        Self::from_lookup(|name| env::var(name).ok())
    }

    /// [`from_env`](Self::from_env) over any source of variables (tests).
    // ANCHOR: from_lookup
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Option<LaunchEnv>, String> {
        const SCHEMES: [(Launcher, [&str; 4]); 3] = [
            (
                Launcher::OpenMpi,
                [
                    "OMPI_COMM_WORLD_RANK",
                    "OMPI_COMM_WORLD_SIZE",
                    "OMPI_COMM_WORLD_LOCAL_RANK",
                    "OMPI_COMM_WORLD_LOCAL_SIZE",
                ],
            ),
            (Launcher::Mpich, ["PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"]),
            (Launcher::Torchrun, ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"]),
        ];
        let number = |name: &str| -> Result<Option<usize>, String> {
            match lookup(name) {
                None => Ok(None),
                Some(text) => text.trim().parse().map(Some).map_err(|_| {
                    format!("{name}={text:?} is not a whole number: is the launcher's environment intact?")
                }),
            }
        };
        for (launcher, [rank, size, local_rank, local_size]) in SCHEMES {
            let (Some(r), Some(n)) = (number(rank)?, number(size)?) else { continue };
            if r >= n {
                return Err(format!("{rank}={r} is not a rank of a world of {size}={n}"));
            }
            let (local_rank, local_world_size) = (number(local_rank)?, number(local_size)?);
            return Ok(Some(LaunchEnv { launcher, rank: r, world_size: n, local_rank, local_world_size }));
        }
        Ok(None)
    }
    // ANCHOR_END: from_lookup
}
