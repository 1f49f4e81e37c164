//! The workbook's training run against PyTorch's at the sizes people
//! train: the GPT of about 0.1M (the tiny one), 2M, 10M and 25M parameters
//! (`GptConfig::of_size`, the same models as scripts/torch/models.py's
//! SIZES), with plain DDP, ZeRO-1, ZeRO-2 and FSDP, in alternating rounds. Each round
//! runs, at every size: PyTorch's DDP on gloo at its defaults and at its
//! best CPU settings, PyTorch in one process without DDP (default and fused
//! AdamW: the 1-rank baselines), PyTorch's ZeroRedundancyOptimizer inside
//! DDP (defaults and best), ours with DDP as 2 MPI processes, as 2 rank
//! threads and on 1 rank, and ours with ZeRO-1 (`ShardedAdamW`, the
//! training run's `--zero 1`) as 2 MPI processes and 2 rank threads, then
//! PyTorch's FSDP2 (`fully_shard` per transformer block and at the root,
//! SHARD_GRAD_OP and FULL_SHARD, fused AdamW) against ours with
//! `--shard grad-op` (ZeRO-2) and `--shard full` (FSDP), each as 2 MPI
//! processes and 2 rank threads. The
//! same work as bench_vs_pytorch: 16 sequences per rank per micro-batch, 2
//! micro-batches per step, AdamW, one libtorch thread per rank; every run is
//! a process of its own, so that its peak resident memory (VmHWM) is its
//! own.
//!
//! For each: tokens/s (median, min, max over the rounds), the cost of
//! distribution (a 2-rank step minus a 1-rank step on the same per-rank
//! work), the peak resident memory per rank (the largest rank's VmHWM; for
//! rank threads the one process's, which holds both ranks), and the bytes
//! each rank puts on the wire per step (ours counted by
//! support/wire_bytes.rs around the MPI run's group; PyTorch's by
//! `scripts/bench_torch_ddp.py --count-bytes` in a short run of its own).
//! Then the targets: ours at least 1.3x PyTorch's tokens/s, our cost of
//! distribution at most half of PyTorch's, our peak memory per rank at most
//! PyTorch's, each strategy against its PyTorch counterpart at its best
//! settings, with the ratio and by how much a missed one misses; and FSDP's
//! own: our FSDP's peak memory per rank on 2 ranks at most 0.6x our DDP's
//! (the one that counts is at 25M parameters, where the model's state, not
//! the libraries, fills the memory). With
//! `--table FILE` (a file under chapters/tables/ for the book) it writes the
//! tables there, with the machine, its load, the date and the command.
//!
//! With `--data FILE` it writes every run's numbers, which the figure
//! (`cargo run --example figures -- --only ch99`) draws.
//!
//! Run: cargo run --release --features mpi --example bench_sizes -- --table FILE --data FILE
//!      cargo run --release --features mpi --example bench_sizes -- --rounds 1 --steps 3 --sizes tiny,2m
//! (3 rounds at the steps of `steps_of`, 17 runs per size per round, each
//! under a minute: 96 minutes on the 2-core machine of the committed table,
//! at real-time priority (`chrt -r 1`), most of it at 10M and 25M
//! parameters; the check takes about 12 minutes, `--profile` about 2.)

use std::fmt::Write;
use std::process::Command;

use anyhow::Context;
use clap::Parser;
use ddp_workbook::models::{GptConfig, GptSize};
use ddp_workbook::train::{self, ShardingStrategy, TrainConfig};

#[path = "support/bench_commands.rs"]
mod commands;
#[path = "support/machine.rs"]
mod machine;
#[path = "support/table_file.rs"]
mod table_file;
#[path = "support/vs_pytorch_tables.rs"]
mod tables;
#[path = "support/train_rates.rs"]
mod train_rates;
#[cfg_attr(not(feature = "mpi"), allow(dead_code))] // it counts the MPI runs' bytes
#[path = "support/wire_bytes.rs"]
mod wire_bytes;
use commands::{lines_of, python, root};
use machine::load_average;
use table_file::{summary, thousands};
use tables::{Column, Rate};
use train_rates::{logged, rate_of, timed_rate};

