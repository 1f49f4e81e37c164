//! One overlapped step of
//! `bench_overlap`, as it happened on each rank (forward, backward, each
//! bucket's launch and completion, the wait after backward), as a table and
//! as the data file that chapter 6's figure draws.
//! Run: cargo run --release --example bench_overlap -- --timeline --timeline-data FILE
//! Included by examples/bench_overlap.rs with `#[path]`.

use std::time::Instant;

use ddp_workbook::data::{masked_cross_entropy, TokenTask};
use ddp_workbook::ddp::{BucketCaps, GradientBuckets, Named, Reducer};
use ddp_workbook::dist::{spawn_with, Group, SimulatedLink, SpawnOptions};
use ddp_workbook::models::Gpt;
use ddp_workbook::tch::nn::Module;
use ddp_workbook::tch::{self, Tensor};

use super::timed_group::timed_group;

/// One bucket's all-reduce in the recorded step.
pub struct BucketTimes {
    pub bucket: usize,
    pub bytes: usize,
    pub launched: Instant,
    pub completed: Instant,
    /// How many gradients were ready when it left.
    pub gradients_ready: usize,
}

/// One rank's recorded step: from the barrier that starts it to the end of
/// its sync.
pub struct RankTimeline {
    pub started: Instant,
    pub forward_ended: Instant,
    pub backward_ended: Instant,
    pub synced: Instant,
    pub buckets: Vec<BucketTimes>,
}

/// The model, its task, its parameters and the bucket caps: what every case builds.
pub type Model = (TokenTask, Gpt, Vec<Named>, BucketCaps);
/// Step `step`'s batch for `rank`.
pub type BatchOf = fn(&TokenTask, usize, usize) -> (Tensor, Tensor, Tensor);

/// Runs `warmup` overlapped steps on 2 in-process ranks (the first one
/// re-plans the buckets), then records `recorded` more, and returns the
/// recorded step that took the least time from the first rank's start to
/// the last rank's sync, on each rank: on a machine busy with other work,
/// the step least disturbed by it.
pub fn record_timeline(
    link: Option<SimulatedLink>,
    (warmup, recorded): (usize, usize),
    model: &(dyn Fn() -> Model + Sync),
    batch_of: BatchOf,
) -> anyhow::Result<Vec<RankTimeline>> {
    let mut options = SpawnOptions::new(2);
    if let Some(link) = link {
        options = options.link(link);
    }
    let mut ranks = spawn_with(options, |pg: Group| {
        tch::set_num_threads(1);
        let (group, watcher) = timed_group(pg.clone());
        let (task, gpt, params, caps) = model();
        let planned = GradientBuckets::plan(group.as_ref(), &params, caps)?;
        let overlapped = Reducer::new(group.clone(), &params, planned)?;
        let mut steps = vec![];
        for step in 0..warmup + recorded {
            let (inputs, targets, mask) = batch_of(&task, step, pg.rank());
            for (_, p) in &params {
                let _ = p.grad().defined().then(|| p.grad().zero_());
            }
            group.barrier()?;
            watcher.restart();
            let started = Instant::now();
            overlapped.arm(format!("step {step}"));
            let loss = masked_cross_entropy(&gpt.forward(&inputs), &targets, &mask);
            let forward_ended = Instant::now();
            loss.backward();
            let backward_ended = Instant::now();
            overlapped.finish(false, Ok(()))?;
            let synced = Instant::now();
            if step < warmup {
                continue;
            }
            let (record, layout) = (overlapped.last_step(), overlapped.layout());
            // The n-th all-reduce since the restart is the n-th bucket to leave.
            let mut buckets = vec![];
            for (n, launch) in record.launches.iter().enumerate() {
                let completed =
                    watcher.completed(n).ok_or_else(|| ddp_workbook::dist::DistError::Invalid {
                        rank: pg.rank(),
                        op: "recording the timeline".into(),
                        detail: format!("bucket {} left but its completion was not noted", launch.bucket),
                    })?;
                buckets.push(BucketTimes {
                    bucket: launch.bucket,
                    bytes: layout[launch.bucket].bytes(),
                    launched: launch.at,
                    completed,
                    gradients_ready: launch.gradients_ready,
                });
            }
            steps.push(RankTimeline { started, forward_ended, backward_ended, synced, buckets });
        }
        Ok(steps)
    })?;
    let took = |i: usize| {
        let first = ranks.iter().map(|steps| steps[i].started).min().expect("ranks");
        let last = ranks.iter().map(|steps| steps[i].synced).max().expect("ranks");
        last - first
    };
    let fastest = (0..recorded).min_by_key(|&i| took(i)).expect("at least one recorded step");
    Ok(ranks.iter_mut().map(|steps| steps.swap_remove(fastest)).collect())
}

