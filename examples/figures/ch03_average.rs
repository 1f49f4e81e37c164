//! Chapter 3's figure, why the ranks
//! average their gradients. A real run on 3 in-process ranks: each computes
//! the MLP's gradient on its own third of a batch, the library's
//! `naive::sync_gradients` averages them, and one process computes the
//! gradient on the whole batch; the figure puts the first gradient entries
//! of all five side by side. Drawn by `cargo run --example figures`.

use ddp_workbook::data::Regression;
use ddp_workbook::ddp::naive;
use ddp_workbook::dist::spawn;
use ddp_workbook::models::{named_parameters, Mlp};
use ddp_workbook::tch::nn::Module;
use ddp_workbook::tch::{Kind, Tensor};

use crate::chart::{Plot, Scale};
use crate::svg::{Svg, INK, MUTED, PALETTE};
use crate::Figure;

pub fn figures() -> Vec<Figure> {
    vec![Figure { file: "ch03-average.svg", draw: average }]
}

const SIZES: [i64; 3] = [4, 8, 1];
const RANKS: usize = 3;
const PER_RANK: i64 = 32;
/// How many of the gradient's entries the figure shows (of 49).
const SHOWN: usize = 16;

/// The model's whole gradient, flat, in parameter order.
fn flat_gradient(vs: &ddp_workbook::tch::nn::VarStore) -> anyhow::Result<Vec<f64>> {
    let grads: Vec<Tensor> = named_parameters(vs).iter().map(|(_, p)| p.grad().reshape([-1])).collect();
    Ok(Vec::<f64>::try_from(&Tensor::cat(&grads, 0))?)
}

/// The gradient of the mean squared error on examples `first..first + n`.
fn gradient_on(
    first: i64,
    n: i64,
    also_sync: Option<&dyn ddp_workbook::dist::ProcessGroup>,
) -> anyhow::Result<[Vec<f64>; 2]> {
    let (vs, mlp) = Mlp::seeded(0, &SIZES, Kind::Double);
    let (x, y) = Regression::new(7, PER_RANK * RANKS as i64, 4, 1, Kind::Double).batch(first, n);
    (mlp.forward(&x) - &y).square().mean(Kind::Double).backward();
    let own = flat_gradient(&vs)?;
    if let Some(pg) = also_sync {
        naive::sync_gradients(pg, &named_parameters(&vs))?; // every rank now holds the average
    }
    Ok([own, flat_gradient(&vs)?])
}

fn average() -> anyhow::Result<String> {
    let ranks = spawn(RANKS, |pg| gradient_on(PER_RANK * pg.rank() as i64, PER_RANK, Some(pg.as_ref())))?;
    let [global, _] = gradient_on(0, PER_RANK * RANKS as i64, None)?;
    let averaged = &ranks[0][1];
    let largest_gap = averaged.iter().zip(&global).map(|(a, g)| (a - g).abs()).fold(0.0, f64::max);
    anyhow::ensure!(largest_gap < 1e-12, "the averaged gradient is {largest_gap:e} from the whole batch's");

    let mut svg = Svg::headed(
        "The average of the ranks' gradients is the gradient of the whole batch",
        "Three ranks hold the same MLP and each computes its gradient on its own third of a batch of 96 \
         examples: three different gradients. After one all-reduce per parameter (a sum over the ranks) and \
         a division by 3, every rank holds their average, which is the gradient one process computes on all \
         96 examples, because the loss is a mean over the batch. Without the division, every rank would step \
         3 times too far.",
    );
    let top = svg.bottom() + 40.0;
    let entries = ranks.iter().flat_map(|r| r[0][..SHOWN].iter()).chain(&global[..SHOWN]);
    let reach = (entries.fold(0.0_f64, |m, v| m.max(v.abs())) * 1.1 * 2.0).ceil() / 2.0; // a multiple of 0.5
    let plot = Plot {
        left: 76.0,
        top,
        width: 640.0,
        height: 230.0,
        x: Scale::linear(-0.5, SHOWN as f64 - 0.5),
        y: Scale::linear(-reach, reach),
    };
    let x_ticks: Vec<(f64, String)> = (0..SHOWN).step_by(3).map(|i| (i as f64, i.to_string())).collect();
    let y_ticks: Vec<(f64, String)> =
        (-2..=2).map(|i| reach * f64::from(i) / 2.0).map(|v| (v, format!("{v:.2}"))).collect();
    plot.axes(&mut svg, &x_ticks, &y_ticks, ("entry of the flattened gradient", "gradient value"));
    let points =
        |values: &[f64]| values[..SHOWN].iter().enumerate().map(|(i, &v)| (i as f64, v)).collect::<Vec<_>>();
    for (rank, run) in ranks.iter().enumerate() {
        plot.dots(&mut svg, &points(&run[0]), PALETTE[rank + 1]);
    }
    plot.line(&mut svg, &points(&global), MUTED, true);
    plot.dots(&mut svg, &points(averaged), INK);

    let y = svg.bottom() + 26.0;
    for rank in 0..RANKS {
        let label = format!("rank {rank}'s own gradient, on examples {}..{}", 32 * rank, 32 * (rank + 1));
        Plot::legend(&mut svg, 16.0, y + 20.0 * rank as f64, PALETTE[rank + 1], true, &label);
    }
    let y = y + 20.0 * RANKS as f64;
    Plot::legend(&mut svg, 16.0, y, INK, true, "every rank after the all-reduce (sum) and the division by 3");
    Plot::legend(&mut svg, 16.0, y + 20.0, MUTED, false, "one process, all 96 examples (dashed)");
    let y = svg.note(
        y + 46.0,
        INK,
        &format!(
            "The averaged gradient is {largest_gap:.1e} from the whole batch's, in float64 (all 49 entries)."
        ),
    );
    svg.note(
        y + 24.0,
        MUTED,
        "Drawn by cargo run --example figures from a run on 3 in-process ranks: Mlp::seeded(0, [4, 8, 1]), \
         ddp::naive::sync_gradients, and the same model's backward on the whole batch in one process.",
    );
    Ok(svg.finish())
}
