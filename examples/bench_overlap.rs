//! What overlapping communication with backward
//! hides. The tiny GPT on 2 in-process ranks, one micro-batch of 16
//! sequences per rank, small buckets (16 KiB); the time of forward + backward + sync
//! with three syncs: naive (one all-reduce per parameter, after backward),
//! bucketed (one per bucket, after backward) and overlapped (each bucket
//! leaves during backward, `ddp::Reducer`, gradients kept in the
//! buckets; and again with steps that copy them in and out, as chapter 6's
//! exercise does: `support/copying_steps.rs`), each without and
//! with a simulated link (50 µs, 10 Gbit/s by default). Prints the medians,
//! how much of the bucketed sync's communication time overlap hid, and what
//! keeping gradients as views saves. `--timeline` adds one overlapped step
//! as it happened on each rank, without and with the link: forward,
//! backward, each bucket's launch and completion, the wait after backward
//! (printed as a table, with the α–β model's bound on what overlap can hide
//! on these buckets; with `--timeline-data FILE` written to a file, which
//! chapter 6's figure draws: `cargo run --example figures`). `--table FILE`
//! and `--timeline-table FILE` write the two tables with the machine, its
//! load and the command (support/table_file.rs), for chapter 6 to include.
//!
//! Run: cargo run --release --example bench_overlap
//!      cargo run --release --example bench_overlap -- --steps 40 --latency-us 200 --gbit 1 --timeline
//!      cargo run --release --example bench_overlap -- --steps 100 --table chapters/tables/overlap.md \
//!          --timeline --timeline-table chapters/tables/overlap-timeline.md \
//!          --timeline-data chapters/figures/data/overlap_timeline.tsv

use std::time::{Duration, Instant};

use clap::Parser;
use ddp_workbook::data::{masked_cross_entropy, TokenTask};
use ddp_workbook::ddp::{naive, BucketCaps, GradientBuckets, Named, Reducer};
use ddp_workbook::dist::{spawn_with, tagged, Group, SimulatedLink, SpawnOptions};
use ddp_workbook::models::{named_parameters, Gpt, GptConfig};
use ddp_workbook::tch::nn::Module;
use ddp_workbook::tch::{self, Kind};

#[path = "support/copying_steps.rs"]
mod copying_steps;
#[path = "support/machine.rs"]
mod machine;
#[path = "support/median.rs"]
mod median;
#[path = "support/overlap_timeline.rs"]
mod overlap_timeline;
#[path = "support/table_file.rs"]
mod table_file;
#[path = "support/timed_group.rs"]
mod timed_group;
use machine::load_average;
use median::median;
use overlap_timeline::{alpha_beta_bound, record_timeline, timeline_data, timeline_table};