#[derive(Parser)]
#[command(about = "The training run against PyTorch's at 0.1M to 25M parameters: DDP, ZeRO-1, ZeRO-2, FSDP")]
pub struct Args {
    /// Rounds; each runs every contender once at every size.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// The sizes to run, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = GptSize::ALL)]
    sizes: Vec<GptSize>,
    /// Timed optimizer steps per run, at every size [default: each size's own, see steps_of].
    #[arg(long)]
    steps: Option<usize>,
    /// Untimed steps before them [default: each size's own].
    #[arg(long)]
    warmup_steps: Option<usize>,
    /// Write the tables to this file (relative to the repository), with the
    /// machine, its load and this command; without it they are only printed.
    #[arg(long)]
    table: Option<String>,
    /// Write every run's numbers to this data file (relative to the
    /// repository) for the figure, rewritten after each size's round, so
    /// that a run stopped early keeps what it measured.
    #[arg(long)]
    data: Option<String>,
    /// Instead of the head-to-head: where one rank's step goes, ours (the
    /// training run's phases) against PyTorch's (one process, fused AdamW,
    /// `--phases`), at each size; the measured reason behind a missed
    /// speed target. With --table it writes that table.
    #[arg(long)]
    profile: bool,
    /// Set by this program when it starts itself to run one of ours.
    #[arg(long, value_enum, hide = true)]
    worker: Option<Worker>,
    #[arg(long, hide = true, default_value_t = GptSize::Tiny)]
    size: GptSize,
    /// The ZeRO stage of one of ours: 0 DDP, 1 `--shard optimizer`, 2 grad-op, 3 full.
    #[arg(long, hide = true, default_value_t = 0)]
    zero: usize,
    #[arg(long, hide = true, default_value_t = 1)]
    world_size: usize,
}

/// How one of our runs is started: 2 MPI processes (under scripts/launch.sh)
/// or rank threads in one process.
#[derive(clap::ValueEnum, Clone, Copy, PartialEq)]
enum Worker {
    Mpi,
    Threads,
}

const COMMAND: &str = "cargo run --release --features mpi --example bench_sizes";

/// Timed and untimed steps per run at `size`: enough timed steps for a
/// steady rate, few enough that each run (the 2-rank ones on 2 cores) stays
/// under a minute on this 2-core machine; the step time grows with the
/// parameters (about 6 x parameters x 1,024 tokens of work per rank).
fn steps_of(size: GptSize) -> (usize, usize) {
    match size {
        GptSize::Tiny => (200, 20),
        GptSize::M2 => (80, 5),
        GptSize::M10 => (20, 3),
        GptSize::M25 => (8, 2),
    }
}

/// One run's settings: the size, its step counts (the flags override).
#[derive(Clone, Copy)]
struct Plan {
    size: GptSize,
    steps: usize,
    warmup: usize,
}

impl Plan {
    fn of(size: GptSize, args: &Args) -> Plan {
        let (steps, warmup) = steps_of(size);
        Plan { size, steps: args.steps.unwrap_or(steps), warmup: args.warmup_steps.unwrap_or(warmup) }
    }
}

/// The training run's settings for one of our runs; it logs every warm-up's
/// worth of steps, so that the first log closes the untimed window. The
/// held-out set is one micro-batch: at 25M parameters the default 2,000
/// sequences would take longer to evaluate than the run takes to train.
fn config(plan: Plan, world_size: usize, zero_stage: usize) -> TrainConfig {
    TrainConfig {
        world_size,
        steps: plan.warmup + plan.steps,
        log_every: plan.warmup,
        threads_per_rank: Some(1),
        shard: ShardingStrategy::from_zero_stage(zero_stage).expect("CONTENDERS name stages 0 to 3"),
        model: plan.size,
        eval_sequences: 16,
        ..TrainConfig::default()
    }
}

