//! Chapter 8's figures, both from timed
//! runs whose output the repository commits in `chapters/figures/data/`:
//! - the training run's loss and accuracy curves, and its held-out verdict,
//!   from its log: `cargo run --release --example train > chapters/figures/data/train.log`;
//! - where a step's time goes (data, forward, backward, sync, optimizer) on
//!   1, 2 and 4 ranks:
//!   `cargo run --release --example bench_scaling -- --data chapters/figures/data/scaling.tsv`.
//!
//! Drawn by `cargo run --example figures`.

use crate::chart::{Plot, Scale};
use crate::svg::{text_width, Anchor, Svg, INK, MUTED, PALE, PALETTE, SMALL};
use crate::timed_data::{read_data, read_text};
use crate::Figure;

pub fn figures() -> Vec<Figure> {
    vec![
        Figure { file: "ch08-training-curves.svg", draw: training_curves },
        Figure { file: "ch08-scaling-phases.svg", draw: scaling_phases },
    ]
}

/// One logged step: (step, loss, accuracy of the global batch).
type Logged = (f64, f64, f64);

/// The `step N | loss X | accuracy Y | ...` lines of the run's log, its
/// first line, and its held-out (accuracy, loss) from the verdict line.
fn read_log(text: &str) -> anyhow::Result<(Vec<Logged>, String, (f64, f64))> {
    let mut logged = vec![];
    for line in text.lines().filter(|line| line.starts_with("step ")) {
        let parts: Vec<&str> = line.split('|').map(str::trim).collect();
        let value = |i: usize| -> anyhow::Result<f64> {
            let word = parts.get(i).and_then(|p| p.split_whitespace().nth(1));
            word.and_then(|w| w.parse().ok())
                .ok_or_else(|| anyhow::anyhow!("train.log: cannot read `{line}`"))
        };
        logged.push((value(0)?, value(1)?, value(2)?));
    }
    let verdict = text.lines().find(|line| line.contains("held-out accuracy")).unwrap_or_default();
    let after = |key: &str| -> Option<f64> {
        let rest = verdict.split(key).nth(1)?;
        rest.split(|c: char| !(c.is_ascii_digit() || c == '.')).find(|w| !w.is_empty())?.parse().ok()
    };
    let held_out = after("held-out accuracy").zip(after("held-out loss"));
    let held_out = held_out
        .ok_or_else(|| anyhow::anyhow!("train.log has no verdict line with the held-out accuracy"))?;
    anyhow::ensure!(!logged.is_empty(), "train.log has no `step N | loss ...` line");
    Ok((logged, text.lines().next().unwrap_or_default().to_string(), held_out))
}

/// One chart of `logged`'s column (`value` picks it) against the step: its
/// ticks, the guessing level dashed and labelled, the curve and its dots.
struct Curve<'a> {
    title: &'a str,
    left: f64,
    top_value: f64,
    ticks: &'a [f64],
    guessing: (f64, &'a str),
    colour: &'a str,
}

fn draw_curve(svg: &mut Svg, curve: &Curve, top: f64, last_step: f64, points: &[(f64, f64)]) -> Plot {
    let plot = Plot {
        left: curve.left,
        top,
        width: 290.0,
        height: 170.0,
        x: Scale::linear(0.0, last_step),
        y: Scale::linear(0.0, curve.top_value),
    };
    let x_ticks: Vec<(f64, String)> =
        (0..=(last_step / 100.0) as usize).map(|i| (100.0 * i as f64, format!("{}", 100 * i))).collect();
    let decimals = if curve.top_value > 1.0 { 0 } else { 2 };
    let y_ticks: Vec<(f64, String)> = curve.ticks.iter().map(|&v| (v, format!("{v:.decimals$}"))).collect();
    plot.axes(svg, &x_ticks, &y_ticks, ("optimizer step", curve.title));
    let (level, label) = curve.guessing;
    plot.line(svg, &[(0.0, level), (last_step, level)], MUTED, true);
    let (x, y) = plot.at(last_step, level);
    svg.text_styled(x - 4.0, y - 6.0, SMALL, Anchor::End, MUTED, false, label);
    plot.line(svg, points, curve.colour, false);
    plot.dots(svg, points, curve.colour);
    plot
}

