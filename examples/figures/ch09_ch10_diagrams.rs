//! The diagrams of chapters 9 and
//! 10, drawn by `cargo run --example figures`:
//! - threads, processes and GPUs: who owns which memory and who starts whom,
//!   for the in-process backend (`dist::spawn`), MPI processes
//!   (`scripts/launch.sh`, which runs mpirun) and one process per GPU (NCCL);
//! - NCCL's stream and events against libtorch's default stream: the order
//!   `src/dist/nccl/group.rs` (`launch`) and `src/dist/nccl/cuda.rs` set up.
//!
//! They are diagrams, not measurements: the widths are schematic. Each label
//! names the function or file that does what the box shows.

use crate::svg::{wrap, Anchor, Svg, INK, MUTED, PALE, PALETTE, SMALL, TEXT};
use crate::Figure;

pub fn figures() -> Vec<Figure> {
    vec![
        Figure { file: "ch09-threads-processes-gpus.svg", draw: threads_processes_gpus },
        Figure { file: "ch10-nccl-streams.svg", draw: nccl_streams },
    ]
}

/// A box with a bold title and wrapped lines; returns its bottom.
#[allow(clippy::too_many_arguments)]
fn labelled(
    svg: &mut Svg,
    x: f64,
    y: f64,
    w: f64,
    colour: usize,
    title: &str,
    body: &str,
    min_h: f64,
) -> f64 {
    let lines = if body.is_empty() { 0.0 } else { wrap(body, w - 16.0, SMALL).len() as f64 };
    let h = (30.0 + lines * SMALL * 1.35).max(min_h);
    svg.rect(x, y, w, h, PALE[colour], Some(PALETTE[colour]));
    svg.text_styled(x + 8.0, y + 18.0, SMALL, Anchor::Start, INK, true, title);
    if !body.is_empty() {
        svg.paragraph(x + 8.0, y + 36.0, w - 16.0, SMALL, INK, body);
    }
    y + h
}

/// The launcher's box at the top of a column, and an arrow from it to each
/// of `targets` (x centres) at `to_y`.
fn launcher(svg: &mut Svg, x: f64, y: f64, w: f64, text: &str, targets: &[f64], to_y: f64) {
    let bottom = labelled(svg, x, y, w, 6, text, "", 28.0);
    for &tx in targets {
        svg.arrow((tx, bottom), (tx, to_y - 1.0), INK);
    }
}

fn threads_processes_gpus() -> anyhow::Result<String> {
    let mut svg = Svg::headed(
        "Threads, processes, GPUs: who owns the memory, who starts whom",
        "Arrows down: who starts whom. Each coloured box owns its memory: nothing crosses a box's edge but \
         what a collective sends. Two ranks shown; every rank holds a whole copy of the model.",
    );
    let (top, w, gap) = (svg.bottom() + 24.0, 232.0, 16.0);
    let columns = [16.0, 16.0 + w + gap, 16.0 + 2.0 * (w + gap)];
    let headings = ["Threads (chapters 1–8)", "Processes (chapter 9)", "GPUs (chapter 10)"];
    for (x, heading) in columns.iter().zip(headings) {
        svg.text_styled(*x, top, TEXT, Anchor::Start, INK, true, heading);
    }
    let y = top + 14.0;
    let half = (w - 24.0) / 2.0;
    let centres = |x: f64| [x + 8.0 + half / 2.0, x + 16.0 + half * 1.5];

    let ranks_y = y + 72.0; // the ranks' boxes, under their launcher's
    let two = |x: f64| centres(x).map(|cx| cx - half / 2.0);

    // A column's launcher and its two ranks' boxes (`name` 0 and 1, in
    // `colour`, saying `body`); returns the boxes' bottom.
    let ranks = |svg: &mut Svg, x: f64, launched_by: &str, name: &str, colour: usize, body: &str| {
        launcher(svg, x, y, w, launched_by, &centres(x), ranks_y);
        let boxes = two(x).into_iter().enumerate();
        boxes
            .map(|(i, bx)| labelled(svg, bx, ranks_y, half, colour, &format!("{name} {i}"), body, 86.0))
            .fold(0.0, f64::max)
    };

    // Threads: one process, one memory; the ranks meet in a shared World.
    let x = columns[0];
    let bottom = ranks(&mut svg, x, "dist::spawn(2, body)", "rank", 0, "a thread: model, grads, optimizer");
    let shared = "shared by the threads: a sum is computed once, every rank copies it out";
    let world_bottom =
        labelled(&mut svg, x + 8.0, bottom + 10.0, w - 16.0, 2, "World (src/dist/local)", shared, 0.0);
    svg.text_styled(
        x + 8.0,
        world_bottom + 20.0,
        SMALL,
        Anchor::Start,
        MUTED,
        false,
        "one process, one memory",
    );
    svg.dashed_rect(x, ranks_y - 12.0, w, world_bottom + 28.0 - (ranks_y - 12.0), MUTED);

    // Processes: each its own memory; MPI carries every byte between them.
    let x = columns[1];
    let body = "rank from MPI; its own model, grads, optimizer, data";
    let bottom = ranks(&mut svg, x, "scripts/launch.sh -np 2", "process", 4, body);
    let between = "shared memory on one machine, the network between machines";
    labelled(&mut svg, x + 8.0, bottom + 10.0, w - 16.0, 1, "MPI (src/dist/mpi)", between, 0.0);

    // GPUs: a process per GPU queues kernels; the tensors live on the GPU.
    let x = columns[2];
    launcher(&mut svg, x, y, w, "launch.sh, or spawn_on_gpus", &centres(x), ranks_y);
    let mut bottom = 0.0f64;
    for (i, bx) in two(x).into_iter().enumerate() {
        let body = format!("CPU: queues kernels on cuda:{i} (local rank {i})");
        let cpu_bottom = labelled(&mut svg, bx, ranks_y, half, 4, &format!("process {i}"), &body, 86.0);
        svg.arrow((bx + half / 2.0, cpu_bottom), (bx + half / 2.0, cpu_bottom + 22.0), INK);
        let gpu = format!("GPU {i}");
        bottom = bottom.max(labelled(
            &mut svg,
            bx,
            cpu_bottom + 24.0,
            half,
            3,
            &gpu,
            "model, grads, optimizer",
            0.0,
        ));
    }
    let between = "GPU to GPU: NVLink, PCIe, the network";
    labelled(&mut svg, x + 8.0, bottom + 10.0, w - 16.0, 1, "NCCL (src/dist/nccl)", between, 0.0);
    Ok(svg.finish())
}