/// This process's VmHWM in KiB: the most resident memory it has held.
fn peak_rss_kib() -> anyhow::Result<f64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"));
    let kib = line.and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse().ok());
    kib.ok_or_else(|| anyhow::anyhow!("no VmHWM in /proc/self/status: this benchmark needs Linux"))
}

/// Started by the coordinator: one of our runs, printing its rate, peak
/// memory and (under MPI) bytes on the wire per timed step.
fn worker(kind: Worker, args: &Args) -> anyhow::Result<()> {
    let (steps, warmup) = (args.steps.unwrap_or(1), args.warmup_steps.unwrap_or(1));
    let plan = Plan { size: args.size, steps, warmup };
    ddp_workbook::tch::set_num_threads(1);
    if kind == Worker::Threads {
        let config = config(plan, args.world_size, args.zero);
        let mut phases = None;
        let logs = logged(&|_| {}, |on_event| {
            phases = Some(train::train(&config, on_event)?.swap_remove(0).phases);
            Ok(())
        })?;
        let rate = timed_rate(&logs, &config)?;
        println!("tokens_per_second {}\nstep_ms {}", rate.tokens_per_second, rate.step_ms);
        println!("peak_rss_kib {}", peak_rss_kib()?);
        // Rank 0's phases summed over every step, warm-up included (--profile takes differences).
        let p = phases.expect("the run returned");
        let times = [p.data, p.forward, p.backward + p.sync, p.optimizer];
        for (phase, time) in PHASES.iter().zip(times) {
            println!("phase_sum_ms {phase} {}", time.as_secs_f64() * 1e3);
        }
        return Ok(());
    }
    mpi_worker(plan, args.zero)
}

#[cfg(feature = "mpi")]
fn mpi_worker(plan: Plan, zero: usize) -> anyhow::Result<()> {
    use ddp_workbook::dist::ReduceOp;
    use ddp_workbook::tch::{Kind, Tensor};
    use ddp_workbook::train::Event;
    use std::sync::Mutex;
    ddp_workbook::dist::mpi::run(|pg| {
        let (pg, wire) = wire_bytes::counted(pg);
        let config = config(plan, pg.world_size(), zero);
        // The count at every log (rank 0's): the timed steps lie between the first and the last.
        let at_logs = Mutex::new(vec![]);
        let note = |event: &Event| {
            if let Event::Logged { step, .. } = event {
                at_logs.lock().unwrap().push((*step, wire.get()));
            }
        };
        let logs =
            logged(&note, |on_event| train::train_as_process(pg.clone(), &config, on_event).map(|_| ()))?;
        let mut peak = Tensor::from_slice(&[peak_rss_kib()?]).to_kind(Kind::Double);
        pg.all_reduce(&mut peak, ReduceOp::Max)?; // the largest rank's
        if pg.rank() == 0 {
            let rate = timed_rate(&logs, &config)?;
            let at_logs = at_logs.into_inner().unwrap();
            let ((first, before), (last, after)) = (at_logs[0], at_logs[at_logs.len() - 1]);
            anyhow::ensure!(last > first, "no timed steps between the logs {at_logs:?}");
            println!("tokens_per_second {}\nstep_ms {}", rate.tokens_per_second, rate.step_ms);
            println!("peak_rss_kib {}", peak.double_value(&[0]));
            println!("wire_bytes_per_step {}", (after - before) as f64 / (last - first) as f64);
        }
        Ok(())
    });
    Ok(())
}

#[cfg(not(feature = "mpi"))]
fn mpi_worker(_: Plan, _: usize) -> anyhow::Result<()> {
    unreachable!("the coordinator refuses to start without the mpi feature")
}

/// How a contender runs: PyTorch's script with its flags, or ours.
#[derive(Clone, Copy)]
enum Side {
    Torch(&'static [&'static str]),
    Ours { worker: Worker, world_size: usize, zero: usize },
}

const fn ours(worker: Worker, world_size: usize, zero: usize) -> Side {
    Side::Ours { worker, world_size, zero }
}

