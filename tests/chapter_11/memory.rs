//! Chapter 11 tests, part 5: what ZeRO-1 saves on the training run's model.
//! Compiled into `cargo test --test chapter_11` (see `tests/chapter_11.rs`);
//! `-- --nocapture` prints the table the book quotes.
//!
//! The tiny GPT of `examples/train.rs` (104,192 f32 parameters, PyTorch's
//! default bucket caps) on 1, 2, 4 and 8 ranks: the bytes of AdamW moments
//! each rank holds, measured on the tensors of the training run's `AdamW`
//! (plain DDP) and of `ShardedAdamW`, what that makes per parameter with the
//! weights and gradients every rank holds anyway, and for 7e9 parameters.
//! Then the closing chapter's table, `ddp::plan_memory`: what each ZeRO
//! stage keeps per rank on 4 ranks, per parameter and for 7e9 parameters,
//! in fp32 and in mixed precision (16-bit weights and gradients), must be
//! what the tiny GPT's tensors measure (stage 1's share measured here,
//! stages 2 and 3 by the same division) and what was worked out by hand;
//! and what each stage sends per step.

use ddp_workbook::ch11_zero::{AdamW, BucketCaps, ShardedAdamW};
use ddp_workbook::ddp::{plan_memory, Precision, ShardingStage, GIB};
use ddp_workbook::dist::Group;
use ddp_workbook::models::{named_parameters, Gpt, GptConfig};
use ddp_workbook::tch::Kind;

use crate::common::run;

/// Bytes of both moments of the training run's AdamW, on every DDP rank.
fn ddp_moment_bytes() -> usize {
    let (vs, _gpt) = Gpt::seeded(1, &GptConfig::tiny(), Kind::Float);
    let optimizer = AdamW::new(&named_parameters(&vs), 1e-3, 0.0);
    let moments = optimizer.state().into_iter().filter(|(name, _)| name.starts_with("exp_avg"));
    moments.map(|(_, t)| t.numel() * t.kind().elt_size_in_bytes()).sum()
}

#[test]
fn on_the_training_runs_gpt_each_rank_keeps_a_world_size_th_of_the_moments() {
    let ddp_bytes = ddp_moment_bytes();
    let params = 104_192;
    assert_eq!(ddp_bytes, params * 2 * 4, "DDP keeps two f32 moments per parameter");
    println!("tiny GPT, {params} f32 parameters; AdamW moments per rank (bytes), measured:");
    println!("| ranks | DDP | ZeRO-1 | ZeRO-1 / DDP | weights + gradients (both) | model states per parameter, DDP -> ZeRO-1 | 7e9 parameters, GB per rank, DDP -> ZeRO-1 |");
    for world_size in [1, 2, 4, 8] {
        let per_rank = run(world_size, |pg: Group| {
            let (vs, _gpt) = Gpt::seeded(1, &GptConfig::tiny(), Kind::Float);
            let optimizer = ShardedAdamW::new(&named_parameters(&vs), pg, BucketCaps::default(), 1e-3, 0.0)?;
            Ok((optimizer.moment_bytes(), optimizer.buckets().len()))
        });
        let (zero_bytes, buckets) = per_rank[0];
        assert!(per_rank.iter().all(|&r| r == per_rank[0]), "ranks hold different amounts: {per_rank:?}");
        // 1/N of DDP's, plus less than one element per rank and bucket of padding.
        let most = ddp_bytes / world_size + 2 * 4 * buckets;
        assert!(
            zero_bytes * world_size >= ddp_bytes && zero_bytes <= most,
            "{zero_bytes} B on {world_size} ranks"
        );
        let ratio = zero_bytes as f64 / ddp_bytes as f64;
        // Every rank holds all weights and gradients either way; what a 7B
        // f32 model needs per rank at these bytes per parameter.
        let both = 2 * params * 4;
        let (ddp_per_param, zero_per_param) =
            ((both + ddp_bytes) as f64 / params as f64, (both + zero_bytes) as f64 / params as f64);
        let (ddp_7b, zero_7b) = (7e9 * ddp_per_param / 1e9, 7e9 * zero_per_param / 1e9);
        println!(
            "| {world_size} | {ddp_bytes} | {zero_bytes} | {ratio:.4} | {both} | {ddp_per_param:.1} B -> \
             {zero_per_param:.1} B | {ddp_7b:.0} -> {zero_7b:.0} |"
        );
    }
}

