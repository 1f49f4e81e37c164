//! `bench_collectives --backend mpi`,
//! the MPI backend's all_reduce next to a memcpy of the same tensor. The
//! benchmark starts itself twice under scripts/launch.sh (mpirun): once
//! through the node's shared memory (src/dist/mpi/shm.rs, the default) and
//! once with `DDP_MPI_SHM=off` (messages in rank order,
//! src/dist/mpi/ordered.rs), and prints one Markdown table of both, with
//! its machine, load and date. Through
//! shared memory it times two tensors: a plain one (copied into the window
//! and back) and a buffer from `alloc_buffer`, as DDP's buckets get, summed
//! where it lies (src/dist/mpi/shm/regions.rs).
//!
//! Run: cargo run --release --features mpi --example bench_collectives -- --backend mpi
//!      cargo run --release --features mpi --example bench_collectives -- --backend mpi \
//!          --np 2 --sizes-mib 4,25 --rounds 30
//! The table chapter 9 includes:
//!      cargo run --release --features mpi --example bench_collectives -- --backend mpi \
//!          --table chapters/tables/mpi-all-reduce.md
//!
//! Included by examples/bench_collectives.rs (`#[path]`); without the `mpi`
//! feature, `--backend mpi` says how to build it.

/// Set in the ranks the benchmark starts: "time, don't launch".
#[cfg(feature = "mpi")]
const RANK_MARKER: &str = "DDP_BENCH_MPI_RANK";

/// `Some(exit code)` when the command line asks for `--backend mpi`: the
/// benchmark ran (or could not); `None` leaves the in-process benchmark to run.
pub fn main_if_asked() -> Option<i32> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let at = args.windows(2).position(|pair| pair[0] == "--backend" && pair[1] == "mpi")?;
    let rest: Vec<String> = args[..at].iter().chain(&args[at + 2..]).cloned().collect();
    Some(match run(&rest) {
        Ok(()) => 0,
        Err(error) => {
            eprintln!("error: {error:#}");
            1
        }
    })
}

#[cfg(not(feature = "mpi"))]
fn run(_: &[String]) -> anyhow::Result<()> {
    anyhow::bail!(
        "--backend mpi needs the `mpi` feature: cargo run --release --features mpi --example \
         bench_collectives -- --backend mpi"
    )
}

#[cfg(feature = "mpi")]
pub use with_mpi::run;

#[cfg(feature = "mpi")]
mod with_mpi {
    use std::process::Command;
    use std::time::{Duration, Instant};

    use clap::Parser;
    use ddp_workbook::dist::{self, ReduceOp};
    use ddp_workbook::tch::{self, Device, Kind, Tensor};

    use super::RANK_MARKER;

    #[derive(Parser)]
    #[command(about = "Time the MPI backend's all_reduce against a memcpy of the same size")]
    struct Args {
        /// Processes (ranks), started by scripts/launch.sh.
        #[arg(long, default_value_t = 2)]
        np: usize,
        /// Tensor sizes in MiB of f32, comma-separated.
        #[arg(long, value_delimiter = ',', default_values_t = [4.0, 25.0])]
        sizes_mib: Vec<f64>,
        /// Timed rounds per size (the median of the slowest rank is reported).
        #[arg(long, default_value_t = 30)]
        rounds: usize,
        /// Untimed rounds before them.
        #[arg(long, default_value_t = 5)]
        warmup: usize,
        /// Also write the table, with its machine, load, date and command, to
        /// this file (relative to the repository): chapter 9 includes
        /// chapters/tables/mpi-all-reduce.md.
        #[arg(long)]
        table: Option<String>,
    }