/// The contenders, in the order each round runs them: the run, its
/// strategy (for the figure's data) and how it is started.
const CONTENDERS: [(&str, &str, Side); 17] = [
    ("PyTorch DDP, defaults (2 processes, gloo)", "DDP", Side::Torch(&["--setting", "defaults"])),
    ("PyTorch DDP, best settings (2 processes, gloo)", "DDP", Side::Torch(&["--setting", "best"])),
    (
        "PyTorch, 1 process, no DDP, default AdamW",
        "one process",
        Side::Torch(&["--world-size", "1", "--no-ddp"]),
    ),
    (
        "PyTorch, 1 process, no DDP, fused AdamW",
        "one process",
        Side::Torch(&["--world-size", "1", "--no-ddp", "--setting", "best"]),
    ),
    (
        "PyTorch ZeroRedundancyOptimizer, defaults (2 processes)",
        "ZeRO-1",
        Side::Torch(&["--zero", "--setting", "defaults"]),
    ),
    (
        "PyTorch ZeroRedundancyOptimizer, best settings (2 processes)",
        "ZeRO-1",
        Side::Torch(&["--zero", "--setting", "best"]),
    ),
    ("ours DDP, MPI (2 processes)", "DDP", ours(Worker::Mpi, 2, 0)),
    ("ours DDP, in-process (2 threads)", "DDP", ours(Worker::Threads, 2, 0)),
    ("ours, 1 rank", "one process", ours(Worker::Threads, 1, 0)),
    ("ours ZeRO-1, MPI (2 processes)", "ZeRO-1", ours(Worker::Mpi, 2, 1)),
    ("ours ZeRO-1, in-process (2 threads)", "ZeRO-1", ours(Worker::Threads, 2, 1)),
    // FSDP2 at its fastest only (fused AdamW): the targets compare with it.
    (
        "PyTorch fully_shard, SHARD_GRAD_OP, fused AdamW (2 processes)",
        "ZeRO-2",
        Side::Torch(&["--fsdp", "grad-op", "--setting", "best"]),
    ),
    (
        "PyTorch fully_shard, FULL_SHARD, fused AdamW (2 processes)",
        "FSDP",
        Side::Torch(&["--fsdp", "full", "--setting", "best"]),
    ),
    ("ours ZeRO-2 (--shard grad-op), MPI (2 processes)", "ZeRO-2", ours(Worker::Mpi, 2, 2)),
    ("ours ZeRO-2 (--shard grad-op), in-process (2 threads)", "ZeRO-2", ours(Worker::Threads, 2, 2)),
    ("ours FSDP (--shard full), MPI (2 processes)", "FSDP", ours(Worker::Mpi, 2, 3)),
    ("ours FSDP (--shard full), in-process (2 threads)", "FSDP", ours(Worker::Threads, 2, 3)),
];
/// Ratios of tokens/s (numerator, denominator), by index in CONTENDERS.
const RATIOS: [(usize, usize); 10] =
    [(6, 1), (6, 0), (7, 1), (9, 5), (10, 5), (8, 3), (13, 11), (14, 11), (15, 12), (16, 12)];
/// The cost of distribution: (2 ranks, 1 rank on the same per-rank work).
const COSTS: [(usize, usize); 14] = [
    (0, 2),
    (1, 3),
    (4, 2),
    (5, 3),
    (6, 8),
    (7, 8),
    (9, 8),
    (10, 8),
    (11, 3),
    (12, 3),
    (13, 8),
    (14, 8),
    (15, 8),
    (16, 8),
];
/// The targets' pairs: (strategy, ours, PyTorch's at its best, the 1-rank baselines: ours, PyTorch's).
const STRATEGIES: [(&str, usize, usize, usize, usize); 4] =
    [("DDP", 6, 1, 8, 3), ("ZeRO-1", 9, 5, 8, 3), ("ZeRO-2", 13, 11, 8, 3), ("FSDP", 15, 12, 8, 3)];
/// FSDP's memory target: (ours FSDP, ours DDP, both MPI), at most this ratio of peaks per rank.
const FSDP_MEMORY: (usize, usize, f64) = (15, 6, 0.6);
/// PyTorch's runs that count their bytes on the wire (`--count-bytes`), by index.
const COUNTED: [usize; 4] = [1, 5, 11, 12];