/// The model states of one precision, in bytes per parameter, measured on
/// the tiny GPT's parameters cast to its dtypes: weights, gradients (the
/// weights' dtype, as libtorch gives them) and the optimizer's state (AdamW's
/// two f32 moments, plus an f32 master copy of the weights when they are not
/// f32: mixed precision steps in f32 and casts the result down).
fn states_per_parameter(weight_kind: Kind) -> [f64; 3] {
    let (vs, _gpt) = Gpt::seeded(1, &GptConfig::tiny(), Kind::Float);
    let params = named_parameters(&vs);
    let count: usize = params.iter().map(|(_, t)| t.numel()).sum();
    let bytes_as = |kind: Kind| -> usize {
        params.iter().map(|(_, t)| t.to_kind(kind).numel() * kind.elt_size_in_bytes()).sum()
    };
    let weights = bytes_as(weight_kind);
    let master = if weight_kind == Kind::Float { 0 } else { bytes_as(Kind::Float) };
    [weights, weights, master + ddp_moment_bytes()].map(|bytes| bytes as f64 / count as f64)
}

#[test]
fn the_zero_stages_per_parameter_and_for_a_7b_model_on_4_ranks() {
    let world_size = 4;
    // What this chapter built divides the optimizer state by N: measured on
    // the tiny GPT (no padding there), the fraction stage 1 keeps per rank.
    let per_rank = run(world_size, |pg: Group| {
        let (vs, _gpt) = Gpt::seeded(1, &GptConfig::tiny(), Kind::Float);
        Ok(ShardedAdamW::new(&named_parameters(&vs), pg, BucketCaps::default(), 1e-3, 0.0)?.moment_bytes())
    });
    let sharded = per_rank[0] as f64 / ddp_moment_bytes() as f64;
    assert_eq!(
        sharded,
        1.0 / world_size as f64,
        "ZeRO-1 keeps {sharded} of the moments on {world_size} ranks"
    );
    // Which of (weights, gradients, optimizer state) each stage divides by
    // N; stages 2 and 3 are other chapters', so theirs is the same fraction.
    let stages = [
        (ShardingStage::Ddp, [1.0, 1.0, 1.0]),
        (ShardingStage::Zero1, [1.0, 1.0, sharded]),
        (ShardingStage::Zero2, [1.0, sharded, sharded]),
        (ShardingStage::Fsdp, [sharded, sharded, sharded]),
    ];
    // The closing chapter's table is `ddp::plan_memory`'s arithmetic
    // (`cargo run --example plan`); here the bytes per parameter measured
    // on the tiny GPT's tensors, with stage 1's measured share, must be
    // what it counts, and its 7e9-parameter rows what was worked out by
    // hand: 7e9 x (4 + 4 + 8/4) = 70e9 B, 7e9 x (2 + 2/4 + 12/4) = 38.5e9 B, ...
    let by_hand_gb =
        [(Precision::Float32, [112.0, 70.0, 49.0, 28.0]), (Precision::Mixed, [112.0, 49.0, 38.5, 28.0])];
    for (precision, gb_by_hand) in by_hand_gb {
        let kind = if precision == Precision::Float32 { Kind::Float } else { Kind::BFloat16 };
        let measured = states_per_parameter(kind);
        let plan = plan_memory(7e9, world_size, 80.0 * GIB, precision).expect("a valid plan");
        for ((stage, fraction), gb) in stages.into_iter().zip(gb_by_hand) {
            let row = plan.row(stage);
            let planned = row.bytes_per_parameter;
            let kept: Vec<f64> = measured.iter().zip(fraction).map(|(bytes, f)| bytes * f).collect();
            assert_eq!(
                kept,
                [planned.parameters, planned.gradients, planned.optimizer_state],
                "{} in {precision:?}: measured bytes per parameter differ from plan_memory's",
                stage.name()
            );
            let per_device_gb = row.per_device_bytes() / 1e9;
            assert!(
                (per_device_gb - gb).abs() < 1e-9,
                "{} in {precision:?}: {per_device_gb} GB",
                stage.name()
            );
        }
    }
    // What each stage sends per parameter and step on a ring, in the 16-bit
    // dtype (plan_memory counts bytes held, not sent): DDP all-reduces the
    // gradient (a reduce-scatter and an all-gather); stages 1 and 2
    // reduce-scatter it and all-gather the updated weight; stage 3 also
    // all-gathers the weight before forward and backward. By hand:
    // 2 x 3/4 x 2 B = 3 B per parameter, 1.5 times that for stage 3.
    let ring = (world_size - 1) as f64 / world_size as f64; // what a rank sends of a ring collective's buffer
    let [weight, gradient, _] = states_per_parameter(Kind::BFloat16);
    let by_hand_sent = [3.0, 3.0, 3.0, 4.5];
    for ((stage, _), sent_hand) in stages.into_iter().zip(by_hand_sent) {
        let sent = match stage {
            ShardingStage::Fsdp => ring * (2.0 * weight + gradient),
            ShardingStage::Ddp => ring * 2.0 * gradient,
            _ => ring * (gradient + weight),
        };
        println!("{}: {sent:.2} B sent per parameter and step on {world_size} ranks (mixed)", stage.name());
        assert!((sent - sent_hand).abs() < 1e-12, "{sent} B sent per parameter");
    }
}
