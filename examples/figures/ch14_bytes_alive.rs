//! Chapter 14's figure: the bytes of parameters, gradients and AdamW state
//! that rank 0 of 2 holds over one step, under DDP, ZeRO-1, ZeRO-2 and FSDP: FSDP's
//! gathers rising before each unit computes and its frees falling after.
//! Drawn from chapters/figures/data/fsdp_memory.tsv, which
//! `cargo run --example memory_per_rank -- --table chapters/tables/fsdp-memory.md --data chapters/figures/data/fsdp_memory.tsv`
//! writes from the library's ledgers (its bytes are the same on every run).

use crate::chart::{Plot, Scale};
use crate::svg::{Svg, MUTED, PALETTE};
use crate::timed_data::read_data;
use crate::Figure;

pub fn figures() -> Vec<Figure> {
    vec![Figure { file: "ch14-bytes-alive.svg", draw: bytes_alive }]
}

const STRATEGIES: [&str; 4] = ["DDP", "ZeRO-1", "ZeRO-2", "FSDP"];

fn bytes_alive() -> anyhow::Result<String> {
    let data = read_data("fsdp_memory.tsv")?;
    let mut lines: Vec<Vec<f64>> = vec![vec![]; STRATEGIES.len()];
    for row in &data.rows {
        let strategy = data.get(row, "strategy")?;
        let Some(s) = STRATEGIES.iter().position(|name| *name == strategy) else {
            anyhow::bail!("fsdp_memory.tsv names an unknown strategy `{strategy}`");
        };
        let total = data.number(row, "parameters")?
            + data.number(row, "gradients")?
            + data.number(row, "optimizer_state")?;
        lines[s].push(total / 1e6);
    }
    let top = lines.iter().flatten().fold(0.0f64, |a, &b| a.max(b));
    let mut svg = Svg::headed(
        "Bytes alive on one rank over one step, 2 ranks",
        "Parameters, gradients and AdamW's moments that rank 0 holds during one step of an 8-block GPT \
         (float32). DDP and ZeRO-1 hold every parameter all the time and every gradient from backward on; \
         ZeRO-1 keeps half the moments. ZeRO-2 also lets each bucket's full gradients go once its \
         reduce-scatter has left, keeping half of them. FSDP keeps half of everything and rises only while a unit is \
         gathered: each all-gather raises it, each free lowers it, in forward and again in backward.",
    );
    let plot = Plot {
        left: 96.0,
        top: svg.bottom() + 40.0,
        width: 600.0,
        height: 300.0,
        x: Scale::linear(0.0, 1.0),
        y: Scale::linear(0.0, (top * 1.1).ceil()),
    };
    let y_ticks: Vec<(f64, String)> =
        (0..=(top * 1.1).ceil() as i64).map(|mb| (mb as f64, format!("{mb} MB"))).collect();
    let x_ticks = vec![(0.0, "start".to_string()), (1.0, "end of the step".to_string())];
    plot.axes(&mut svg, &x_ticks, &y_ticks, ("the step's allocations and frees, in order", "bytes alive"));
    for (s, totals) in lines.iter().enumerate() {
        let n = totals.len().max(2) - 1;
        let mut points = vec![];
        for (i, &total) in totals.iter().enumerate() {
            let x = i as f64 / n as f64;
            if let Some(&(_, previous)) = points.last() {
                points.push((x, previous));
            }
            points.push((x, total));
        }
        if let Some(&(_, last)) = points.last() {
            points.push((1.0, last));
        }
        plot.line(&mut svg, &points, PALETTE[s], false);
    }
    let mut y = svg.bottom() + 26.0;
    for (s, name) in STRATEGIES.iter().enumerate() {
        let peak = lines[s].iter().fold(0.0f64, |a, &b| a.max(b));
        Plot::legend(&mut svg, 16.0, y, PALETTE[s], false, &format!("{name}: peak {peak:.2} MB"));
        y += 20.0;
    }
    svg.note(
        y + 6.0,
        MUTED,
        &format!(
            "Drawn by cargo run --example figures from chapters/figures/data/fsdp_memory.tsv, written by `{}` \
             from the library's MemoryLedger (ZeRO-2 and FSDP: every event they record; DDP and ZeRO-1: the tensors \
             they hold, in the order the step creates them). The x axis counts events, not time.",
            data.about("command")?
        ),
    );
    Ok(svg.finish())
}
