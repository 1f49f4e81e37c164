//! Chapter 1's ring all-reduce, step by step,
//! on 4 ranks: which rank holds which partial sum of which chunk before and
//! after every step of the reduce-scatter and of the all-gather, and which
//! chunk each rank sends. Observed, not drawn by hand: chapter 1's reference
//! phases (`ch01_collectives::solution`, the documented exception to the
//! layering rule, see docs/architecture.md) run on 4 in-process ranks
//! through a process group that looks at the chunks before every step.
//! Drawn by `cargo run --example figures`.

use std::sync::Mutex;

use anyhow::ensure;
use ddp_workbook::ch01_collectives::solution::{ring_all_gather, ring_reduce_scatter};
use ddp_workbook::dist::{spawn, DistError, Group};
use ddp_workbook::tch::Tensor;

use crate::forwarding::{Forwarding, Intercept};
use crate::svg::{Anchor, Svg, INK, MUTED, PALETTE, SMALL, TEXT};
use crate::Figure;

pub fn figures() -> Vec<Figure> {
    vec![Figure { file: "ch01-ring.svg", draw: ring }]
}

const RANKS: usize = 4;

/// What a chunk holds, read from its values: every rank r starts chunk c as
/// `[2^r, c]`, so a sum over a set S of ranks is `[sum of 2^r, |S|·c]`; the
/// first number's bits are S, and the second divided by |S| is c.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Partial {
    ranks: u32,
    chunk: usize,
}

fn read(chunk: &Tensor) -> Partial {
    let ranks = chunk.double_value(&[0]) as u32;
    Partial { ranks, chunk: (chunk.double_value(&[1]) / f64::from(ranks.count_ones())) as usize }
}

/// One step as one rank saw it: what it held before, and what it sent.
#[derive(Clone, Debug)]
struct Seen {
    held: Vec<Partial>,
    sent: Option<(usize, Partial)>, // (to, what)
}

/// What makes a [`Forwarding`] group watch the ring: before each step's
/// first point-to-point call (a send or a recv: ranks alternate which comes
/// first), it reads every chunk of this rank; every other call goes to the
/// real group. The chunks are handles on the very tensors the phases work
/// on (they add into them and receive into them in place), so what it reads
/// is what the ring holds.
struct Watch {
    chunks: Mutex<Vec<Tensor>>, // a Mutex: a ProcessGroup is Sync, a Tensor is not
    calls: Mutex<usize>,
    seen: Mutex<Vec<Seen>>,
}

impl Watch {
    fn before_call(&self) {
        let mut calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        if calls.is_multiple_of(2) {
            let held = self.chunks.lock().unwrap_or_else(|p| p.into_inner()).iter().map(read).collect();
            self.seen.lock().unwrap_or_else(|p| p.into_inner()).push(Seen { held, sent: None });
        }
        *calls += 1;
    }
}

impl Intercept for Watch {
    fn send(&self, inner: &Group, tensor: &Tensor, dst: usize) -> Result<(), DistError> {
        self.before_call();
        if let Some(last) = self.seen.lock().unwrap_or_else(|p| p.into_inner()).last_mut() {
            last.sent = Some((dst, read(tensor)));
        }
        inner.send(tensor, dst)
    }
    fn recv(&self, inner: &Group, tensor: &mut Tensor, src: usize) -> Result<(), DistError> {
        self.before_call();
        inner.recv(tensor, src)
    }
}

/// Every rank's view of the ring: per phase, the steps it saw and what it
/// held at the end.
type Phases = [(Vec<Seen>, Vec<Partial>); 2];

fn run_ring() -> anyhow::Result<Vec<Phases>> {
    Ok(spawn(RANKS, |pg| {
        let rank = pg.rank();
        let mut chunks: Vec<Tensor> =
            (0..RANKS).map(|c| Tensor::from_slice(&[f64::from(1u32 << rank), c as f64])).collect();
        let mut phases = Vec::new();
        for phase in [ring_reduce_scatter, ring_all_gather] {
            let watch = Watch {
                chunks: Mutex::new(chunks.iter().map(Tensor::shallow_clone).collect()),
                calls: Mutex::new(0),
                seen: Mutex::new(Vec::new()),
            };
            let watching = Forwarding { inner: pg.clone(), name: "in-process, watched", intercept: watch };
            phase(&watching, &mut chunks)?;
            // The watcher read the phase's own tensors only if it worked in place.
            let watched_chunks = watching.intercept.chunks.into_inner().unwrap_or_default();
            for (mine, watched) in chunks.iter().zip(&watched_chunks) {
                ensure!(
                    mine.data_ptr() == watched.data_ptr(),
                    "the ring replaced a chunk: it cannot be watched"
                );
            }
            let end: Vec<Partial> = chunks.iter().map(read).collect();
            phases.push((watching.intercept.seen.into_inner().unwrap_or_default(), end));
        }
        let [reduce, gather]: [_; 2] = phases.try_into().map_err(|_| anyhow::anyhow!("two phases"))?;
        Ok([reduce, gather])
    })?)
}

