//! Chapter 1's cost model against a
//! measurement. The in-process all_reduce's time against the message size,
//! as measured by `bench_collectives` (its points, written with `--data`
//! to chapters/figures/data/collectives.tsv), and the α–β model
//! t(n) = α + n·β through the smallest and the largest, per world size. A timed figure: its
//! caption carries the command, the machine and its load, from the file.
//! Drawn by `cargo run --example figures`.

use std::path::Path;

use anyhow::{ensure, Context};

use crate::chart::{Plot, Scale};
use crate::svg::{Svg, MUTED, PALETTE};
use crate::Figure;

pub fn figures() -> Vec<Figure> {
    vec![Figure { file: "ch01-alpha-beta.svg", draw: alpha_beta }]
}

/// One measured point: bytes, ranks, seconds per all_reduce.
struct Point {
    bytes: f64,
    ranks: usize,
    seconds: f64,
}

/// The points and the `#` lines of the data file.
fn read_points() -> anyhow::Result<(Vec<Point>, Vec<String>)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("chapters/figures/data/collectives.tsv");
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!("reading {}: run the command in examples/bench_collectives.rs's header", path.display())
    })?;
    let notes = text.lines().filter_map(|line| line.strip_prefix("# ")).map(str::to_string).collect();
    let mut points = Vec::new();
    for line in text.lines().filter(|line| !line.starts_with('#')).skip(1) {
        let fields: Vec<&str> = line.split('\t').collect();
        ensure!(fields.len() == 4, "{}: a line of 4 tab-separated fields, got {line:?}", path.display());
        points.push(Point {
            bytes: fields[0].parse()?,
            ranks: fields[1].parse()?,
            seconds: fields[2].parse()?,
        });
    }
    ensure!(!points.is_empty(), "{} holds no points", path.display());
    Ok((points, notes))
}

/// α and β of t = α + n·β through two of the points: α is the smallest
/// message's time (its bytes cost next to nothing), β the largest message's
/// time beyond α, per byte. The points between show how well one line fits.
fn fit(points: &[&Point]) -> (f64, f64) {
    let by_size = |a: &&&Point, b: &&&Point| a.bytes.total_cmp(&b.bytes);
    let (smallest, largest) = (points.iter().min_by(by_size), points.iter().max_by(by_size));
    let (Some(smallest), Some(largest)) = (smallest, largest) else { return (0.0, 0.0) };
    let alpha = smallest.seconds;
    (alpha, ((largest.seconds - alpha) / largest.bytes).max(0.0))
}

/// "4 KiB", "64 KiB", "25 MiB".
fn size_label(bytes: f64) -> String {
    if bytes >= 1024.0 * 1024.0 {
        format!("{} MiB", (bytes / 1024.0 / 1024.0).round())
    } else {
        format!("{} KiB", (bytes / 1024.0).round())
    }
}

fn alpha_beta() -> anyhow::Result<String> {
    let (points, notes) = read_points()?;
    let mut world_sizes: Vec<usize> = points.iter().map(|p| p.ranks).collect();
    world_sizes.sort_unstable();
    world_sizes.dedup();
    let min_bytes = points.iter().map(|p| p.bytes).fold(f64::MAX, f64::min);
    let max_bytes = points.iter().map(|p| p.bytes).fold(0.0, f64::max);

    let mut svg = Svg::headed(
        "The α–β model against the measured in-process all_reduce",
        "Sending n bytes costs α + n·β: a fixed latency α, which dominates small messages (the flat left \
         part), and a time per byte β, which dominates large ones (the slope). Dots: bench_collectives' \
         medians; lines: the model through each world size's smallest and largest message. Both axes logarithmic.",
    );
    let decades = |min: f64, max: f64| -> Vec<f64> {
        let (lo, hi) = (min.log10().floor() as i32, max.log10().ceil() as i32);
        (lo..=hi).map(|e| 10f64.powi(e)).collect()
    };
    let times = points.iter().map(|p| p.seconds);
    let (t_min, t_max) = (times.clone().fold(f64::MAX, f64::min), times.fold(0.0, f64::max));
    let y_decades = decades(t_min / 2.0, t_max * 2.0);
    let plot = Plot {
        left: 96.0,
        top: svg.bottom() + 40.0,
        width: 600.0,
        height: 300.0,
        x: Scale::log(min_bytes / 1.5, max_bytes * 1.5),
        y: Scale::log(y_decades[0], y_decades[y_decades.len() - 1]),
    };
    let mut sizes: Vec<f64> = points.iter().map(|p| p.bytes).collect();
    sizes.dedup();
    let x_ticks: Vec<(f64, String)> = sizes.iter().map(|&b| (b, size_label(b))).collect();
    let time_label = |s: f64| if s >= 1e-3 { format!("{} ms", s * 1e3) } else { format!("{} µs", s * 1e6) };
    let y_ticks: Vec<(f64, String)> = y_decades.iter().map(|&s| (s, time_label(s))).collect();
    plot.axes(&mut svg, &x_ticks, &y_ticks, ("message size n (f32 tensor)", "time per all_reduce"));

    let mut fits = Vec::new();
    for (i, &ranks) in world_sizes.iter().enumerate() {
        let own: Vec<&Point> = points.iter().filter(|p| p.ranks == ranks).collect();
        let (alpha, beta) = fit(&own);
        let curve: Vec<(f64, f64)> = (0..=60)
            .map(|k| plot.x.min * (plot.x.max / plot.x.min).powf(f64::from(k) / 60.0))
            .map(|n| (n, (alpha + n * beta).max(plot.y.min)))
            .collect();
        plot.line(&mut svg, &curve, PALETTE[i], false);
        plot.dots(&mut svg, &own.iter().map(|p| (p.bytes, p.seconds)).collect::<Vec<_>>(), PALETTE[i]);
        fits.push((ranks, alpha, beta));
    }
    let mut y = svg.bottom() + 26.0;
    for (i, (ranks, alpha, beta)) in fits.iter().enumerate() {
        let label = format!("{ranks} ranks: α = {:.0} µs, 1/β = {:.2} GB/s", alpha * 1e6, 1.0 / beta / 1e9);
        Plot::legend(&mut svg, 16.0, y, PALETTE[i], true, &label);
        y += 20.0;
    }
    let y = svg.note(y + 6.0, MUTED, &format!("Measured: {}", notes.join("; ")));
    svg.note(
        y + 20.0,
        MUTED,
        "Drawn by cargo run --example figures from chapters/figures/data/collectives.tsv. The in-process \
         backend moves bytes through memory, not a network: its α is a thread hand-off, its β memory \
         bandwidth shared by every rank, so more ranks on 2 cores cost more per byte.",
    );
    Ok(svg.finish())
}
