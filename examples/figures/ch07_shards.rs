//! Chapter 7's figure, each rank's shard of
//! a 10-example data set on 3 ranks across two epochs, from the library's
//! `DistributedSampler`: the tail padded (drop_last = false) or dropped
//! (drop_last = true). Drawn by `cargo run --example figures`.

use anyhow::ensure;
use ddp_workbook::ddp::{DistributedSampler, SamplerOptions};

use crate::svg::{Anchor, Svg, INK, MUTED, PALE, PALETTE, SMALL, TEXT};
use crate::Figure;

pub fn figures() -> Vec<Figure> {
    vec![Figure { file: "ch07-shards.svg", draw: shards }]
}

const DATASET_LEN: i64 = 10;
const RANKS: usize = 3;
const SEED: u64 = 0;

/// What the samplers of every rank hand out in one epoch: each rank's
/// indices, and the epoch's whole order (the same on every rank).
struct Epoch {
    per_rank: Vec<Vec<i64>>,
    order: Vec<i64>,
}

fn epoch(drop_last: bool, epoch: u64) -> anyhow::Result<Epoch> {
    let options = SamplerOptions { shuffle: true, seed: SEED, drop_last };
    let mut per_rank = Vec::new();
    let mut order = Vec::new();
    for rank in 0..RANKS {
        let mut sampler = DistributedSampler::with_options(DATASET_LEN, RANKS, rank, options)?;
        sampler.set_epoch(epoch);
        per_rank.push(sampler.indices());
        order = sampler.epoch_order();
    }
    Ok(Epoch { per_rank, order })
}

/// One block: the epoch's order as a strip of slots, each coloured by the
/// rank that takes it (slot j goes to rank j mod N, read back from the
/// ranks' own lists), then the padded or dropped tail; each rank's list on
/// the right. Returns the y below the block.
fn draw_epoch(svg: &mut Svg, y: f64, label: &str, epoch: &Epoch) -> anyhow::Result<f64> {
    let (left, slot) = (118.0, 30.0);
    svg.text(16.0, y + 20.0, TEXT, Anchor::Start, label);
    let taken = epoch.per_rank[0].len() * RANKS; // slots handed out, padding included
    for j in 0..taken {
        let rank = j % RANKS;
        let index = epoch.per_rank[rank][j / RANKS];
        let x = left + slot * j as f64;
        let padded = j >= epoch.order.len();
        // The strip is the sampler's own order: slot j holds order[j], or,
        // past the end, the order again from its start (the padding).
        ensure!(
            index == epoch.order[j % epoch.order.len()],
            "slot {j}: rank {rank} got {index}, not the order's"
        );
        svg.rect(x, y + 2.0, slot - 3.0, 26.0, PALE[rank], Some(PALETTE[rank]));
        if padded {
            svg.dashed_rect(x + 2.0, y + 4.0, slot - 7.0, 22.0, INK);
        }
        svg.text_styled(
            x + (slot - 3.0) / 2.0,
            y + 20.0,
            TEXT,
            Anchor::Middle,
            INK,
            padded,
            &index.to_string(),
        );
    }
    for (j, &index) in epoch.order.iter().enumerate().skip(taken) {
        let x = left + slot * j as f64;
        svg.rect(x, y + 2.0, slot - 3.0, 26.0, "#eeeeee", Some(MUTED));
        svg.text_styled(
            x + (slot - 3.0) / 2.0,
            y + 20.0,
            TEXT,
            Anchor::Middle,
            MUTED,
            false,
            &index.to_string(),
        );
        svg.line((x + 2.0, y + 26.0), (x + slot - 5.0, y + 4.0), MUTED, 1.5);
    }
    let lists_x = left + slot * 12.0 + 16.0;
    for (rank, indices) in epoch.per_rank.iter().enumerate() {
        let list: Vec<String> = indices.iter().map(i64::to_string).collect();
        let line_y = y + 10.0 + 15.0 * rank as f64;
        svg.text_styled(lists_x, line_y, SMALL, Anchor::Start, PALETTE[rank], true, &format!("rank {rank}"));
        svg.text(lists_x + 52.0, line_y, SMALL, Anchor::Start, &list.join(", "));
    }
    Ok(y + 52.0)
}

fn shards() -> anyhow::Result<String> {
    let mut svg = Svg::headed(
        &format!(
        "DistributedSampler: {DATASET_LEN} examples on {RANKS} ranks, shuffled from seed {SEED}, two epochs"
    ),
        "Each strip is one epoch's order, the same on every rank; slot j goes to rank j mod 3 (its colour). \
         set_epoch reshuffles. Bold in a dashed box: padding, the order's start again, so that every rank \
         gets as many; grey, struck out: dropped.",
    );
    let mut y = svg.bottom() + 18.0;
    for drop_last in [false, true] {
        let heading = if drop_last {
            "drop_last = true: the tail that does not fill a round of 3 is dropped (9 of 10 used)"
        } else {
            "drop_last = false (the default): the tail is padded to 12, two examples seen twice"
        };
        svg.text_styled(16.0, y + 14.0, TEXT, Anchor::Start, INK, true, heading);
        y += 24.0;
        for e in 0..2 {
            y = draw_epoch(&mut svg, y, &format!("epoch {e}"), &epoch(drop_last, e)?)?;
        }
        y += 8.0;
    }
    svg.note(
        y + 10.0,
        MUTED,
        "Drawn by cargo run --example figures from DistributedSampler::with_options(10, 3, rank, \
         SamplerOptions { shuffle: true, seed: 0, drop_last }), set_epoch, indices and epoch_order.",
    );
    Ok(svg.finish())
}