/// A chunk as a column of one cell per rank, filled in that rank's colour
/// when its contribution is in; complete chunks get a heavy outline.
fn draw_chunk(svg: &mut Svg, x: f64, y: f64, partial: Partial) {
    let cell = 8.0;
    for (r, colour) in PALETTE.iter().enumerate().take(RANKS) {
        let fill = if partial.ranks & (1 << r) != 0 { colour } else { "#ffffff" };
        svg.rect(x, y + cell * r as f64, 18.0, cell, fill, Some("#9a9a9a"));
    }
    if partial.ranks.count_ones() as usize == RANKS {
        svg.rect(x - 1.5, y - 1.5, 21.0, cell * RANKS as f64 + 3.0, "none", Some(INK));
        svg.rect(x - 0.5, y - 0.5, 19.0, cell * RANKS as f64 + 1.0, "none", Some(INK));
    }
}

const LETTERS: [&str; RANKS] = ["A", "B", "C", "D"];

/// One phase: a row per state (start, after each step), a block per rank
/// with its four chunks; beside each row, what every rank sent in the step
/// that led to it. Returns the y below it.
fn draw_phase(svg: &mut Svg, mut y: f64, title: &str, views: &[&(Vec<Seen>, Vec<Partial>)]) -> f64 {
    let (left, block) = (112.0, 118.0);
    svg.text_styled(16.0, y + 14.0, TEXT, Anchor::Start, INK, true, title);
    y += 26.0;
    for (rank, _) in views.iter().enumerate() {
        let x = left + block * rank as f64;
        svg.text_styled(x, y + 12.0, SMALL, Anchor::Start, PALETTE[rank], true, &format!("rank {rank}"));
        for (c, letter) in LETTERS.iter().enumerate() {
            svg.text(x + 9.0 + 24.0 * c as f64, y + 28.0, SMALL, Anchor::Middle, letter);
        }
    }
    y += 34.0;
    let steps = views[0].0.len();
    for state in 0..=steps {
        let label = if state == 0 { "start".to_string() } else { format!("after step {}", state - 1) };
        svg.text(16.0, y + 20.0, SMALL, Anchor::Start, &label);
        for (rank, (seen, end)) in views.iter().enumerate() {
            let held = if state < steps { &seen[state].held } else { end };
            for (c, partial) in held.iter().enumerate() {
                draw_chunk(svg, left + block * rank as f64 + 24.0 * c as f64, y + 2.0, *partial);
            }
        }
        if state < steps {
            let sends: Vec<String> = views
                .iter()
                .enumerate()
                .filter_map(|(rank, (seen, _))| {
                    seen[state].sent.map(|(to, what)| format!("{rank}→{to} {}", LETTERS[what.chunk]))
                })
                .collect();
            svg.text_styled(
                left + block * RANKS as f64 - 2.0,
                y + 48.0,
                SMALL,
                Anchor::End,
                MUTED,
                false,
                &format!("step {state} sends: {}", sends.join(", ")),
            );
        }
        y += 60.0;
    }
    y
}

fn ring() -> anyhow::Result<String> {
    let ranks = run_ring()?;
    let mut svg = Svg::headed(
        "The ring all-reduce on 4 ranks, step by step: who holds which part of which chunk",
        "Each rank's buffer is cut into chunks A to D. A chunk is a column of four cells, one per rank, \
         filled in that rank's colour once its contribution is in the sum; outlined heavily when complete. \
         Every step, every rank sends one chunk to its right neighbour (rank + 1) and receives one from its left.",
    );
    let reduce: Vec<_> = ranks.iter().map(|phases| &phases[0]).collect();
    let gather: Vec<_> = ranks.iter().map(|phases| &phases[1]).collect();
    let y = svg.bottom() + 16.0;
    let y = draw_phase(&mut svg, y, "Phase 1, reduce-scatter: add what arrives into your own copy", &reduce);
    let y = draw_phase(&mut svg, y + 8.0, "Phase 2, all-gather: overwrite with the complete chunk", &gather);
    svg.note(
        y + 8.0,
        MUTED,
        "Drawn by cargo run --example figures from a real run of chapter 1's reference ring \
         (ch01_collectives::solution) on 4 in-process ranks, its chunks read before every step.",
    );
    Ok(svg.finish())
}