/// What one run measured.
#[derive(Clone, Copy)]
struct Measured {
    rate: Rate,
    peak_kib: f64,
    wire_bytes: Option<f64>,
}

/// scripts/bench_torch_ddp.py at `plan` with `extra` arguments.
fn torch_command(plan: Plan, extra: &[&str]) -> anyhow::Result<Command> {
    let (steps, warmup) = (plan.steps.to_string(), plan.warmup.to_string());
    let mut script_args = vec!["--size", plan.size.name(), "--steps", &steps, "--warmup-steps", &warmup];
    script_args.extend(extra);
    python("scripts/bench_torch_ddp.py", &script_args)
}

/// This program as one of our runs.
fn ours_command(plan: Plan, worker: Worker, world_size: usize, zero: usize) -> anyhow::Result<Command> {
    let mut command = if worker == Worker::Mpi {
        let mut launch = Command::new("bash");
        launch.arg(root().join("scripts/launch.sh")).args(["-np", &world_size.to_string()]);
        launch.arg(std::env::current_exe()?).args(["--worker", "mpi"]);
        launch
    } else {
        let mut alone = Command::new(std::env::current_exe()?);
        alone.args(["--worker", "threads", "--world-size", &world_size.to_string()]);
        alone
    };
    command.args(["--size", plan.size.name(), "--zero", &zero.to_string()]);
    command.args(["--steps", &plan.steps.to_string(), "--warmup-steps", &plan.warmup.to_string()]);
    Ok(command)
}

fn run_contender(side: Side, plan: Plan) -> anyhow::Result<Measured> {
    let command = match side {
        Side::Torch(extra) => torch_command(plan, extra)?,
        Side::Ours { worker, world_size, zero } => ours_command(plan, worker, world_size, zero)?,
    };
    let (rate, stdout) = rate_of(command)?;
    let peak_kib = lines_of(&stdout, "peak_rss_kib")?[0][0];
    let wire_bytes = lines_of(&stdout, "wire_bytes_per_step").ok().map(|lines| lines[0][0]);
    Ok(Measured { rate, peak_kib, wire_bytes })
}

/// PyTorch's bytes on the wire per step, from a short counting run (its
/// comm hook would slow the timed ones).
fn torch_wire_bytes(plan: Plan, extra: &[&str]) -> anyhow::Result<f64> {
    let short = Plan { steps: plan.steps.min(3), warmup: 1, ..plan };
    let (_, stdout) = rate_of(torch_command(short, &[extra, &["--count-bytes"]].concat())?)?;
    Ok(lines_of(&stdout, "wire_bytes_per_step")?[0][0])
}

/// The data file's text: what the run was, then one row per size, run and
/// round (drawn by `cargo run --example figures -- --only ch99`). The
/// runs the targets compare are marked `compared`.
fn data_text(
    run: &table_file::Run,
    command: &str,
    plans: &[Plan],
    measured: &[Vec<Vec<Measured>>],
) -> String {
    let compared: Vec<usize> =
        STRATEGIES.iter().flat_map(|&(_, ours, theirs, _, _)| [ours, theirs]).collect();
    let mut out = format!(
        "# command\t{command}\n# machine\t{}\n# load\t{}\n\
         size\tparameters\trun\tsystem\tstrategy\tcompared\tround\ttokens_per_second\tstep_ms\tpeak_mib\t\
         wire_bytes_per_step\n",
        table_file::machine_line(),
        run.loads()
    );
    for (plan, measured) in plans.iter().zip(measured) {
        let params = GptConfig::of_size(plan.size).parameter_count();
        for (i, ((name, strategy, side), rounds)) in CONTENDERS.iter().zip(measured).enumerate() {
            let system = if matches!(side, Side::Torch(_)) { "PyTorch" } else { "ours" };
            for (round, m) in rounds.iter().enumerate() {
                let wire = m.wire_bytes.map_or("-".to_string(), |b| format!("{b:.0}"));
                let _ = writeln!(
                    out,
                    "{}\t{params}\t{name}\t{system}\t{strategy}\t{}\t{}\t{:.1}\t{:.3}\t{:.1}\t{wire}",
                    plan.size,
                    compared.contains(&i),
                    round + 1,
                    m.rate.tokens_per_second,
                    m.rate.step_ms,
                    mib(m.peak_kib)
                );
            }
        }
    }
    out
}

