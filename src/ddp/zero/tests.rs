//! Unit tests of what ZeRO-1 and ZeRO-2 share (`flat_state.rs`), run
//! through both constructors with a `shard_of` that no public door takes.

use tch::Kind;

use crate::ddp::reducer::BucketCaps;
use crate::ddp::zero::{shard_of, step_bucket, GradOpSteps, Shard, ShardGradOp, ShardedAdamW, ZeroSteps};
use crate::dist::{spawn, Group};
use crate::models::{named_parameters, Mlp};

/// The library's shard, moved to offset 0 on every rank: the all-gather
/// would write rank 0's shard into every slot.
fn every_rank_at_offset_0(numel: usize, world_size: usize, rank: usize) -> Shard {
    Shard { offset: 0, ..shard_of(numel, world_size, rank) }
}

#[test]
fn zero1_and_zero2_refuse_a_misplaced_shard_in_the_same_words_each_naming_itself() {
    // A first bucket of 4 elements (the last layer, 3 weights and a
    // bias): on 2 ranks, by hand, rank 1's shard belongs at 1 * 2 = 2.
    let caps = BucketCaps { cap_bytes: 256, first_cap_bytes: 64 };
    let refusals = spawn(2, |pg: Group| {
        let (vs, module) = Mlp::seeded(5, &[4, 5, 3, 1], Kind::Double);
        let zero1 = ZeroSteps { shard_of: every_rank_at_offset_0, step_bucket };
        let zero1 = ShardedAdamW::built_with(&named_parameters(&vs), pg.clone(), caps, 0.01, 0.0, zero1);
        let zero2 = GradOpSteps { shard_of: every_rank_at_offset_0, ..GradOpSteps::default() };
        let zero2 = ShardGradOp::built_with(module, &vs, pg, caps, 0.01, 0.0, zero2);
        Ok((zero1.err().map(|e| e.to_string()), zero2.err().map(|e| e.to_string())))
    })
    .expect("every rank returns its refusals");
    assert_eq!(refusals[0], (None, None), "rank 0's shard is at its own offset, 0");
    let (Some(zero1), Some(zero2)) = &refusals[1] else {
        panic!("rank 1's shard at offset 0 instead of 2 was accepted: {:?}", refusals[1]);
    };
    let rule = "offset == rank * len (= 1 * 2 = 2)";
    assert!(zero1.contains("ShardedAdamW::new") && zero1.contains(rule), "ZeRO-1 says: {zero1}");
    assert!(zero2.contains("ShardGradOp::new") && zero2.contains(rule), "ZeRO-2 says: {zero2}");
    assert_eq!(zero2, &zero1.replace("ShardedAdamW::new", "ShardGradOp::new"), "one rule, one message");
}