/// A lane: its label at the left and a thin baseline; returns its top.
fn lane(svg: &mut Svg, y: f64, label: &str, detail: &str) -> f64 {
    svg.text_styled(16.0, y + 16.0, SMALL, Anchor::Start, INK, true, label);
    svg.text_styled(16.0, y + 32.0, SMALL, Anchor::Start, MUTED, false, detail);
    svg.line((200.0, y + 40.0), (744.0, y + 40.0), MUTED, 1.0);
    y
}

/// A kernel (or host call) box on a lane.
fn work(svg: &mut Svg, x: f64, y: f64, w: f64, colour: usize, label: &str) {
    svg.rect(x, y + 8.0, w, 28.0, PALE[colour], Some(PALETTE[colour]));
    svg.text(x + w / 2.0, y + 27.0, SMALL, Anchor::Middle, label);
}

/// An event: a diamond at (`x`, `y`) with its name above it.
fn event(svg: &mut Svg, x: f64, y: f64, name: &str) {
    svg.rect(x - 6.0, y - 6.0, 12.0, 12.0, PALETTE[5], None);
    svg.text_styled(x, y - 10.0, SMALL, Anchor::Middle, PALETTE[5], true, name);
}

fn nccl_streams() -> anyhow::Result<String> {
    let mut svg = Svg::headed(
        "One bucket on a GPU: NCCL's stream waits for libtorch's, the host polls",
        "The host only queues work and never blocks until its wait; each stream runs its queue in order. Event A, recorded on libtorch's \
         stream behind the kernels that wrote the bucket's gradients, holds NCCL's stream until they ran; \
         event B, behind the all-reduce, tells the host's wait when the sum is in place; then the host queues \
         the optimizer's step. Schematic widths.",
    );
    let top = svg.bottom() + 24.0;
    let host = lane(&mut svg, top, "host", "the rank's thread");
    let torch = lane(&mut svg, top + 70.0, "libtorch's stream", "the default one");
    let nccl = lane(&mut svg, top + 140.0, "NCCL's stream", "its own, non-blocking");

    work(&mut svg, 204.0, host, 148.0, 0, "backward queues");
    work(&mut svg, 356.0, host, 124.0, 1, "all_reduce_async");
    work(&mut svg, 484.0, host, 104.0, 0, "more backward");
    work(&mut svg, 592.0, host, 100.0, 5, "wait: polls B");

    work(&mut svg, 230.0, torch, 120.0, 0, "grads, bucket 0");
    work(&mut svg, 356.0, torch, 200.0, 0, "grads of the next layers");
    work(&mut svg, 696.0, torch, 48.0, 2, "step");

    let (a_x, a_y) = (353.0, torch + 22.0);
    event(&mut svg, a_x, a_y - 14.0, "A");
    svg.arrow((a_x, a_y + 14.0), (a_x + 28.0, nccl + 22.0), PALETTE[5]);
    work(&mut svg, 384.0, nccl, 180.0, 1, "all-reduce, bucket 0");
    let (b_x, b_y) = (568.0, nccl + 22.0);
    event(&mut svg, b_x, b_y - 14.0, "B");
    svg.arrow((b_x + 6.0, b_y - 20.0), (636.0, host + 38.0), PALETTE[5]);

    let y = nccl + 60.0;
    svg.note(
        y,
        MUTED,
        "In the code: launch (src/dist/nccl/group.rs) records A with Event::record_on(torch_stream()) and makes \
         NCCL's stream wait for it with Event::block, queues the NCCL call, then records B on NCCL's stream \
         (src/dist/nccl/cuda.rs). The bucket's tensors stay alive until B completes (src/dist/nccl/kept.rs).",
    );
    Ok(svg.finish())
}