fn mib(kib: f64) -> f64 {
    kib / 1024.0
}

/// One size's tables: tokens/s, ratios and costs (vs_pytorch_tables.rs),
/// then memory and bytes on the wire, then the targets. Returns the
/// markdown and the targets' lines for the terminal.
fn size_tables(plan: Plan, measured: &[Vec<Measured>], torch_wire: &[(usize, f64)]) -> (String, Vec<String>) {
    let rates: Vec<Vec<Rate>> = measured.iter().map(|runs| runs.iter().map(|m| m.rate).collect()).collect();
    let columns: Vec<Column> =
        CONTENDERS.iter().zip(&rates).map(|((name, _, _), rates)| Column { name, rates }).collect();
    let mut out = tables::training_tables(&columns, &RATIOS, &COSTS);
    let peak = |i: usize| summary(&measured[i].iter().map(|m| mib(m.peak_kib)).collect::<Vec<_>>());
    let wire = |i: usize| {
        let ours = measured[i].iter().rev().find_map(|m| m.wire_bytes);
        ours.or_else(|| torch_wire.iter().find(|(j, _)| *j == i).map(|(_, bytes)| *bytes))
    };
    out += "\nPeak resident memory per rank (VmHWM: the largest rank's process; rank threads share one \
            process, whose peak is given) and bytes on the wire per step per rank (as a ring sends them; \
            PyTorch's counted in a short run of their own):\n\n";
    out += "| run | peak memory per rank, median | min | max | bytes on the wire per step |\n";
    out += "| --- | ---: | ---: | ---: | ---: |\n";
    for (i, (name, _, _)) in CONTENDERS.iter().enumerate() {
        let (median, min, max) = peak(i);
        let bytes = wire(i).map_or("-".to_string(), |b| format!("{} B", thousands(b)));
        let _ = writeln!(out, "| {name} | {median:.0} MiB | {min:.0} MiB | {max:.0} MiB | {bytes} |");
    }
    let per_round = |a: usize, b: usize, f: &dyn Fn(&Measured, &Measured) -> f64| {
        summary(&measured[a].iter().zip(&measured[b]).map(|(a, b)| f(a, b)).collect::<Vec<_>>()).0
    };
    let mut lines = vec![];
    out += "\n| target | ours | PyTorch's | ratio, median | met? |\n| --- | ---: | ---: | ---: | --- |\n";
    for (strategy, ours, theirs, ours_one, theirs_one) in STRATEGIES {
        let speed = per_round(ours, theirs, &|a, b| a.rate.tokens_per_second / b.rate.tokens_per_second);
        let tokens = |i: usize| summary(&rates[i].iter().map(|r| r.tokens_per_second).collect::<Vec<_>>()).0;
        let verdict = if speed >= 1.3 {
            "met".to_string()
        } else {
            format!("missed: ours needs {:.0}% more tokens/s", (1.3 / speed - 1.0) * 100.0)
        };
        let speed_row = (
            format!("{strategy}: tokens/s at least 1.3x PyTorch's"),
            format!("{:.0}", tokens(ours)),
            format!("{:.0}", tokens(theirs)),
            format!("{speed:.2}x"),
            verdict,
        );
        let cost = |two: usize, one: usize| per_round(two, one, &|a, b| a.rate.step_ms - b.rate.step_ms);
        let (our_cost, their_cost) = (cost(ours, ours_one), cost(theirs, theirs_one));
        let (ratio, verdict) = if their_cost <= 0.0 {
            ("-".to_string(), "not measurable: PyTorch's cost is not above 0 (noise)".to_string())
        } else if our_cost <= 0.5 * their_cost {
            (format!("{:.2}x", our_cost / their_cost), "met".to_string())
        } else {
            let over = our_cost - 0.5 * their_cost;
            (format!("{:.2}x", our_cost / their_cost), format!("missed by {over:.2} ms per step"))
        };
        let cost_row = (
            format!("{strategy}: cost of distribution at most half of PyTorch's"),
            format!("{our_cost:.2} ms"),
            format!("{their_cost:.2} ms"),
            ratio,
            verdict,
        );
        let (our_peak, their_peak) = (peak(ours).0, peak(theirs).0);
        let verdict = if our_peak <= their_peak {
            "met".to_string()
        } else {
            format!("missed by {:.0} MiB", our_peak - their_peak)
        };
        let memory_row = (
            format!("{strategy}: peak memory per rank at most PyTorch's"),
            format!("{our_peak:.0} MiB"),
            format!("{their_peak:.0} MiB"),
            format!("{:.2}x", our_peak / their_peak),
            verdict,
        );
        for (target, a, b, ratio, verdict) in [speed_row, cost_row, memory_row] {
            let _ = writeln!(out, "| {target} | {a} | {b} | {ratio} | {verdict} |");
            lines.push(format!("{}: {target}: ours {a}, PyTorch's {b}, {ratio}: {verdict}", plan.size));
        }
    }
    let (fsdp, ddp, most) = FSDP_MEMORY;
    let ratio = per_round(fsdp, ddp, &|a, b| a.peak_kib / b.peak_kib);
    let verdict = if ratio <= most {
        "met".to_string()
    } else {
        format!("missed by {:.0} MiB", peak(fsdp).0 - most * peak(ddp).0)
    };
    let target = format!("FSDP: peak memory per rank at most {most}x our DDP's (ours, both 2 MPI processes)");
    let (a, b) = (format!("{:.0} MiB", peak(fsdp).0), format!("{:.0} MiB (our DDP)", peak(ddp).0));
    let _ = writeln!(out, "| {target} | {a} | {b} | {ratio:.2}x | {verdict} |");
    lines.push(format!("{}: {target}: FSDP {a}, DDP {b}, {ratio:.2}x: {verdict}", plan.size));
    let params = thousands(GptConfig::of_size(plan.size).parameter_count() as f64);
    let heading = format!(
        "### GPT `{}`: {params} parameters\n\n{} timed steps after {} untimed ones per run. Targets: ours \
         (MPI, 2 processes) against PyTorch's at its best settings, the cost of distribution against the \
         1-rank runs (ours; PyTorch's with fused AdamW).\n\n",
        plan.size, plan.steps, plan.warmup
    );
    (heading + &out, lines)
}

