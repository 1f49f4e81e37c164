//! examples/figures/ch08_training.rs: chapter 8's figures, both from timed
//! runs whose output the repository commits in `chapters/figures/data/`:
//! - the training run's loss and accuracy curves, and its held-out verdict,
//!   from its log: `cargo run --release --example train > chapters/figures/data/train.log`;
//! - where a step's time goes (data, forward, backward, sync, optimizer) on
//!   1, 2 and 4 ranks:
//!   `cargo run --release --example bench_scaling -- --data chapters/figures/data/scaling.tsv`.
//!
//! Drawn by `cargo run --example figures`.

use crate::svg::{text_width, Anchor, Svg, INK, MUTED, PALE, PALETTE, SMALL, TEXT};
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

/// A chart's frame: where it is, and the ranges it maps.
struct Chart {
    x: f64,
    y: f64,
    w: f64,
    h: f64,
    steps: f64,
    top: f64,
}

impl Chart {
    fn at(&self, step: f64, value: f64) -> (f64, f64) {
        (self.x + self.w * step / self.steps, self.y + self.h * (1.0 - value / self.top))
    }

    /// Axes, a title, y ticks at `ticks`, and x ticks every 100 steps.
    fn frame(&self, svg: &mut Svg, title: &str, ticks: &[f64], format: fn(f64) -> String) {
        svg.text_styled(self.x, self.y - 10.0, TEXT, Anchor::Start, INK, true, title);
        svg.line((self.x, self.y + self.h), (self.x + self.w, self.y + self.h), MUTED, 1.0);
        svg.line((self.x, self.y), (self.x, self.y + self.h), MUTED, 1.0);
        for &tick in ticks {
            let (_, y) = self.at(0.0, tick);
            svg.line((self.x - 4.0, y), (self.x, y), MUTED, 1.0);
            svg.text_styled(self.x - 7.0, y + 4.5, SMALL, Anchor::End, MUTED, false, &format(tick));
        }
        let mut step = 0.0;
        while step <= self.steps + 1e-9 {
            let (x, y) = self.at(step, 0.0);
            svg.line((x, y), (x, y + 4.0), MUTED, 1.0);
            svg.text_styled(x, y + 18.0, SMALL, Anchor::Middle, MUTED, false, &format!("{step:.0}"));
            step += 100.0;
        }
    }

    /// A polyline through `points` (step, value), with a dot at each.
    fn curve(&self, svg: &mut Svg, points: &[(f64, f64)], colour: &str) {
        for pair in points.windows(2) {
            svg.line(self.at(pair[0].0, pair[0].1), self.at(pair[1].0, pair[1].1), colour, 2.0);
        }
        for &(step, value) in points {
            let (x, y) = self.at(step, value);
            svg.rect(x - 2.5, y - 2.5, 5.0, 5.0, colour, None);
        }
    }

    /// A dashed horizontal line at `value`, labelled at its right end.
    fn level(&self, svg: &mut Svg, value: f64, label: &str) {
        let (x0, y) = self.at(0.0, value);
        let (x1, _) = self.at(self.steps, value);
        let mut x = x0;
        while x < x1 {
            svg.line((x, y), ((x + 6.0).min(x1), y), MUTED, 1.0); // dashed: 6 px on, 4 off
            x += 10.0;
        }
        svg.text_styled(x1, y - 5.0, SMALL, Anchor::End, MUTED, false, label);
    }
}

fn training_curves() -> anyhow::Result<String> {
    let (logged, first_line, (held_accuracy, held_loss)) = read_log(&read_text("train.log")?)?;
    let last_step = logged.last().map_or(1.0, |l| l.0);
    let mut svg = Svg::new(760.0);
    svg.title("The training run: loss and accuracy, step by step");
    svg.paragraph(16.0, 48.0, 728.0, SMALL, MUTED, &format!("From the run's log: {first_line}."));
    let top = svg.bottom() + 40.0;
    let loss = Chart { x: 70.0, y: top, w: 290.0, h: 170.0, steps: last_step, top: 3.0 };
    loss.frame(&mut svg, "Loss (global batch, sorted half)", &[0.0, 1.0, 2.0, 3.0], |v| format!("{v:.0}"));
    loss.level(&mut svg, 15f64.ln(), "guessing: ln 15 = 2.71");
    loss.curve(&mut svg, &logged.iter().map(|l| (l.0, l.1)).collect::<Vec<_>>(), PALETTE[0]);
    let accuracy = Chart { x: 450.0, y: top, w: 290.0, h: 170.0, steps: last_step, top: 1.0 };
    accuracy.frame(&mut svg, "Accuracy", &[0.0, 0.25, 0.5, 0.75, 1.0], |v| format!("{v:.2}"));
    accuracy.level(&mut svg, 1.0 / 15.0, "guessing: 1/15");
    accuracy.curve(&mut svg, &logged.iter().map(|l| (l.0, l.2)).collect::<Vec<_>>(), PALETTE[2]);
    let (x, y) = accuracy.at(last_step, held_accuracy);
    svg.rect(x - 6.0, y - 6.0, 12.0, 12.0, PALE[5], Some(PALETTE[5]));
    svg.text_styled(
        x - 10.0,
        y + 24.0,
        SMALL,
        Anchor::End,
        INK,
        false,
        &format!("held-out: {held_accuracy:.4}"),
    );
    let y = top + 170.0 + 44.0;
    svg.text_styled(loss.x + loss.w / 2.0, y - 8.0, SMALL, Anchor::Middle, MUTED, false, "optimizer step");
    svg.text_styled(
        accuracy.x + accuracy.w / 2.0,
        y - 8.0,
        SMALL,
        Anchor::Middle,
        MUTED,
        false,
        "optimizer step",
    );
    svg.paragraph(
        16.0,
        y + 14.0,
        728.0,
        SMALL,
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
    let mut svg = Svg::new(760.0);
    svg.title("Where a training step's time goes, on 1, 2 and 4 ranks");
    svg.paragraph(
        16.0,
        48.0,
        728.0,
        SMALL,
        MUTED,
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
    svg.paragraph(16.0, y + 8.0, 728.0, SMALL, MUTED, &caption);
    Ok(svg.finish())
}
