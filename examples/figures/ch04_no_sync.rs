//! Chapter 4's figure, one optimizer step
//! of 4 micro-batches, without and with `no_sync` on the first three: which
//! backward sends all-reduces. Run for real on 2 in-process ranks through the
//! library's `SimpleDistributedDataParallelism`; each backward's all-reduces
//! are counted from the process group's stats. Drawn by
//! `cargo run --example figures`. The boxes' widths are schematic, not timed.

use ddp_workbook::data::Regression;
use ddp_workbook::ddp::{BucketCaps, SimpleDistributedDataParallelism};
use ddp_workbook::dist::spawn;
use ddp_workbook::models::Mlp;
use ddp_workbook::tch::Kind;

use crate::svg::{Anchor, Svg, INK, MUTED, PALE, PALETTE, SMALL, TEXT};
use crate::Figure;

pub fn figures() -> Vec<Figure> {
    vec![Figure { file: "ch04-no-sync.svg", draw: no_sync_timeline }]
}

const MICRO_BATCHES: usize = 4;
const SIZES: [i64; 4] = [4, 16, 16, 1];

/// Rank 0's all-reduces during each backward of one step, with the first
/// `MICRO_BATCHES - 1` backwards inside `no_sync` or not, and the number of
/// buckets. Small caps, so that the MLP's gradients make more than one bucket.
fn all_reduces_per_backward(use_no_sync: bool) -> anyhow::Result<(Vec<u64>, usize)> {
    let caps = BucketCaps { cap_bytes: 1024, first_cap_bytes: 128 };
    let per_rank = spawn(2, |pg| {
        let (vs, mlp) = Mlp::seeded(0, &SIZES, Kind::Double);
        let ddp = SimpleDistributedDataParallelism::with_bucket_caps(mlp, &vs, pg.clone(), caps)?;
        let data = Regression::new(7, 16 * MICRO_BATCHES as i64, 4, 1, Kind::Double); // one task
        let shard = 8 * MICRO_BATCHES as i64 * pg.rank() as i64; // this rank's rows start here
        let mut counts = Vec::new();
        for micro in 0..MICRO_BATCHES {
            let (x, y) = data.batch(shard + 8 * micro as i64, 8);
            let loss = (ddp.forward(&x) - y).square().mean(Kind::Double) / MICRO_BATCHES as f64;
            let before = pg.stats().all_reduce;
            if use_no_sync && micro + 1 < MICRO_BATCHES {
                let _quiet = ddp.no_sync(); // backward only accumulates
                ddp.backward(&loss)?;
            } else {
                ddp.backward(&loss)?;
            }
            counts.push(pg.stats().all_reduce - before);
        }
        Ok((counts, ddp.buckets().len()))
    })?;
    per_rank.into_iter().next().ok_or_else(|| anyhow::anyhow!("no rank"))
}

/// A box with a label in it.
fn labelled_box(svg: &mut Svg, x: f64, y: f64, w: f64, colour: usize, label: &str) {
    svg.rect(x, y, w - 3.0, 28.0, PALE[colour], Some(PALETTE[colour]));
    svg.text(x + (w - 3.0) / 2.0, y + 19.0, SMALL, Anchor::Middle, label);
}

/// One lane: forward, backward and the all-reduces each backward sent, per
/// micro-batch, then the optimizer step. Returns the y below it.
fn draw_lane(svg: &mut Svg, y: f64, heading: &str, counts: &[u64]) -> f64 {
    svg.text_styled(16.0, y + 14.0, TEXT, Anchor::Start, INK, true, heading);
    let y = y + 24.0;
    let (fwd, bwd, sync, step) = (40.0, 44.0, 56.0, 44.0);
    let mut x = 16.0;
    for (micro, &count) in counts.iter().enumerate() {
        svg.text_styled(x, y + 44.0, SMALL, Anchor::Start, MUTED, false, &format!("micro {micro}"));
        labelled_box(svg, x, y, fwd, 4, "fwd");
        labelled_box(svg, x + fwd, y, bwd, 0, "bwd");
        x += fwd + bwd;
        if count > 0 {
            labelled_box(svg, x, y, sync, 1, &format!("{count} AR"));
            x += sync;
        }
        x += 8.0; // a gap between micro-batches
    }
    labelled_box(svg, x, y, step, 2, "step");
    let total: u64 = counts.iter().sum();
    svg.text_styled(x, y + 44.0, SMALL, Anchor::Start, MUTED, false, &format!("{total} AR in all"));
    y + 58.0
}

fn no_sync_timeline() -> anyhow::Result<String> {
    let (every, buckets) = all_reduces_per_backward(false)?;
    let (last_only, _) = all_reduces_per_backward(true)?;
    let per_sync = every.iter().copied().max().unwrap_or(0);
    let mut svg = Svg::headed(
        "One optimizer step of 4 micro-batches: which backward syncs",
        &format!(
            "Counted on rank 0 of a real run on 2 ranks: the all-reduces (AR) each backward sent. A backward \
             that syncs sends {per_sync}: one per bucket ({buckets}: the MLP with caps of 1 KiB and 128 B) and \
             {} for the end-of-backward check that every rank's backward worked and used the same parameters. \
             Inside no_sync, backward only adds into .grad; the last backward averages the sums of all four. \
             Widths are schematic, not measured.",
            per_sync as usize - buckets
        ),
    );
    let y = svg.bottom() + 14.0;
    let y = draw_lane(&mut svg, y, "Without no_sync: every backward averages its gradients", &every);
    draw_lane(&mut svg, y, "With no_sync around the first three backwards: one sync per step", &last_only);
    let y = svg.bottom() + 22.0;
    svg.note(
        y,
        MUTED,
        "Drawn by cargo run --example figures from SimpleDistributedDataParallelism::backward and no_sync, \
         counting ProcessGroup::stats().all_reduce around each backward.",
    );
    Ok(svg.finish())
}