const PHASES: [&str; 4] = ["data", "forward", "backward", "optimizer"];

/// Milliseconds per step in each of PHASES: ours from two runs that differ
/// only in their timed steps (the difference of the phases' sums, so that
/// the warm-up drops out), PyTorch's from its `--phases` lines.
fn phases_of(plan: Plan) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let sums = |steps: usize| -> anyhow::Result<Vec<f64>> {
        let (_, stdout) = rate_of(ours_command(Plan { steps, ..plan }, Worker::Threads, 1, 0)?)?;
        let lines = lines_of(&stdout, "phase_sum_ms")?;
        anyhow::ensure!(lines.len() == PHASES.len(), "expected {} phase_sum_ms lines", PHASES.len());
        Ok(lines.iter().map(|values| values[0]).collect())
    };
    let (short, long) = (sums(1)?, sums(1 + plan.steps)?);
    let ours = short.iter().zip(&long).map(|(a, b)| (b - a) / plan.steps as f64).collect();
    let extra = ["--world-size", "1", "--no-ddp", "--setting", "best", "--phases"];
    let (_, stdout) = rate_of(torch_command(plan, &extra)?)?;
    let theirs = lines_of(&stdout, "phase_ms")?.iter().map(|values| values[0]).collect();
    Ok((ours, theirs))
}

