//! Chapter 1's two broadcasts on 8
//! ranks, point to point from the root against along a tree: which ranks
//! hold the root's tensor after each step. Both schedules, as the chapter
//! states them, run with `send` and `recv` on 8 in-process ranks; each rank
//! records the step at which the root's values arrived, and checks them.
//! Drawn by `cargo run --example figures`.

use anyhow::ensure;
use ddp_workbook::dist::spawn;
use ddp_workbook::tch::{Device, Kind, Tensor};

use crate::svg::{Anchor, Svg, INK, MUTED, PALE, PALETTE, SMALL, TEXT};
use crate::Figure;

pub fn figures() -> Vec<Figure> {
    vec![Figure { file: "ch01-broadcast.svg", draw: broadcasts }]
}

const RANKS: usize = 8;

/// The sends of each step, (from, to): the root sends to rank 1, then to 2, ...
fn point_to_point() -> Vec<Vec<(usize, usize)>> {
    (1..RANKS).map(|to| vec![(0, to)]).collect()
}

/// Every rank that has the tensor sends it to one that does not: in step s,
/// rank r < 2^s sends to r + 2^s.
fn tree() -> Vec<Vec<(usize, usize)>> {
    let mut steps = Vec::new();
    let mut have = 1;
    while have < RANKS {
        steps.push((0..have).filter(|r| r + have < RANKS).map(|r| (r, r + have)).collect());
        have *= 2;
    }
    steps
}

/// Runs `schedule` with send and recv: each rank's step of arrival (None
/// for the root), after checking that what arrived is the root's tensor.
fn run(schedule: fn() -> Vec<Vec<(usize, usize)>>) -> anyhow::Result<Vec<Option<usize>>> {
    Ok(spawn(RANKS, |pg| {
        let rank = pg.rank();
        let root_values = [1.0, 2.0, 3.0];
        let mut tensor = match rank {
            0 => Tensor::from_slice(&root_values),
            _ => Tensor::zeros([3], (Kind::Double, Device::Cpu)),
        };
        let mut arrived = None;
        for (step, sends) in schedule().iter().enumerate() {
            for &(from, to) in sends {
                if rank == from {
                    pg.send(&tensor, to)?;
                } else if rank == to {
                    pg.recv(&mut tensor, from)?;
                    arrived = Some(step);
                }
            }
        }
        ensure!(Vec::<f64>::try_from(&tensor)? == root_values, "rank {rank} did not get the root's tensor");
        Ok(arrived)
    })?)
}

/// One schedule: a row per step with a circle per rank: blue once it held
/// the root's tensor before the step, orange with the sender's number when
/// the tensor arrived in this step, empty while it has not.
fn draw(svg: &mut Svg, top: f64, title: &str, sends: &[Vec<(usize, usize)>], arrived: &[Option<usize>]) {
    let (left, gap, row) = (16.0, 44.0, 34.0);
    let x_of = |r: usize| left + 84.0 + gap * r as f64;
    svg.text_styled(left, top, TEXT, Anchor::Start, INK, true, title);
    svg.text_styled(left, top + 22.0, SMALL, Anchor::Start, MUTED, false, "rank");
    for r in 0..RANKS {
        svg.text_styled(x_of(r), top + 22.0, SMALL, Anchor::Middle, MUTED, false, &r.to_string());
    }
    for (step, step_sends) in sends.iter().enumerate() {
        let y = top + 46.0 + row * step as f64;
        svg.text(left, y + 5.0, SMALL, Anchor::Start, &format!("step {}", step + 1));
        for (r, &arrival) in arrived.iter().enumerate() {
            let sender = step_sends.iter().find(|&&(_, to)| to == r).map(|&(from, _)| from);
            match (arrival, sender) {
                (Some(s), Some(from)) if s == step => {
                    svg.dot(x_of(r), y, 12.0, PALE[1]);
                    svg.text_styled(x_of(r), y + 5.0, TEXT, Anchor::Middle, INK, true, &from.to_string());
                }
                (None, _) => svg.dot(x_of(r), y, 12.0, PALETTE[0]),
                (Some(s), _) if s < step => svg.dot(x_of(r), y, 12.0, PALETTE[0]),
                _ => svg.dot(x_of(r), y, 12.0, "#ffffff"),
            }
        }
    }
}

fn broadcasts() -> anyhow::Result<String> {
    let (p2p, tree_arrived) = (run(point_to_point)?, run(tree)?);
    let mut svg = Svg::headed(
        "Broadcast on 8 ranks: point to point from the root (7 steps) against a tree (3 steps)",
        "Blue: the rank held rank 0's tensor before the step; orange, with a number: it arrived in this step, \
         from that rank; empty: not yet. Point to point, the root sends one message per step. Along the tree, \
         every rank that has the tensor sends it on, so the number of holders doubles every step.",
    );
    let top = svg.bottom() + 30.0;
    draw(&mut svg, top, "Point to point from the root: N − 1 = 7 steps", &point_to_point(), &p2p);
    let top = svg.bottom() + 30.0;
    draw(&mut svg, top, "Along a tree: ⌈log₂ N⌉ = 3 steps", &tree(), &tree_arrived);
    svg.note(
        svg.bottom() + 26.0,
        MUTED,
        "Drawn by cargo run --example figures: both schedules run with send and recv on 8 in-process ranks; \
         each rank records the step its tensor arrived in, and checks that it holds the root's values.",
    );
    Ok(svg.finish())
}
