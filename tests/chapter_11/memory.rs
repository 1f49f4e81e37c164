//! Chapter 11 tests, part 3: what ZeRO-1 saves on the training run's model.
//! Compiled into `cargo test --test chapter_11` (see `tests/chapter_11.rs`);
//! `-- --nocapture` prints the table the book quotes.
//!
//! The tiny GPT of `examples/train.rs` (104,192 f32 parameters, PyTorch's
//! default bucket caps) on 1, 2, 4 and 8 ranks: the bytes of AdamW moments
//! each rank holds, measured on the tensors of the training run's `AdamW`
//! (plain DDP) and of `ShardedAdamW`, what that makes per parameter with the
//! weights and gradients every rank holds anyway, and for 7e9 parameters.

use ddp_workbook::ch11_zero::{AdamW, BucketCaps, ShardedAdamW};
use ddp_workbook::dist::Group;
use ddp_workbook::models::{named_parameters, Gpt, GptConfig};
use ddp_workbook::tch::Kind;

use crate::common::run;

/// Bytes of both moments of the training run's AdamW, on every DDP rank.
fn ddp_moment_bytes() -> usize {
    let (vs, _gpt) = Gpt::seeded(1, &GptConfig::tiny(), Kind::Float);
    let optimizer = AdamW::new(&named_parameters(&vs), 1e-3, 0.0);
    let moments = optimizer.state().into_iter().filter(|(name, _)| name != "step");
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