/// `--profile`: one rank's step, phase by phase, ours against PyTorch's.
fn profile(args: &Args, run: &table_file::Run, command: &str) -> anyhow::Result<()> {
    let mut body = "| size | phase | ours, ms per step | PyTorch's, ms per step | ours / PyTorch's |\n\
                    | --- | --- | ---: | ---: | ---: |\n"
        .to_string();
    for &size in &args.sizes {
        let plan = Plan::of(size, args);
        let (ours, theirs) = phases_of(plan)?;
        let (ours_total, theirs_total): (f64, f64) = (ours.iter().sum(), theirs.iter().sum());
        for ((phase, a), b) in
            PHASES.iter().zip(&ours).zip(&theirs).chain([((&"step", &ours_total), &theirs_total)])
        {
            let _ = writeln!(body, "| {size} | {phase} | {a:.2} | {b:.2} | {:.2} |", a / b);
        }
        println!("{size}: ours {ours:.2?} ms, PyTorch's {theirs:.2?} ms ({PHASES:?})");
    }
    let setup = "one rank, one libtorch thread, 16 sequences per micro-batch, 2 micro-batches per step; \
                 ours: the training run's phases (forward includes the loss, backward the one-rank sync); \
                 PyTorch's: scripts/bench_torch_ddp.py --no-ddp --setting best --phases (fused AdamW; \
                 forward includes the loss and reading it)"
        .to_string();
    let body = format!("{body}\n{}", run.caption(&[setup], command));
    println!("\n{body}");
    if let Some(table) = &args.table {
        println!("wrote {}", table_file::write_table(table, command, &body)?.display());
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(kind) = args.worker {
        return worker(kind, &args);
    }
    anyhow::ensure!(cfg!(feature = "mpi"), "build with the MPI backend: {COMMAND}");
    anyhow::ensure!(
        args.rounds > 0 && args.steps != Some(0) && args.warmup_steps != Some(0) && !args.sizes.is_empty(),
        "--rounds, --steps and --warmup-steps must be at least 1, and --sizes name at least one size"
    );
    let run = table_file::Run::start();
    let command = table_file::command_line(COMMAND);
    if args.profile {
        return profile(&args, &run, &command);
    }
    let plans: Vec<Plan> = args.sizes.iter().map(|&size| Plan::of(size, &args)).collect();
    // measured[size][contender][round]
    let mut measured = vec![vec![vec![]; CONTENDERS.len()]; plans.len()];
    for round in 1..=args.rounds {
        for (s, plan) in plans.iter().enumerate() {
            let mut line = vec![];
            for (i, (name, _, side)) in CONTENDERS.iter().enumerate() {
                let m = run_contender(*side, *plan)?;
                line.push(format!("{name} {:.0}", m.rate.tokens_per_second));
                measured[s][i].push(m);
            }
            println!("round {round}, {}: {} tokens/s (load {})", plan.size, line.join(", "), load_average());
            if let Some(path) = &args.data {
                let text = data_text(&run, &command, &plans, &measured);
                std::fs::write(root().join(path), text).with_context(|| format!("cannot write {path}"))?;
            }
        }
    }
    let mut body = String::new();
    let mut targets = vec![];
    for (plan, measured) in plans.iter().zip(&measured) {
        let mut torch_wire = vec![];
        for i in COUNTED {
            let Side::Torch(extra) = CONTENDERS[i].2 else { unreachable!("COUNTED names PyTorch's runs") };
            torch_wire.push((i, torch_wire_bytes(*plan, extra)?));
        }
        let (tables, lines) = size_tables(*plan, measured, &torch_wire);
        body += &tables;
        body += "\n";
        targets.extend(lines);
    }
    let setup = format!(
        "16 sequences per rank per micro-batch, 2 micro-batches per step, AdamW, one libtorch thread per \
         rank, {} alternating rounds; each run a process of its own",
        args.rounds
    );
    let body = format!("{body}{}", run.caption(&[setup], &command));
    println!("\n{body}\nTargets (printed, not asserted):");
    for line in &targets {
        println!("  {line}");
    }
    if let Some(table) = &args.table {
        println!("wrote {}", table_file::write_table(table, &command, &body)?.display());
    }
    Ok(())
}
