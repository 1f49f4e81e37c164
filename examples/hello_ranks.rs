//! Four ranks meet in three collectives. Run it: cargo run --example hello_ranks
//! As processes (chapter 9): cargo build --features mpi --example hello_ranks &&
//!     scripts/launch.sh -np 4 target/debug/examples/hello_ranks --backend mpi
//!
//! The smallest program on chapter 1's process-group layer. `spawn` starts
//! the ranks, each a thread of this process, and hands each one its own
//! handle on the group; every rank runs
//! the same function, makes the same calls in the same order, and returns a
//! value; `spawn` waits for all of them and returns those values in rank
//! order. The ranks print as they finish, so their lines may come out in any
//! order; the list that `spawn` returns is always in rank order.

use std::process::ExitCode;

use ddp_workbook::dist::{spawn, torch_error, DistError, ProcessGroup, ReduceOp};
use ddp_workbook::tch::Tensor;

const WORLD_SIZE: usize = 4;

// ANCHOR: rank
/// What every rank runs, with its own `pg`. Returns the all-reduced sum.
fn hello(pg: &dyn ProcessGroup) -> Result<f64, DistError> {
    let rank = pg.rank();

    // All-reduce: every rank puts in rank + 1, every rank gets the sum back.
    let mut sum = Tensor::from((rank + 1) as f64); // []
    pg.all_reduce(&mut sum, ReduceOp::Sum)?;
    let sum = sum.double_value(&[]);

    // Broadcast: every rank holds a tensor of the same shape; afterwards all
    // of them hold rank 0's values.
    let base = 10.0 * rank as f32;
    let mut message = Tensor::from_slice(&[base + 1.0, base + 2.0, base + 3.0]); // [3]
    let before = Vec::<f32>::try_from(&message).map_err(torch_error(pg, "reading the tensor"))?;
    pg.broadcast(&mut message, 0)?;
    let after = Vec::<f32>::try_from(&message).map_err(torch_error(pg, "reading the tensor"))?;

    // All-gather: every rank's tensor, in rank order, on every rank.
    let gathered = pg.all_gather(&Tensor::from(rank as i64 * rank as i64))?; // world_size x []
    let squares: Vec<i64> = gathered.iter().map(|t| t.int64_value(&[])).collect();

    println!("rank {rank}: all_reduce {sum}, broadcast {before:?} -> {after:?}, all_gather {squares:?}");
    Ok(sum)
}
// ANCHOR_END: rank

// ANCHOR: spawn
fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        [] | ["--backend", "in-process"] => threads(),
        ["--backend", "mpi"] => processes(),
        _ => {
            eprintln!("usage: hello_ranks [--backend in-process|mpi]");
            ExitCode::from(2)
        }
    }
}

/// The in-process backend: `spawn` starts the ranks as threads.
fn threads() -> ExitCode {
    // One thread per rank. Each gets a `Group` (an `Arc<dyn ProcessGroup>`);
    // `as_ref()` lends it as the `&dyn ProcessGroup` that `hello` takes.
    match spawn(WORLD_SIZE, |pg| Ok(hello(pg.as_ref())?)) {
        Ok(sums) => {
            println!("spawn returned {sums:?}: one result per rank, in rank order");
            ExitCode::SUCCESS
        }
        Err(error) => {
            // Names the rank that failed first, and what it failed with.
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}
// ANCHOR_END: spawn

// ANCHOR: processes
/// The MPI backend: the launcher started this process as one rank of the
/// job; `run` joins it and hands `hello` this process's group.
#[cfg(feature = "mpi")]
fn processes() -> ExitCode {
    let sum = ddp_workbook::dist::mpi::run(|pg| Ok(hello(pg.as_ref())?));
    println!("rank's result: {sum}");
    ExitCode::SUCCESS
}
// ANCHOR_END: processes

#[cfg(not(feature = "mpi"))]
fn processes() -> ExitCode {
    eprintln!("this build has no MPI backend: build with `--features mpi` (see scripts/setup.sh)");
    ExitCode::from(2)
}
