//! The second table of
//! examples/bench_vs_pytorch.rs: one all_reduce of 4 KiB, 0.4, 4 and 25 MiB
//! (sum, f32, 2 ranks) on each backend: in-process, MPI with the signature
//! check on and off (`DDP_DEBUG=off`) and on a buffer from `alloc_buffer`
//! (as DDP's buckets, summed in place in shared memory), and PyTorch's gloo
//! (scripts/bench_torch_allreduce.py). Included by bench_vs_pytorch.rs,
//! whose MPI workers time their side with `time_all_reduce`:
//! `cargo run --release --features mpi --example bench_vs_pytorch`.

use std::time::Instant;

use clap::Parser;
use ddp_workbook::dist::{spawn, ProcessGroup, ReduceOp};
use ddp_workbook::tch::{Device, Kind, Tensor};

use crate::commands::{lines_of, python, stdout_of};
use crate::{mpi_job, tables, Args};

/// The all_reduce sizes, in MiB: a tiny message (where a signature
/// exchange shows), a small bucket, a medium one, PyTorch's default cap.
pub const SIZES_MIB: [f64; 4] = [0.004, 0.4, 4.0, 25.0];
/// Timed all_reduces per size, after 5 untimed ones.
pub const ALL_REDUCE_ROUNDS: usize = 30;

/// Rank 0's median time of one all_reduce of `mib`, each after a barrier:
/// of a plain tensor, or (`shared`) of a buffer from `alloc_buffer`, as
/// DDP's buckets are made (on MPI, summed in place in shared memory).
pub fn time_all_reduce(pg: &dyn ProcessGroup, mib: f64, shared: bool) -> anyhow::Result<f64> {
    let numel = (mib * 1024.0 * 1024.0 / 4.0) as usize;
    let mut tensor = match shared {
        true => pg.alloc_buffer(numel, Kind::Float, Device::Cpu)?,
        false => Tensor::zeros([numel as i64], (Kind::Float, Device::Cpu)),
    };
    let _ = tensor.fill_(1.0);
    let mut times = vec![];
    for round in 0..ALL_REDUCE_ROUNDS + 5 {
        pg.barrier()?;
        let started = Instant::now();
        pg.all_reduce(&mut tensor, ReduceOp::Sum)?;
        if round >= 5 {
            times.push(started.elapsed().as_secs_f64());
        }
    }
    Ok(super::table_file::summary(&times).0)
}

/// One all_reduce per size on each backend: in-process, MPI (signature check
/// on and off, and in place) and gloo; the table as markdown.
pub fn all_reduce_rows() -> anyhow::Result<String> {
    let in_process = spawn(2, |pg| {
        SIZES_MIB.iter().map(|&mib| time_all_reduce(pg.as_ref(), mib, false)).collect::<Result<Vec<_>, _>>()
    })?;
    // Each MPI line: the size, a plain tensor's time, an alloc_buffer's.
    let on_mpi = |debug| -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
        let args = Args::parse_from(["bench_vs_pytorch", "--steps", "0"]);
        let lines = lines_of(&stdout_of(mpi_job("all-reduce", &args, debug)?)?, "allreduce")?;
        Ok((lines.iter().map(|v| v[1]).collect(), lines.iter().map(|v| v[2]).collect()))
    };
    let (mpi, mpi_in_place) = on_mpi("detail")?;
    let sizes: Vec<String> = SIZES_MIB.iter().map(f64::to_string).collect();
    let mut gloo_args = vec!["--sizes"];
    gloo_args.extend(sizes.iter().map(String::as_str));
    let gloo = stdout_of(python("scripts/bench_torch_allreduce.py", &gloo_args)?)?;
    let gloo = lines_of(&gloo, "allreduce")?.iter().map(|v| v[1]).collect();
    Ok(tables::all_reduce_table(
        &SIZES_MIB,
        &[
            ("in-process", in_process[0].clone()),
            ("MPI", mpi),
            ("MPI, DDP_DEBUG=off", on_mpi("off")?.0),
            ("MPI, alloc_buffer (DDP's buckets, in place)", mpi_in_place),
            ("gloo", gloo),
        ],
    ))
}
