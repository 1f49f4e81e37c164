//! Chapter 99's figure: tokens/s and peak memory per rank against the
//! GPT's size, for DDP, ZeRO-1, ZeRO-2 and FSDP, ours and PyTorch's, on 2
//! ranks. Drawn from chapters/figures/data/sizes.tsv, which
//! `cargo run --release --features mpi --example bench_sizes -- --table chapters/tables/vs-pytorch-sizes.md --data chapters/figures/data/sizes.tsv`
//! writes: the runs its targets compare (ours on 2 MPI processes, PyTorch's
//! at its best settings), the median over the rounds.

use crate::chart::{Plot, Scale};
use crate::svg::{Svg, MUTED, PALETTE};
use crate::timed_data::{read_data, DataFile};
use crate::Figure;

pub fn figures() -> Vec<Figure> {
    vec![Figure { file: "ch99-sizes.svg", draw: sizes }]
}

const STRATEGIES: [&str; 4] = ["DDP", "ZeRO-1", "ZeRO-2", "FSDP"];
const SYSTEMS: [&str; 2] = ["ours", "PyTorch"];

/// One line: (parameters, median) per size, in the data's order of sizes.
fn line(data: &DataFile, strategy: &str, system: &str, column: &str) -> anyhow::Result<Vec<(f64, f64)>> {
    let mut by_size: Vec<(f64, Vec<f64>)> = vec![];
    for row in &data.rows {
        let matches = data.get(row, "compared")? == "true"
            && data.get(row, "strategy")? == strategy
            && data.get(row, "system")? == system;
        if !matches {
            continue;
        }
        let (params, value) = (data.number(row, "parameters")?, data.number(row, column)?);
        match by_size.iter_mut().find(|(p, _)| *p == params) {
            Some((_, values)) => values.push(value),
            None => by_size.push((params, vec![value])),
        }
    }
    anyhow::ensure!(!by_size.is_empty(), "sizes.tsv has no compared run of {system} {strategy}");
    Ok(by_size
        .into_iter()
        .map(|(params, mut values)| {
            values.sort_by(f64::total_cmp);
            (params, values[values.len() / 2]) // the tables' median: the upper middle
        })
        .collect())
}

/// A log scale from the 1-2-5 value at or below `min` to the one at or
/// above `max`, with a tick at each 1-2-5 value, labelled by `label`.
fn one_two_five(min: f64, max: f64, label: impl Fn(f64) -> String) -> (Scale, Vec<(f64, String)>) {
    let decade = min.log10().floor() as i32;
    let values: Vec<f64> = (decade..=max.log10().ceil() as i32)
        .flat_map(|e| [1.0, 2.0, 5.0].map(|m| m * 10f64.powi(e)))
        .collect();
    let low = values.iter().copied().filter(|&v| v <= min).fold(values[0], f64::max);
    let high = values.iter().copied().find(|&v| v >= max).unwrap_or(max);
    let ticks = values.into_iter().filter(|&v| v >= low && v <= high).map(|v| (v, label(v))).collect();
    (Scale::log(low, high), ticks)
}

fn sizes() -> anyhow::Result<String> {
    let data = read_data("sizes.tsv")?;
    let panels = [
        ("tokens_per_second", "tokens/s, both ranks", "tokens/s"),
        ("peak_mib", "peak resident memory per rank", "MiB"),
    ];
    let mut svg = Svg::headed(
        "Speed and memory per rank against the model's size, 2 ranks",
        "The GPT at about 0.1M, 2M, 10M and 25M parameters, trained on 2 ranks of one thread each with \
         DDP, ZeRO-1, ZeRO-2 and FSDP: ours (solid, 2 MPI processes) and PyTorch's (dashed: DDP and \
         ZeroRedundancyOptimizer at their best settings, fully_shard with fused AdamW), the median of the \
         rounds. Both axes are logarithmic. Speed falls with the work per token. Memory per rank starts at \
         what each library costs to load and grows with the model; the sharded strategies stand above DDP \
         there, because the allocator keeps the blocks they free and gather again every step.",
    );
    let mut y = svg.bottom() + 40.0;
    for (column, title, unit) in panels {
        let mut lines = vec![];
        for (s, strategy) in STRATEGIES.iter().enumerate() {
            for (k, system) in SYSTEMS.iter().enumerate() {
                lines.push((s, k == 1, line(&data, strategy, system, column)?));
            }
        }
        let points = lines.iter().flat_map(|(_, _, points)| points.iter());
        let (x_min, x_max, y_min, y_max) = points.fold(
            (f64::MAX, f64::MIN, f64::MAX, f64::MIN),
            |(a, b, c, d), &(x, y)| (a.min(x), b.max(x), c.min(y), d.max(y)),
        );
        let (x, x_ticks) = one_two_five(x_min, x_max, thousands_short);
        let (y_scale, y_ticks) = one_two_five(y_min, y_max, |v| format!("{} {unit}", thousands_short(v)));
        let plot = Plot { left: 110.0, top: y, width: 560.0, height: 240.0, x, y: y_scale };
        plot.axes(&mut svg, &x_ticks, &y_ticks, ("parameters", title));
        for (s, dashed, points) in &lines {
            plot.line(&mut svg, points, PALETTE[*s], *dashed);
            plot.dots(&mut svg, points, PALETTE[*s]);
        }
        y = plot.top + plot.height + 80.0;
    }
    for (s, strategy) in STRATEGIES.iter().enumerate() {
        Plot::legend(&mut svg, 16.0, y, PALETTE[s], false, &format!("{strategy}: ours solid, PyTorch's dashed"));
        y += 20.0;
    }
    svg.note(
        y + 6.0,
        MUTED,
        &format!(
            "Drawn by cargo run --example figures from chapters/figures/data/sizes.tsv, written by `{}` on {}; \
             the load: {}. The tables with every run, their spread and the targets are in \
             chapters/tables/vs-pytorch-sizes.md.",
            data.about("command")?,
            data.about("machine")?,
            data.about("load")?
        ),
    );
    Ok(svg.finish())
}

/// 1e5 -> "100k", 2.5e7 -> "25M": a tick's value in few characters.
fn thousands_short(value: f64) -> String {
    match value {
        v if v >= 1e6 => format!("{}M", v / 1e6),
        v if v >= 1e3 => format!("{}k", v / 1e3),
        v => format!("{v}"),
    }
}