#[derive(Parser)]
#[command(
    about = "Step time of naive, bucketed and overlapped gradient syncs, with and without a simulated link"
)]
struct Args {
    /// Timed steps per case and round, after 3 untimed ones.
    #[arg(long, default_value_t = 20)]
    steps: usize,
    /// Rounds: every case runs once per round, in a fresh group, and the
    /// median is over the steps of all rounds (one group's threads can land
    /// worse on a busy machine's cores than the next one's).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// The simulated link's latency per all-reduce, in microseconds.
    #[arg(long, default_value_t = 50.0)]
    latency_us: f64,
    /// The simulated link's bandwidth, in Gbit/s.
    #[arg(long, default_value_t = 10.0)]
    gbit: f64,
    /// Bucket cap in KiB (the first bucket gets at most a quarter of it).
    /// Small, because what stays exposed is the last bucket backward fills.
    #[arg(long, default_value_t = 16)]
    bucket_kib: usize,
    /// Also record one overlapped step on each rank, without and with the
    /// link, and print when each bucket left and completed.
    #[arg(long)]
    timeline: bool,
    /// With --timeline: also write that step's timeline to this tab-separated file.
    #[arg(long, requires = "timeline")]
    timeline_data: Option<std::path::PathBuf>,
    /// Also write the table of step times, the share hidden and the views'
    /// saving to this Markdown file (relative to the repository), with the
    /// machine, its load and this command.
    #[arg(long)]
    table: Option<String>,
    /// With --timeline: also write rank 0's recorded step with the link, and
    /// the α–β bound, to this Markdown file, the same way.
    #[arg(long, requires = "timeline")]
    timeline_table: Option<String>,
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Sync {
    Naive,
    Bucketed,
    Overlapped,
    /// Overlapped with steps that copy the gradients into the buckets and
    /// back (chapter 6's exercise) instead of keeping them there.
    OverlappedCopying,
}

/// The tiny GPT of every case (the same seed on every rank), its task, its
/// parameters and the bucket caps of `--bucket-kib`.
fn tiny_gpt(args: &Args) -> (TokenTask, Gpt, Vec<Named>, BucketCaps) {
    let task = TokenTask::standard(1, 512);
    let config = GptConfig { vocab_size: task.vocab_size(), block_size: task.seq_len(), ..GptConfig::tiny() };
    let (vs, gpt) = Gpt::seeded(1, &config, Kind::Float);
    let cap = args.bucket_kib * 1024;
    (task, gpt, named_parameters(&vs), BucketCaps { cap_bytes: cap, first_cap_bytes: cap / 4 })
}

/// Step `step`'s batch for `rank`: 16 sequences, different on every rank.
fn batch_of(task: &TokenTask, step: usize, rank: usize) -> (tch::Tensor, tch::Tensor, tch::Tensor) {
    task.batch((step * 32 + rank * 16) as i64 % 480, 16)
}

/// The step times (forward, backward, sync) for `sync`, from the barrier
/// that starts a step to the moment the last rank's sync ends; the times
/// from the end of the last rank's backward to that moment (the
/// communication left exposed: a rank that finished backward early waits
/// for the last one in any sync, so that wait is not counted).
fn measure(
    sync: Sync,
    link: Option<SimulatedLink>,
    args: &Args,
) -> anyhow::Result<(Vec<Duration>, Vec<Duration>)> {
    let mut options = SpawnOptions::new(2);
    if let Some(link) = link {
        options = options.link(link);
    }
    let per_rank = spawn_with(options, |pg: Group| {
        tch::set_num_threads(1);
        let (task, gpt, params, caps) = tiny_gpt(args);
        let buckets = GradientBuckets::plan(pg.as_ref(), &params, caps)?;
        let planned = || GradientBuckets::plan(pg.as_ref(), &params, caps);
        let overlapped = match sync {
            Sync::Overlapped => Some(Reducer::new(pg.clone(), &params, planned()?)?),
            Sync::OverlappedCopying => Some(copying_steps::copying_reducer(pg.clone(), &params, planned()?)?),
            _ => None,
        };
        let mut times = vec![];
        for step in 0..args.steps + 3 {
            let (inputs, targets, mask) = batch_of(&task, step, pg.rank());
            for (_, p) in &params {
                let _ = p.grad().defined().then(|| p.grad().zero_());
            }
            pg.barrier()?;
            let started = Instant::now();
            let tag = format!("step {step}");
            if let Some(o) = &overlapped {
                o.arm(tag.clone());
            }
            let loss = masked_cross_entropy(&gpt.forward(&inputs), &targets, &mask);
            loss.backward();
            let backward_ended = Instant::now();
            match (sync, &overlapped) {
                (Sync::Naive, _) => tagged(tag, || naive::sync_gradients(pg.as_ref(), &params))?,
                (Sync::Bucketed, _) => tagged(tag, || buckets.sync(pg.as_ref(), &params))?,
                (Sync::Overlapped | Sync::OverlappedCopying, Some(o)) => {
                    o.finish(false, Ok(()))?;
                }
                (_, None) => unreachable!("the overlapped syncs have their buckets"),
            }
            if step >= 3 {
                times.push((started, backward_ended, Instant::now()));
            }
        }
        Ok(times)
    })?;
    let (mut steps, mut after_backward) = (vec![], vec![]);
    for step in 0..args.steps {
        let times = || per_rank.iter().map(|times| times[step]);
        let started = times().map(|t| t.0).min().expect("ranks");
        let backward_ended = times().map(|t| t.1).max().expect("ranks");
        let synced = times().map(|t| t.2).max().expect("ranks");
        steps.push(synced - started);
        after_backward.push(synced.saturating_duration_since(backward_ended));
    }
    Ok((steps, after_backward))
}

/// The bytes of all the tiny GPT's gradients (one per parameter element).
fn gradient_bytes() -> usize {
    let task = TokenTask::standard(1, 8);
    let config = GptConfig { vocab_size: task.vocab_size(), block_size: task.seq_len(), ..GptConfig::tiny() };
    let (vs, _) = Gpt::seeded(1, &config, Kind::Float);
    named_parameters(&vs).iter().map(|(_, p)| p.numel() * p.kind().elt_size_in_bytes()).sum()
}

/// The bytes of the end-of-backward check's all-reduce on 2 ranks: an i32
/// flag per parameter for "unused here" and "used here", and one per rank
/// (`end_of_backward_check` in src/ddp/reducer/mod.rs).
fn check_bytes(args: &Args) -> usize {
    let (_, _, params, _) = tiny_gpt(args);
    (2 * params.len() + 2) * std::mem::size_of::<i32>()
}

/// The timeline's warm-up steps, then the steps it picks the fastest of.
const TIMELINE_STEPS: (usize, usize) = (5, 100);

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

const CARGO: &str = "cargo run --release --example bench_overlap";

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        args.steps > 0 && args.rounds > 0 && args.gbit > 0.0 && args.bucket_kib > 0,
        "--steps, --rounds, --gbit and --bucket-kib must be positive"
    );
    let link = SimulatedLink::new(Duration::from_secs_f64(args.latency_us * 1e-6), args.gbit);
    let run = table_file::Run::start();
    let load_before = load_average();
    let settings = format!(
        "tiny GPT, 2 in-process ranks, 16 sequences per rank, buckets of {} KiB, median of {} steps ({} rounds of {})",
        args.bucket_kib,
        args.steps * args.rounds,
        args.rounds,
        args.steps
    );
    println!("{settings}\n");
    let mut table = format!(
        "| sync | step, no link | step, link ({0} µs, {1} Gbit/s) | after backward, no link | after backward, link |\n\
         | --- | ---: | ---: | ---: | ---: |\n",
        args.latency_us, args.gbit
    );
    const SYNCS: [Sync; 4] = [Sync::Naive, Sync::Bucketed, Sync::Overlapped, Sync::OverlappedCopying];
    // samples[case][link on][step time, after backward]
    let mut samples = vec![[[vec![], vec![]], [vec![], vec![]]]; SYNCS.len()];
    for _round in 0..args.rounds {
        for (case, &sync) in SYNCS.iter().enumerate() {
            for (linked, link) in [None, Some(link)].into_iter().enumerate() {
                let (steps, after) = measure(sync, link, &args)?;
                samples[case][linked][0].extend(steps);
                samples[case][linked][1].extend(after);
            }
        }
    }
    let mut rows = vec![];
    for (sync, [[plain, plain_after], [linked, linked_after]]) in SYNCS.iter().zip(samples) {
        let row = (median(plain), median(linked), median(plain_after), median(linked_after));
        table += &format!("| {sync:?} | {} | {} | {} | {} |\n", ms(row.0), ms(row.1), ms(row.2), ms(row.3));
        rows.push(row);
    }
    // What the link adds after backward, against the same sync without it:
    // all of the bucketed sync's communication, and what overlap left
    // exposed. (The whole steps vary by about a millisecond from one spawn
    // to the next on a busy machine; the part after backward much less.)
    let (bucketed, overlapped) = (rows[1], rows[2]);
    let communication = bucketed.3.saturating_sub(bucketed.2);
    let exposed = overlapped.3.saturating_sub(overlapped.2);
    let hidden = 1.0 - exposed.as_secs_f64() / communication.as_secs_f64().max(1e-9);
    let verdict = if exposed < communication {
        format!("{:.0}% of the communication time hidden", 100.0 * hidden)
    } else {
        // Other work on the machine moved the medians more than the link
        // did: a share computed from them would be noise, or negative.
        "the machine's other work moved these medians more than the link did, so no share of hidden \
         time can be read from them: run again on a quieter machine, or with more --steps and --rounds"
            .to_string()
    };
    table += &format!(
        "\nAfter backward, the link adds {} to the bucketed sync and {} to the overlapped one: {verdict}.\n",
        ms(communication),
        ms(exposed),
    );
    // Views: the buckets are the gradients. Copies: gradients and buckets.
    let gradient_bytes = gradient_bytes();
    let saved = rows[3].2.as_secs_f64() - rows[2].2.as_secs_f64();
    table += &format!(
        "\nGradients as bucket views hold {:.0} KiB of gradients in the buckets themselves, where \
         copying holds them twice ({:.0} KiB); the copies back after backward cost {:.2} ms per \
         step here (no link; the copies in happen during backward).\n",
        gradient_bytes as f64 / 1024.0,
        2.0 * gradient_bytes as f64 / 1024.0,
        saved * 1e3
    );
    println!("{table}");
    let command = table_file::command_line(CARGO);
    if let Some(path) = &args.table {
        let body = format!("{table}\n{}", run.caption(&[settings], &command));
        println!("wrote {}", table_file::write_table(path, &command, &body)?.display());
    }
    if args.timeline {
        let model = || tiny_gpt(&args);
        let plain = record_timeline(None, TIMELINE_STEPS, &model, batch_of)?;
        let linked = record_timeline(Some(link), TIMELINE_STEPS, &model, batch_of)?;
        let timeline = format!(
            "{}\n{}\n",
            timeline_table(&linked[0], "with the link"),
            alpha_beta_bound(&linked[0], link, check_bytes(&args))
        );
        println!("\n{timeline}");
        let load_after = load_average();
        println!("load average before: {load_before}, after: {load_after}");
        if let Some(path) = &args.timeline_table {
            let settings = format!(
                "the tiny GPT on 2 in-process ranks, 16 sequences per rank, buckets of {} KiB, link {} µs \
                 and {} Gbit/s; the fastest of {} overlapped steps after {} untimed ones",
                args.bucket_kib, args.latency_us, args.gbit, TIMELINE_STEPS.1, TIMELINE_STEPS.0
            );
            let body = format!("{timeline}\n{}", run.caption(&[settings], &command));
            println!("wrote {}", table_file::write_table(path, &command, &body)?.display());
        }
        if let Some(path) = &args.timeline_data {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            let about = format!(
                "# command\t{command}\n# cores\t{cores}\n# load_before\t{load_before}\n# load_after\t{load_after}\n\
                 # bucket_kib\t{}\n# latency_us\t{}\n# gbit\t{}\n",
                args.bucket_kib, args.latency_us, args.gbit
            );
            std::fs::write(path, timeline_data([&plain, &linked], &about))?;
            println!("wrote {}", path.display());
        }
    } else {
        println!("load average before: {load_before}, after: {}", load_average());
    }
    Ok(())
}
