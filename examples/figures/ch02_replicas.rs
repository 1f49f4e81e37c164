//! Chapter 2's figure, two replicas
//! trained with averaged gradients, once built from different seeds and
//! once from the same seed and checked: the gap between their weights, and
//! each one's loss on its own data, step by step. A real run on 2
//! in-process ranks: the MLP, the library's `naive::sync_gradients`, plain
//! SGD, and `verify_replicas`' verdict at the start. Drawn by
//! `cargo run --example figures`.

use ddp_workbook::data::Regression;
use ddp_workbook::ddp::{naive, verify_replicas};
use ddp_workbook::dist::spawn;
use ddp_workbook::models::{named_parameters, Mlp};
use ddp_workbook::tch::nn::Module;
use ddp_workbook::tch::{self, Kind, Tensor};

use crate::chart::{Plot, Scale};
use crate::svg::{Svg, INK, MUTED, PALETTE};
use crate::Figure;

pub fn figures() -> Vec<Figure> {
    vec![Figure { file: "ch02-replicas.svg", draw: replicas }]
}

const SIZES: [i64; 4] = [4, 16, 16, 1];
const STEPS: usize = 30;
const LR: f64 = 0.1;

/// One rank's run: its weights (flat) and its loss on its own shard before
/// each step and after the last, and what `verify_replicas` said at the start.
struct RankRun {
    weights: Vec<Vec<f64>>,
    loss: Vec<f64>,
    verdict: Result<(), String>,
}

fn train(seed_of_rank: fn(usize) -> i64) -> anyhow::Result<Vec<RankRun>> {
    Ok(spawn(2, |pg| {
        let (vs, mlp) = Mlp::seeded(seed_of_rank(pg.rank()), &SIZES, Kind::Double);
        let params = named_parameters(&vs);
        let verdict = verify_replicas(pg.as_ref(), &params).map_err(|e| e.to_string());
        // One task; each rank trains on its own 64 examples of it.
        let (x, y) = Regression::new(7, 128, 4, 1, Kind::Double).batch(64 * pg.rank() as i64, 64);
        let mse = || (mlp.forward(&x) - &y).square().mean(Kind::Double);
        let (mut weights, mut loss) = (Vec::new(), Vec::new());
        for step in 0..=STEPS {
            let flat =
                Tensor::cat(&params.iter().map(|(_, p)| p.detach().reshape([-1])).collect::<Vec<_>>(), 0);
            weights.push(Vec::<f64>::try_from(&flat)?);
            loss.push(tch::no_grad(mse).double_value(&[]));
            if step == STEPS {
                break;
            }
            mse().backward();
            naive::sync_gradients(pg.as_ref(), &params)?; // every rank now holds the average
            tch::no_grad(|| {
                for (_, p) in &params {
                    let mut grad = p.grad();
                    let _ = p.shallow_clone().f_sub_(&(&grad * LR));
                    let _ = grad.zero_();
                }
            });
        }
        Ok(RankRun { weights, loss, verdict })
    })?)
}

/// The largest difference between rank 1's and rank 0's weights, per step.
fn gap(runs: &[RankRun]) -> Vec<f64> {
    runs[0]
        .weights
        .iter()
        .zip(&runs[1].weights)
        .map(|(w0, w1)| w0.iter().zip(w1).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max))
        .collect()
}

fn steps(values: &[f64]) -> Vec<(f64, f64)> {
    values.iter().enumerate().map(|(step, &v)| (step as f64, v)).collect()
}

fn replicas() -> anyhow::Result<String> {
    let apart = train(|rank| rank as i64)?; // seed = rank: the bug
    let alike = train(|_| 0)?; // one seed for all
    let (gap_apart, gap_alike) = (gap(&apart), gap(&alike));
    let same = alike[0].weights == alike[1].weights;
    anyhow::ensure!(same, "the replicas built from one seed drifted apart");

    let mut svg = Svg::headed(
        "Replicas from different seeds never come together, and nothing looks wrong",
        "Two ranks train the same MLP with averaged gradients (one all-reduce per parameter) and SGD, each on \
         its own half of one data set. Built from seeds 0 and 1, both apply the same averaged update to \
         different weights: the gap between them stays what it was at the start, while each rank's loss goes \
         down as if all were well. Built from seed 0 on both, they are bitwise equal at every step.",
    );
    let top = svg.bottom() + 40.0;
    let max_gap = gap_apart.iter().cloned().fold(0.0, f64::max);
    let gap_plot = Plot {
        left: 76.0,
        top,
        width: 260.0,
        height: 190.0,
        x: Scale::linear(0.0, STEPS as f64),
        y: Scale::linear(0.0, (max_gap * 1.25 * 10.0).ceil() / 10.0),
    };
    let step_ticks: Vec<(f64, String)> = (0..=STEPS).step_by(10).map(|s| (s as f64, s.to_string())).collect();
    let gap_ticks: Vec<(f64, String)> =
        (0..=4).map(|i| gap_plot.y.max * f64::from(i) / 4.0).map(|v| (v, format!("{v:.2}"))).collect();
    gap_plot.axes(&mut svg, &step_ticks, &gap_ticks, ("step", "largest |rank 1 weight − rank 0 weight|"));
    gap_plot.line(&mut svg, &steps(&gap_apart), PALETTE[5], false);
    gap_plot.line(&mut svg, &steps(&gap_alike), PALETTE[0], false);

    let losses = apart.iter().chain(&alike).flat_map(|run| run.loss.iter().cloned());
    let max_loss = losses.fold(0.0, f64::max);
    let loss_plot =
        Plot { left: 456.0, y: Scale::linear(0.0, (max_loss * 1.1 * 10.0).ceil() / 10.0), ..gap_plot };
    let loss_ticks: Vec<(f64, String)> =
        (0..=4).map(|i| loss_plot.y.max * f64::from(i) / 4.0).map(|v| (v, format!("{v:.2}"))).collect();
    loss_plot.axes(&mut svg, &step_ticks, &loss_ticks, ("step", "each rank's loss on its own data"));
    loss_plot.line(&mut svg, &steps(&apart[0].loss), PALETTE[5], false);
    loss_plot.line(&mut svg, &steps(&apart[1].loss), PALETTE[5], true);
    loss_plot.line(&mut svg, &steps(&alike[0].loss), PALETTE[0], false);
    loss_plot.line(&mut svg, &steps(&alike[1].loss), PALETTE[0], true);

    let y = svg.bottom() + 26.0;
    Plot::legend(&mut svg, 16.0, y, PALETTE[5], false, "seeds 0 and 1 (loss: rank 0 solid, rank 1 dashed)");
    Plot::legend(&mut svg, 16.0, y + 20.0, PALETTE[0], false, "seed 0 on both (gap 0: the ranks are equal)");
    // The error's first clause: which tensor, which rank, by how much.
    let verdict = |runs: &[RankRun]| match &runs[0].verdict {
        Ok(()) => "passes".to_string(),
        Err(error) => format!("refuses: \"{}\"", error.split(" (").next().unwrap_or_default()),
    };
    let y = svg.note(
        y + 46.0,
        INK,
        &format!(
            "At construction, verify_replicas on seed 0 {}; on seeds 0 and 1 it {}.",
            verdict(&alike),
            verdict(&apart)
        ),
    );
    svg.note(
        y + 24.0,
        MUTED,
        "Drawn by cargo run --example figures from a run on 2 in-process ranks: Mlp::seeded, \
         ddp::naive::sync_gradients, SGD (lr 0.1), ddp::verify_replicas.",
    );
    Ok(svg.finish())
}
