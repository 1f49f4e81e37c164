//! The MPI backend on real processes: each test starts an `mpirun` job of
//! 2 to 4 processes (through scripts/launch.sh) that runs the test's body
//! as its ranks. Proves that every collective agrees with the in-process
//! backend, that an all-reduce through shared memory is the rank-order sum
//! one process computes (and, for buffers from `alloc_buffer`, without a
//! copy), that reductions over messages keep that order too, that a
//! message of more than 2^31 - 1 bytes arrives whole, that the chapters'
//! DDP (your exercises included) gives the same steps as one process on
//! the global batch, that the training run resumes bitwise after a kill,
//! that no failure leaves the job hanging, and that neither a process
//! holding mpirun's stderr nor the shared memory of killed jobs outlasts
//! the launcher or the next job.
//!
//! Run:   cargo test --features mpi --test mpi
//! Needs: Open MPI (scripts/setup.sh installs it).

mod common;

#[path = "mpi/harness.rs"]
mod harness;

#[path = "mpi/bf16.rs"]
mod bf16;
#[path = "mpi/chapters.rs"]
mod chapters;
#[path = "mpi/collectives.rs"]
mod collectives;
#[path = "mpi/failures.rs"]
mod failures;
#[path = "mpi/fsdp.rs"]
mod fsdp;
#[path = "mpi/large.rs"]
mod large;
#[path = "mpi/launcher.rs"]
mod launcher;
#[path = "mpi/leftovers.rs"]
mod leftovers;
#[path = "mpi/ordered.rs"]
mod ordered;
#[path = "mpi/shared_memory.rs"]
mod shared_memory;
#[path = "mpi/training.rs"]
mod training;
#[path = "mpi/zero2.rs"]
mod zero2;
#[path = "mpi/zero_copy.rs"]
mod zero_copy;