/// Milliseconds from `origin` to `at`, to the microsecond.
fn ms_since(origin: Instant, at: Instant) -> f64 {
    (at.saturating_duration_since(origin).as_secs_f64() * 1e6).round() / 1e3
}

/// One rank's step as a Markdown table, times from that rank's step start.
pub fn timeline_table(rank: &RankTimeline, which: &str) -> String {
    let since = |at: Instant| ms_since(rank.started, at);
    let ended = since(rank.backward_ended);
    let mut table = format!(
        "Rank 0 in the fastest of the recorded overlapped steps {which}: forward + backward took {ended:.2} ms, the sync ended at {:.2} ms.\n\n\
         | bucket | bytes | left at | done at | left before backward ended | gradients ready |\n\
         | ---: | ---: | ---: | ---: | ---: | ---: |\n",
        since(rank.synced)
    );
    for b in &rank.buckets {
        let (left, done) = (since(b.launched), since(b.completed));
        table += &format!(
            "| {} | {} | {left:.2} ms | {done:.2} ms | {:.2} ms | {} |\n",
            b.bucket,
            b.bytes,
            ended - left,
            b.gradients_ready
        );
    }
    table
}

/// What the α–β model of `link` says overlap can hide on `rank`'s buckets,
/// in words: the buckets' all-reduces on 2 ranks, and the tail that no
/// computation is left to hide (the last bucket to leave, which backward
/// fills last, and the end-of-backward check of `check_bytes`).
pub fn alpha_beta_bound(rank: &RankTimeline, link: SimulatedLink, check_bytes: usize) -> String {
    let time = |bytes: usize| link.all_reduce_time(bytes as u64, 2).as_secs_f64() * 1e6;
    let all: f64 = rank.buckets.iter().map(|b| time(b.bytes)).sum::<f64>() + time(check_bytes);
    let bytes: usize = rank.buckets.iter().map(|b| b.bytes).sum();
    let Some(last) = rank.buckets.iter().max_by_key(|b| b.launched) else {
        return "No bucket left in the recorded step.".into();
    };
    let tail = time(last.bytes) + time(check_bytes);
    format!(
        "The α–β model of the link: the {} buckets' all-reduces ({bytes} bytes) and the end-of-backward \
         check ({check_bytes} bytes) take {all:.0} µs; the last bucket to leave (bucket {}, {} bytes) and \
         the check take {tail:.0} µs of it, with no computation left to hide behind: overlap can hide at \
         most {:.0}% of the communication.",
        rank.buckets.len(),
        last.bucket,
        last.bytes,
        100.0 * (1.0 - tail / all)
    )
}

/// Both recorded steps (`[without link, with link]`) as the rows of a
/// tab-separated data file, after `about` (its `# key<tab>value` lines):
/// per rank its forward, backward and wait, and each bucket from launch to
/// completion, every time in ms from the moment the first rank of that step
/// started.
pub fn timeline_data(cases: [&[RankTimeline]; 2], about: &str) -> String {
    let mut text = format!("{about}link\trank\tpart\tbucket\tbytes\tfrom_ms\tto_ms\tgradients_ready\n");
    for (ranks, link) in cases.into_iter().zip(["no", "yes"]) {
        let origin = ranks.iter().map(|r| r.started).min().expect("ranks");
        let at = |instant: Instant| ms_since(origin, instant);
        for (rank, r) in ranks.iter().enumerate() {
            let parts = [
                ("forward", r.started, r.forward_ended),
                ("backward", r.forward_ended, r.backward_ended),
                ("wait", r.backward_ended, r.synced),
            ];
            for (part, from, to) in parts {
                text += &format!("{link}\t{rank}\t{part}\t-\t-\t{:.3}\t{:.3}\t-\n", at(from), at(to));
            }
            for b in &r.buckets {
                text += &format!(
                    "{link}\t{rank}\tall-reduce\t{}\t{}\t{:.3}\t{:.3}\t{}\n",
                    b.bucket,
                    b.bytes,
                    at(b.launched),
                    at(b.completed),
                    b.gradients_ready
                );
            }
        }
    }
    text
}
