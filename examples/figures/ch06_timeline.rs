//! Chapter 6's figure, one overlapped
//! step of the tiny GPT on each of 2 in-process ranks, without and with the
//! simulated link: forward, backward, when each bucket's all-reduce ran and
//! completed, and the wait after backward. Drawn by
//! `cargo run --example figures` from the data file that
//! `cargo run --release --example bench_overlap -- --timeline --timeline-data chapters/figures/data/overlap_timeline.tsv`
//! wrote (examples/support/overlap_timeline.rs records it).

use crate::svg::{text_width, Anchor, Svg, INK, MUTED, PALE, PALETTE, SMALL, TEXT};
use crate::timed_data::{read_data, DataFile};
use crate::Figure;

pub fn figures() -> Vec<Figure> {
    vec![Figure { file: "ch06-overlap-timeline.svg", draw: overlap_timeline }]
}

const DATA: &str = "overlap_timeline.tsv";
const LEFT: f64 = 150.0; // the lanes' labels
const RIGHT: f64 = 744.0;
const LANE: f64 = 22.0;

/// x of `ms` on the shared axis that ends at `end_ms`.
fn x_of(ms: f64, end_ms: f64) -> f64 {
    LEFT + (RIGHT - LEFT) * ms / end_ms
}

/// A bar from `from` to `to` ms, with a label inside when it fits.
#[allow(clippy::too_many_arguments)]
fn bar(svg: &mut Svg, from: f64, to: f64, end_ms: f64, y: f64, fill: &str, stroke: &str, label: &str) {
    let (x0, x1) = (x_of(from, end_ms), x_of(to, end_ms));
    svg.rect(x0, y, (x1 - x0).max(1.0), LANE, fill, Some(stroke));
    if text_width(label, SMALL) + 4.0 < x1 - x0 {
        svg.text((x0 + x1) / 2.0, y + 15.5, SMALL, Anchor::Middle, label);
    }
}

/// One rank's two lanes: compute (forward, backward, the wait after it) and
/// its all-reduces (each from the moment the communication thread took it
/// up, its launch or the previous one's end, to its completion), with a
/// tick at each launch. `rows` are this rank's rows of one case, in the
/// order the benchmark wrote them. Returns the y below the lanes.
fn rank_lanes(
    svg: &mut Svg,
    data: &DataFile,
    rows: &[&Vec<String>],
    end_ms: f64,
    y: f64,
) -> anyhow::Result<f64> {
    let rank = data.get(rows[0], "rank")?;
    svg.text(LEFT - 8.0, y + 15.5, SMALL, Anchor::End, &format!("rank {rank}: compute"));
    let lanes = [("forward", 4), ("backward", 0), ("wait", 5)];
    for row in rows {
        let part = data.get(row, "part")?;
        if let Some(&(label, colour)) = lanes.iter().find(|(name, _)| *name == part) {
            let (from, to) = (data.number(row, "from_ms")?, data.number(row, "to_ms")?);
            bar(svg, from, to, end_ms, y, PALE[colour], PALETTE[colour], label);
        }
    }
    let y = y + LANE + 6.0;
    svg.text(LEFT - 8.0, y + 15.5, SMALL, Anchor::End, "all-reduces");
    let mut previous_end = 0.0f64;
    let all_reduces = rows.iter().filter(|row| row.get(2).map(String::as_str) == Some("all-reduce"));
    for (i, row) in all_reduces.enumerate() {
        let (launched, completed) = (data.number(row, "from_ms")?, data.number(row, "to_ms")?);
        let ran_from = launched.max(previous_end);
        let colour = if i % 2 == 0 { 1 } else { 2 };
        bar(svg, ran_from, completed, end_ms, y, PALE[colour], PALETTE[colour], data.get(row, "bucket")?);
        let tick = x_of(launched, end_ms);
        svg.line((tick, y - 5.0), (tick, y), INK, 1.0);
        previous_end = completed;
    }
    Ok(y + LANE + 10.0)
}

/// The time axis: a tick every `step` ms.
fn axis(svg: &mut Svg, end_ms: f64, y: f64) {
    svg.line((LEFT, y), (RIGHT, y), MUTED, 1.0);
    // About 8 ticks, at round numbers.
    let step = [1.0, 2.0, 5.0, 10.0, 20.0, 50.0].into_iter().find(|&s| end_ms / s <= 10.0).unwrap_or(100.0);
    let mut ms = 0.0;
    while ms <= end_ms + 1e-9 {
        let x = x_of(ms, end_ms);
        svg.line((x, y), (x, y + 5.0), MUTED, 1.0);
        svg.text_styled(x, y + 19.0, SMALL, Anchor::Middle, MUTED, false, &format!("{ms:.0} ms"));
        ms += step;
    }
}

fn overlap_timeline() -> anyhow::Result<String> {
    let data = read_data(DATA)?;
    let mut end_ms = 0.0f64;
    for row in &data.rows {
        end_ms = end_ms.max(data.number(row, "to_ms")?);
    }
    let end_ms = end_ms.ceil();
    let mut svg = Svg::headed(
        "One overlapped step on 2 ranks: buckets leave during backward",
        "Each rank computes forward, then backward; a bucket's all-reduce is launched (tick) as soon as its last \
         gradient is ready, and runs on the rank's communication thread (numbered bars, one after another) while \
         backward goes on. What is left when backward ends is the wait. Same time scale in both panels.",
    );
    let mut y = svg.bottom() + 18.0;
    let (latency, gbit) = (data.about("latency_us")?, data.about("gbit")?);
    for link in ["no", "yes"] {
        let heading = if link == "yes" {
            format!("With a simulated link ({latency} µs and {gbit} Gbit/s per all-reduce)")
        } else {
            "Without a link: all-reduces between threads cost almost nothing".to_string()
        };
        svg.text_styled(16.0, y + 14.0, TEXT, Anchor::Start, INK, true, &heading);
        y += 26.0;
        for rank in ["0", "1"] {
            let rows: Vec<&Vec<String>> = data
                .rows
                .iter()
                .filter(|row| row[0] == link && row.get(1).map(String::as_str) == Some(rank))
                .collect();
            anyhow::ensure!(!rows.is_empty(), "{DATA} has no rows for rank {rank} with link `{link}`");
            y = rank_lanes(&mut svg, &data, &rows, end_ms, y)?;
        }
        axis(&mut svg, end_ms, y);
        y += 36.0;
    }
    let caption = format!(
        "Measured by \"{}\" on this workbook's {}-core machine (1-minute load average {} before, {} after), \
         buckets of {} KiB: of 100 steps after 5 warm-up steps in a fresh group, the fastest, the one least \
         disturbed by the machine's other work; a watcher thread per rank notes each completion \
         (examples/support/timed_group.rs). Timings vary from run to run; the order does not.",
        data.about("command")?,
        data.about("cores")?,
        data.about("load_before")?,
        data.about("load_after")?,
        data.about("bucket_kib")?,
    );
    svg.note(y, MUTED, &caption);
    Ok(svg.finish())
}
