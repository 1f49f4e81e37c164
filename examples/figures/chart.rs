//! A plot area for the figures' line charts
//! (`cargo run --example figures`): linear or logarithmic axes, ticks, a
//! grid, lines and dots, in the style of `svg.rs`. The y label sits above
//! the axis, horizontal, so that no text needs rotating.

use crate::svg::{Anchor, Svg, INK, MUTED, SMALL};

/// How values map to pixels on one axis.
#[derive(Clone, Copy)]
pub struct Scale {
    pub min: f64,
    pub max: f64,
    pub log: bool,
}

impl Scale {
    pub fn linear(min: f64, max: f64) -> Scale {
        Scale { min, max, log: false }
    }

    pub fn log(min: f64, max: f64) -> Scale {
        Scale { min, max, log: true }
    }

    /// Where `value` lies between min (0) and max (1).
    fn fraction(&self, value: f64) -> f64 {
        if self.log {
            (value.ln() - self.min.ln()) / (self.max.ln() - self.min.ln())
        } else {
            (value - self.min) / (self.max - self.min)
        }
    }
}

/// A plot area: its pixel box and its two scales.
pub struct Plot {
    pub left: f64,
    pub top: f64,
    pub width: f64,
    pub height: f64,
    pub x: Scale,
    pub y: Scale,
}

impl Plot {
    /// The pixel position of the point (`x`, `y`).
    pub fn at(&self, x: f64, y: f64) -> (f64, f64) {
        (self.left + self.x.fraction(x) * self.width, self.top + (1.0 - self.y.fraction(y)) * self.height)
    }

    /// The frame, a grid line and a label at every tick, and the axis labels.
    pub fn axes(
        &self,
        svg: &mut Svg,
        x_ticks: &[(f64, String)],
        y_ticks: &[(f64, String)],
        labels: (&str, &str),
    ) {
        let bottom = self.top + self.height;
        for (value, label) in x_ticks {
            let (x, _) = self.at(*value, self.y.min);
            svg.line((x, self.top), (x, bottom), "#e3e3e3", 1.0);
            svg.text_styled(x, bottom + 17.0, SMALL, Anchor::Middle, MUTED, false, label);
        }
        for (value, label) in y_ticks {
            let (_, y) = self.at(self.x.min, *value);
            svg.line((self.left, y), (self.left + self.width, y), "#e3e3e3", 1.0);
            svg.text_styled(self.left - 6.0, y + 4.0, SMALL, Anchor::End, MUTED, false, label);
        }
        svg.rect(self.left, self.top, self.width, self.height, "none", Some(INK));
        svg.text_styled(
            self.left + self.width / 2.0,
            bottom + 38.0,
            SMALL,
            Anchor::Middle,
            INK,
            false,
            labels.0,
        );
        svg.text_styled(self.left, self.top - 10.0, SMALL, Anchor::Start, INK, false, labels.1);
    }

    /// A line through the points (data coordinates).
    pub fn line(&self, svg: &mut Svg, points: &[(f64, f64)], colour: &str, dashed: bool) {
        let pixels: Vec<(f64, f64)> = points.iter().map(|&(x, y)| self.at(x, y)).collect();
        svg.polyline(&pixels, colour, 2.5, dashed);
    }

    /// A dot at each point (data coordinates).
    pub fn dots(&self, svg: &mut Svg, points: &[(f64, f64)], colour: &str) {
        for &(x, y) in points {
            let (px, py) = self.at(x, y);
            svg.dot(px, py, 4.5, colour);
        }
    }

    /// A legend entry: a short line or a dot in `colour`, then `label`, at
    /// (`x`, `y`) in pixels.
    pub fn legend(svg: &mut Svg, x: f64, y: f64, colour: &str, dot: bool, label: &str) {
        if dot {
            svg.dot(x + 12.0, y - 4.0, 4.5, colour);
        } else {
            svg.polyline(&[(x, y - 4.0), (x + 24.0, y - 4.0)], colour, 2.5, false);
        }
        svg.text(x + 32.0, y, SMALL, Anchor::Start, label);
    }
}
