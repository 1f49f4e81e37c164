//! Chapter 5's figure, the tiny GPT's
//! gradients laid out in buckets by the library's `plan_buckets`, sizes to
//! scale, in the order backward fills them, with the first cap and the cap.
//! Drawn by `cargo run --example figures` (examples/figures.rs).

use ddp_workbook::ddp::{plan_buckets, BucketCaps, ParamMeta};
use ddp_workbook::models::{named_parameters, Gpt, GptConfig};
use ddp_workbook::tch::Kind;

use crate::svg::{Anchor, Svg, INK, MUTED, PALE, PALETTE, SMALL, TEXT};
use crate::Figure;

pub fn figures() -> Vec<Figure> {
    vec![Figure { file: "ch05-gpt-buckets.svg", draw: gpt_buckets }]
}

/// The caps of chapter 6's `bench_overlap` (16 KiB, the first a quarter of
/// it): small enough that the tiny GPT's 407 KiB of gradients make several
/// buckets (with PyTorch's 25 MiB they are one).
const CAPS: BucketCaps = BucketCaps { cap_bytes: 16 * 1024, first_cap_bytes: 4 * 1024 };

/// A size in KiB, whole when it is whole: "64 KiB", "0.25 KiB".
fn kib(bytes: usize) -> String {
    if bytes.is_multiple_of(1024) {
        format!("{} KiB", bytes / 1024)
    } else {
        format!("{:.2} KiB", bytes as f64 / 1024.0)
    }
}

fn gpt_buckets() -> anyhow::Result<String> {
    let (vs, _gpt) = Gpt::seeded(0, &GptConfig::tiny(), Kind::Float);
    let metas = ParamMeta::of(&named_parameters(&vs));
    let buckets = plan_buckets(&metas, CAPS.cap_bytes, CAPS.first_cap_bytes);
    let total: usize = metas.iter().map(ParamMeta::bytes).sum();

    let mut svg = Svg::headed(
        &format!(
            "The tiny GPT's {} gradients ({}) in {} buckets, from plan_buckets (cap 16 KiB, first cap 4 KiB)",
            metas.len(),
            kib(total),
            buckets.len()
        ),
        "Backward produces the last layer's gradients first, so bucket 0 holds them and leaves first. \
         Bars to scale; the dashed box is the bucket's cap.",
    );
    // One row per bucket, in the order backward fills them (bucket 0 first),
    // its bar to scale against the largest of the cap and the biggest bucket;
    // the members' names beside it, wrapped.
    let (left, bar_width, names_x) = (172.0, 276.0, 466.0);
    let widest = buckets.iter().map(|b| b.bytes()).max().unwrap_or(0).max(CAPS.cap_bytes);
    let scale = bar_width / widest as f64;
    let mut y = svg.bottom() + 28.0;
    svg.text_styled(names_x, y - 8.0, SMALL, Anchor::Start, MUTED, true, "members, in buffer order");
    for (b, bucket) in buckets.iter().enumerate() {
        let colour = b % PALETTE.len();
        svg.text(16.0, y + 17.0, TEXT, Anchor::Start, &format!("bucket {b}"));
        svg.text_styled(162.0, y + 17.0, SMALL, Anchor::End, MUTED, false, &kib(bucket.bytes()));
        let mut x = left;
        for &index in &bucket.params {
            let w = metas[index].bytes() as f64 * scale;
            svg.rect(x, y + 2.0, w.max(1.0), 20.0, PALE[colour], Some(PALETTE[colour]));
            x += w;
        }
        let cap = if b == 0 { CAPS.first_cap_bytes } else { CAPS.cap_bytes };
        svg.dashed_rect(left, y + 2.0, cap as f64 * scale, 20.0, INK);
        let names: Vec<&str> = bucket.params.iter().map(|&i| metas[i].name.as_str()).collect();
        let last = svg.paragraph(names_x, y + 17.0, 760.0 - names_x - 12.0, SMALL, INK, &names.join(", "));
        y = last + 14.0;
    }
    let y = svg.bottom() + 22.0;
    let y = svg.note(
        y,
        MUTED,
        "A gradient larger than the cap travels alone, and closes the bucket before it as it is. \
         The first bucket's cap is a quarter of the others', so it fills, and can leave, early in backward. \
         With PyTorch's caps (25 MiB, first 1 MiB) the whole model is one bucket.",
    );
    svg.note(
        y + 20.0,
        MUTED,
        "Drawn by cargo run --example figures from ddp::plan_buckets on Gpt::seeded(0, GptConfig::tiny()).",
    );
    Ok(svg.finish())
}