fn training_curves() -> anyhow::Result<String> {
    let (logged, first_line, (held_accuracy, held_loss)) = read_log(&read_text("train.log")?)?;
    let last_step = logged.last().map_or(1.0, |l| l.0);
    let mut svg = Svg::headed(
        "The training run: loss and accuracy, step by step",
        &format!("From the run's log: {first_line}."),
    );
    let top = svg.bottom() + 40.0;
    let loss = Curve {
        title: "Loss (global batch, sorted half)",
        left: 60.0,
        top_value: 3.0,
        ticks: &[0.0, 1.0, 2.0, 3.0],
        guessing: (15f64.ln(), "guessing: ln 15 = 2.71"),
        colour: PALETTE[0],
    };
    draw_curve(&mut svg, &loss, top, last_step, &logged.iter().map(|l| (l.0, l.1)).collect::<Vec<_>>());
    let accuracy = Curve {
        title: "Accuracy (global batch, sorted half)",
        left: 440.0,
        top_value: 1.0,
        ticks: &[0.0, 0.25, 0.5, 0.75, 1.0],
        guessing: (1.0 / 15.0, "guessing: 1/15"),
        colour: PALETTE[2],
    };
    let points: Vec<(f64, f64)> = logged.iter().map(|l| (l.0, l.2)).collect();
    let plot = draw_curve(&mut svg, &accuracy, top, last_step, &points);
    let (x, y) = plot.at(last_step, held_accuracy);
    svg.rect(x - 6.0, y - 6.0, 12.0, 12.0, PALE[5], Some(PALETTE[5]));
    let held = format!("held-out: {held_accuracy:.4}");
    svg.text_styled(x - 10.0, y + 24.0, SMALL, Anchor::End, INK, false, &held);
    svg.note(
        svg.bottom() + 24.0,
        MUTED,
        &format!(
            "Dots: the global batch's mean loss and accuracy at each logged step, over the half of each sequence that \
             can be predicted (the sorted symbols). Square: the accuracy on 2000 sequences the run never trained on, \
             after the last step (held-out loss {held_loss:.4}). The log is the output of \"cargo run --release --example train\" \
             (chapters/figures/data/train.log); these numbers are the same on every run with the same flags."
        ),
    );
    Ok(svg.finish())
}

/// The phases of a step, in the order a step runs them, with their colours.
const PHASES: [(&str, usize); 5] =
    [("data", 6), ("forward", 4), ("backward", 0), ("sync", 5), ("optimizer", 2)];

fn scaling_phases() -> anyhow::Result<String> {
    let data = read_data("scaling.tsv")?;
    let step_ms = |row: &[String]| -> anyhow::Result<f64> {
        PHASES.iter().map(|(name, _)| data.number(row, name)).sum()
    };
    let mut longest = 0.0f64;
    for row in &data.rows {
        longest = longest.max(step_ms(row)?);
    }
    let (left, right) = (130.0, 560.0);
    let scale = (right - left) / longest;
    let mut svg = Svg::headed(
        "Where a training step's time goes, on 1, 2 and 4 ranks",
        &format!(
            "Rank 0's time per optimizer step, split into its phases; every run trains on the same global batch of \
             {} sequences, so a shorter bar is a faster run. The ranks share the machine's {} cores.",
            data.about("global_batch")?,
            data.about("cores")?
        ),
    );
    let mut y = svg.bottom() + 22.0;
    let mut x = left;
    for (name, colour) in PHASES {
        svg.rect(x, y - 11.0, 14.0, 14.0, PALE[colour], Some(PALETTE[colour]));
        svg.text(x + 20.0, y, SMALL, Anchor::Start, name);
        x += 40.0 + text_width(name, SMALL);
    }
    y += 18.0;
    for row in &data.rows {
        let label = format!("{} × {} thread(s)", data.get(row, "ranks")?, data.get(row, "threads_per_rank")?);
        svg.text(left - 8.0, y + 20.0, SMALL, Anchor::End, &label);
        let mut x = left;
        for (name, colour) in PHASES {
            let ms = data.number(row, name)?;
            let w = ms * scale;
            svg.rect(x, y, w.max(0.5), 30.0, PALE[colour], Some(PALETTE[colour]));
            if w > 34.0 {
                svg.text(x + w / 2.0, y + 20.0, SMALL, Anchor::Middle, &format!("{ms:.1}"));
            }
            x += w;
        }
        let summary = format!("{:.1} ms, {} tokens/s", step_ms(row)?, data.get(row, "tokens_per_second")?);
        svg.text(x + 8.0, y + 20.0, SMALL, Anchor::Start, &summary);
        y += 42.0;
    }
    let caption = format!(
        "Milliseconds per step, the median round of each world size. Measured by \"{}\" on this workbook's {}-core \
         machine, shared with other work (1-minute load average {} before, {} after): the times vary with the load, \
         and with 4 ranks on 2 cores a descheduled rank makes the others wait in the sync.",
        data.about("command")?,
        data.about("cores")?,
        data.about("load_before")?,
        data.about("load_after")?,
    );
    svg.note(y + 8.0, MUTED, &caption);
    Ok(svg.finish())
}
