//! The small SVG writer the book's figures are drawn
//! with (`cargo run --example figures`), and the one style they share.
//!
//! The style is chosen so that a figure reads in every mdBook theme: the
//! picture carries its own opaque light background (a dark theme shows it as
//! a light card, never dark text on a dark page), text is near-black, at
//! least 13 px, in a font every browser has, and the palette is Okabe and
//! Ito's, which people with the common colour-vision deficiencies tell apart.
//! Output is deterministic: the same calls give byte-identical text, which the
//! `--check` mode relies on.

use std::fmt::Write;

/// Near-black, for text and outlines.
pub const INK: &str = "#1b1b1b";
/// Grey, for secondary text, axes and empty slots.
pub const MUTED: &str = "#5f5f5f";
/// The background of every figure, opaque.
pub const PAPER: &str = "#ffffff";
/// Okabe–Ito colours, for ranks, buckets and phases, in order.
pub const PALETTE: [&str; 7] = ["#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#f0e442"];
/// Light versions of the palette, for fills under dark text.
pub const PALE: [&str; 7] = ["#c6dcec", "#f8e2b3", "#b3e2d5", "#f0d7e5", "#cde8f8", "#f2cfb3", "#fbf7c0"];

/// Body text size in px; titles are larger, footnotes never smaller than 13.
pub const TEXT: f64 = 14.0;
pub const SMALL: f64 = 13.0;
pub const TITLE: f64 = 16.0;

/// Where a text's x coordinate is: its start, middle or end.
#[derive(Clone, Copy)]
pub enum Anchor {
    Start,
    Middle,
    End,
}

/// An SVG picture being drawn: shapes are appended in drawing order, and
/// the picture is as tall as what was drawn (plus a margin).
pub struct Svg {
    width: f64,
    bottom: f64,
    body: String,
}

/// A width guess for `text` at `size` px in a sans-serif font: wide enough
/// for the widest common glyphs, so that layouts leave room and nothing is
/// cut off at the edge.
pub fn text_width(text: &str, size: f64) -> f64 {
    text.chars().count() as f64 * size * 0.56
}

/// `text` cut at spaces into lines no wider than `width` px at `size` (a
/// single word wider than that stays whole, on its own line).
pub fn wrap(text: &str, width: f64, size: f64) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for word in text.split(' ') {
        match lines.last_mut() {
            Some(line) if text_width(&format!("{line} {word}"), size) <= width => {
                line.push(' ');
                line.push_str(word);
            }
            _ => lines.push(word.to_string()),
        }
    }
    lines
}