    pub fn run(rest: &[String]) -> anyhow::Result<()> {
        let args = Args::try_parse_from(
            std::iter::once("bench_collectives --backend mpi".into()).chain(rest.iter().cloned()),
        )?;
        anyhow::ensure!(args.np > 0 && args.rounds > 0, "--np and --rounds must be at least 1");
        if std::env::var_os(RANK_MARKER).is_some() {
            dist::mpi::run(|pg| time_on_ranks(pg, &args));
            return Ok(());
        }
        let run = crate::table_file::Run::start();
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
        let debug = std::env::var("DDP_DEBUG").unwrap_or_else(|_| "unset (signatures on)".into());
        let settings = vec![
            format!("MPI all_reduce (sum, f32) on {} processes, {cores} cores, DDP_DEBUG {debug}", args.np),
            format!("{} warm-up + {} timed rounds; the median of the slowest rank", args.warmup, args.rounds),
        ];
        let mut body = String::from(
            "| size | path | all_reduce ms | algbw GB/s | memcpy ms | memcpy GB/s | all_reduce / memcpy bandwidth |\n\
             | ---: | :--- | ---: | ---: | ---: | ---: | ---: |\n",
        );
        for (path, shm) in [("shared memory", "on"), ("messages in rank order (DDP_MPI_SHM=off)", "off")] {
            let exe = std::env::current_exe()?;
            let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/launch.sh");
            // The ranks print their rows; this process gathers them into one table.
            let output = Command::new("bash")
                .arg(script)
                .args(["-np", &args.np.to_string()])
                .arg(exe)
                .args(["--backend", "mpi"])
                .args(rest)
                .env(RANK_MARKER, path)
                .env("DDP_MPI_SHM", shm)
                .stderr(std::process::Stdio::inherit())
                .output()?;
            let printed = String::from_utf8_lossy(&output.stdout);
            anyhow::ensure!(
                output.status.success(),
                "the {path} run under scripts/launch.sh failed: {}\n{printed}",
                output.status
            );
            body.extend(
                printed.lines().filter(|line| line.starts_with("| ")).map(|line| format!("{line}\n")),
            );
        }
        let command =
            crate::table_file::command_line("cargo run --release --features mpi --example bench_collectives");
        let text = format!("{body}\n{}", run.caption(&settings, &command));
        println!("{text}");
        if let Some(path) = &args.table {
            println!("wrote {}", crate::table_file::write_table(path, &command, &text)?.display());
        }
        Ok(())
    }

    /// One rank: for each size, time `rounds` all_reduces after a barrier
    /// each; rank 0 also times a memcpy and prints the row.
    fn time_on_ranks(pg: dist::Group, args: &Args) -> anyhow::Result<()> {
        tch::set_num_threads(1); // one core per rank, as the training run on MPI
        let path = std::env::var(RANK_MARKER).unwrap_or_default();
        let shm = std::env::var("DDP_MPI_SHM").as_deref() != Ok("off");
        let before = (dist::mpi::shared_memory_all_reduces(), dist::mpi::zero_copy_all_reduces());
        let tensors: &[(&str, bool)] = match shm {
            true => &[("plain tensor, copied", false), ("alloc_buffer, in place", true)],
            false => &[("plain tensor", false)],
        };
        for (&mib, &(tensor, shared)) in
            args.sizes_mib.iter().flat_map(|m| tensors.iter().map(move |t| (m, t)))
        {
            let numel = (mib * 1024.0 * 1024.0 / 4.0) as i64;
            anyhow::ensure!(numel > 0, "every size must hold at least one f32");
            let mut t = match shared {
                true => pg.alloc_buffer(numel as usize, Kind::Float, Device::Cpu)?,
                false => Tensor::zeros([numel], (Kind::Float, Device::Cpu)),
            };
            let mut times = Vec::with_capacity(args.rounds);
            for round in 0..args.warmup + args.rounds {
                _ = t.fill_(1.0);
                pg.barrier()?;
                let started = Instant::now();
                pg.all_reduce(&mut t, ReduceOp::Sum)?;
                if round >= args.warmup {
                    times.push(started.elapsed().as_secs_f64());
                }
            }
            anyhow::ensure!(t.double_value(&[0]) == pg.world_size() as f64, "the sum is wrong: {t:?}");
            // The slowest rank's time of each round.
            let mut slowest = Tensor::from_slice(&times);
            pg.all_reduce(&mut slowest, ReduceOp::Max)?;
            if pg.rank() == 0 {
                let reduce = median(Vec::<f64>::try_from(&slowest)?);
                let copy = crate::memcpy_time(numel, args.warmup, args.rounds).as_secs_f64();
                let gbps = |secs: f64| (numel * 4) as f64 / secs / 1e9;
                println!(
                    "| {mib} MiB | {path}: {tensor} | {:.3} | {:.2} | {:.3} | {:.2} | {:.2}x |",
                    reduce * 1e3,
                    gbps(reduce),
                    copy * 1e3,
                    gbps(copy),
                    gbps(reduce) / gbps(copy)
                );
            }
        }
        let through = dist::mpi::shared_memory_all_reduces() - before.0;
        let in_place = dist::mpi::zero_copy_all_reduces() - before.1;
        let wanted = shm && pg.world_size() > 1;
        anyhow::ensure!(
            (through > 0) == shm && (in_place > 0) == wanted,
            "{through} all_reduces went through the window and {in_place} in place on the {path} run"
        );
        Ok(())
    }

    /// The benchmarks' one median (`support/median.rs`), of times in seconds.
    fn median(times: Vec<f64>) -> f64 {
        crate::median::median(times.into_iter().map(Duration::from_secs_f64).collect()).as_secs_f64()
    }
}