/// `text` with XML's special characters escaped.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A number with at most two decimals and no trailing zeros: stable text.
fn num(value: f64) -> String {
    let text = format!("{value:.2}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

impl Svg {
    /// An empty picture `width` px wide. Figures are at most 760 px wide, the
    /// width of mdBook's text column, so that they are never scaled down.
    pub fn new(width: f64) -> Svg {
        Svg { width, bottom: 0.0, body: String::new() }
    }

    /// The lowest y drawn so far: where the next block of a figure may start.
    pub fn bottom(&self) -> f64 {
        self.bottom
    }

    fn reach(&mut self, y: f64) {
        self.bottom = self.bottom.max(y);
    }

    /// A rectangle filled with `fill`, outlined with `stroke` if given.
    pub fn rect(&mut self, x: f64, y: f64, w: f64, h: f64, fill: &str, stroke: Option<&str>) {
        self.reach(y + h);
        let outline = stroke.map(|s| format!(r#" stroke="{s}" stroke-width="1""#)).unwrap_or_default();
        let _ = writeln!(
            self.body,
            r#"<rect x="{}" y="{}" width="{}" height="{}" fill="{fill}"{outline}/>"#,
            num(x),
            num(y),
            num(w),
            num(h)
        );
    }

    /// A rectangle outlined with a dashed line, not filled: a slot left empty.
    pub fn dashed_rect(&mut self, x: f64, y: f64, w: f64, h: f64, stroke: &str) {
        self.reach(y + h);
        let _ = writeln!(
            self.body,
            r#"<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="{stroke}" stroke-width="1.5" stroke-dasharray="4 3"/>"#,
            num(x),
            num(y),
            num(w),
            num(h)
        );
    }

    /// A line of `width` px.
    pub fn line(&mut self, from: (f64, f64), to: (f64, f64), stroke: &str, width: f64) {
        self.reach(from.1.max(to.1));
        let _ = writeln!(
            self.body,
            r#"<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="{stroke}" stroke-width="{}"/>"#,
            num(from.0),
            num(from.1),
            num(to.0),
            num(to.1),
            num(width)
        );
    }

    /// A line with an arrowhead at `to`.
    pub fn arrow(&mut self, from: (f64, f64), to: (f64, f64), stroke: &str) {
        self.line(from, to, stroke, 2.0);
        let (dx, dy) = (to.0 - from.0, to.1 - from.1);
        let length = (dx * dx + dy * dy).sqrt().max(1e-9);
        let (ux, uy) = (dx / length, dy / length); // along the arrow
        let (px, py) = (-uy, ux); // across it
        let back = (to.0 - 9.0 * ux, to.1 - 9.0 * uy);
        let _ = writeln!(
            self.body,
            r#"<polygon points="{},{} {},{} {},{}" fill="{stroke}"/>"#,
            num(to.0),
            num(to.1),
            num(back.0 + 4.5 * px),
            num(back.1 + 4.5 * py),
            num(back.0 - 4.5 * px),
            num(back.1 - 4.5 * py)
        );
    }

    /// A polyline through `points`, `width` px, dashed if asked.
    pub fn polyline(&mut self, points: &[(f64, f64)], stroke: &str, width: f64, dashed: bool) {
        points.iter().for_each(|p| self.reach(p.1));
        let list: Vec<String> = points.iter().map(|(x, y)| format!("{},{}", num(*x), num(*y))).collect();
        let dash = if dashed { r#" stroke-dasharray="6 4""# } else { "" };
        let _ = writeln!(
            self.body,
            r#"<polyline points="{}" fill="none" stroke="{stroke}" stroke-width="{}"{dash}/>"#,
            list.join(" "),
            num(width)
        );
    }

    /// A filled circle of radius `r`, outlined in ink.
    pub fn dot(&mut self, x: f64, y: f64, r: f64, fill: &str) {
        self.reach(y + r);
        let _ = writeln!(
            self.body,
            r#"<circle cx="{}" cy="{}" r="{}" fill="{fill}" stroke="{INK}" stroke-width="1"/>"#,
            num(x),
            num(y),
            num(r)
        );
    }

    /// Text at (`x`, `y`), `y` being its baseline, in `fill`, bold if asked.
    /// (Eight arguments: every figure module calls it, and named positions
    /// read better at those call sites than a style struct built each time.)
    #[allow(clippy::too_many_arguments)]
    pub fn text_styled(
        &mut self,
        x: f64,
        y: f64,
        size: f64,
        anchor: Anchor,
        fill: &str,
        bold: bool,
        text: &str,
    ) {
        let anchor = match anchor {
            Anchor::Start => "start",
            Anchor::Middle => "middle",
            Anchor::End => "end",
        };
        let weight = if bold { r#" font-weight="bold""# } else { "" };
        self.reach(y + size * 0.3); // descenders
        let _ = writeln!(
            self.body,
            r#"<text x="{}" y="{}" font-size="{}" text-anchor="{anchor}" fill="{fill}"{weight}>{}</text>"#,
            num(x),
            num(y),
            num(size),
            escape(text)
        );
    }

    /// Text in the ink colour, regular weight.
    pub fn text(&mut self, x: f64, y: f64, size: f64, anchor: Anchor, text: &str) {
        self.text_styled(x, y, size, anchor, INK, false, text);
    }

    /// The figure's title, bold, at the top left, wrapped to the width.
    pub fn title(&mut self, text: &str) {
        let width = self.width - 64.0; // bold runs wider than `text_width` guesses
        for (i, line) in wrap(text, width, TITLE).iter().enumerate() {
            self.text_styled(16.0, 26.0 + 21.0 * i as f64, TITLE, Anchor::Start, INK, true, line);
        }
    }

    /// Text wrapped at spaces into lines of at most `width` px, the first
    /// baseline at `y`, in `fill`; returns the baseline of the last line.
    pub fn paragraph(&mut self, x: f64, y: f64, width: f64, size: f64, fill: &str, text: &str) -> f64 {
        let lines = wrap(text, width, size);
        for (i, line) in lines.iter().enumerate() {
            self.text_styled(x, y + size * 1.35 * i as f64, size, Anchor::Start, fill, false, line);
        }
        y + size * 1.35 * (lines.len().max(1) - 1) as f64
    }

    /// A paragraph at the left margin, as wide as the figure allows, in the
    /// small size: a figure's introduction, notes and caption.
    pub fn note(&mut self, y: f64, fill: &str, text: &str) -> f64 {
        let width = self.width - 32.0;
        self.paragraph(16.0, y, width, SMALL, fill, text)
    }

    /// A new figure, 760 px wide, with its title and, under it, a muted
    /// introduction that says how to read it.
    pub fn headed(title: &str, intro: &str) -> Svg {
        let mut svg = Svg::new(760.0);
        svg.title(title);
        let y = svg.bottom() + 20.0;
        svg.note(y, MUTED, intro);
        svg
    }

    /// The finished document: the background, as tall as what was drawn
    /// plus a margin, under everything drawn.
    pub fn finish(self) -> String {
        let height = (self.bottom + 14.0).ceil();
        let background = format!(
            r##"<rect x="0.5" y="0.5" width="{}" height="{}" rx="6" fill="{PAPER}" stroke="#c8c8c8" stroke-width="1"/>"##,
            num(self.width - 1.0),
            num(height - 1.0)
        );
        format!(
            concat!(
                r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" "#,
                r#"font-family="DejaVu Sans, Verdana, Arial, Helvetica, sans-serif">"#,
                "\n{background}\n{body}</svg>\n"
            ),
            w = num(self.width),
            h = num(height),
            background = background,
            body = self.body
        )
    }
}
