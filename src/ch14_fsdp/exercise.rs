//! Chapter 14 exercise: which rows of each parameter a rank keeps, and
//! FSDP's schedule around each unit. This is the file you edit.
//!
//! Check your work: `cargo test --test chapter_14`
//!
//! `FullyShard::gpt` / `FullyShard::mlp` in `mod.rs` call `shard_rows`
//! once per parameter and rank, at construction, and check what it
//! returns. Then, every step, the library's hooks ask your four functions
//! what to do: `pre_forward` and `post_forward` around each unit's forward
//! (the root's first and last), `pre_backward` when a block's output
//! gradient arrives, `post_backward` once every gradient of a unit is
//! accumulated. They return the [`Action`]s the driver runs, in order.
//! Units are numbered in forward order: 0 is the root (embeddings, `ln_f`,
//! `lm_head`; it has no pre-backward hook, its backward starts first and
//! ends last), 1.. are the blocks.

use super::{Action, UnitAt};

// ANCHOR: stub
/// FSDP2's dim-0 sharding (`torch.chunk`): every rank gets
/// `ceil(rows / world_size)` rows but the last ones, which get what is left,
/// maybe nothing. A 7-row weight on 2 ranks: 4 and 3; 2 rows on 3 ranks: 1,
/// 1 and 0. The collectives pad each shard to the full `ceil` rows.
#[allow(unused_variables)] // delete this line once you use the arguments
pub fn shard_rows(rows: i64, world_size: usize, rank: usize) -> (i64, i64) {
    // TODO: return `(first row, how many rows)` that `rank` keeps.
    // Keep: every row on exactly one rank, in rank order; no rank more than
    // `ceil(rows / world_size)` rows (the padded shard every rank sends to
    // an all-gather); more ranks than rows work (the last ranks keep 0
    // rows, and their first row is then `rows`).
    // Stuck? `cargo workbook hint 14` gives hints one at a time.
    todo!("exercise ch14: shard_rows in src/ch14_fsdp/exercise.rs")
}

/// Before a unit's forward: its parameters must be here; meanwhile the next
/// unit's all-gather may travel (forward prefetch).
#[allow(unused_variables)] // delete this line once you use the arguments
pub fn pre_forward(at: UnitAt) -> Vec<Action> {
    // TODO: what must be done before unit `at.unit` computes, and what can
    // start travelling while it does? (`Action::Prefetch` of a unit that
    // does not exist does nothing.)
    todo!("exercise ch14: pre_forward in src/ch14_fsdp/exercise.rs")
}

/// After a unit's forward: free its parameters if asked to; the root keeps
/// its own, which backward needs at once (FSDP2 never reshards the root
/// after forward).
#[allow(unused_variables)] // delete this line once you use the arguments
pub fn post_forward(at: UnitAt) -> Vec<Action> {
    // TODO: `at.reshard_after_forward` says whether to give the memory back
    // now (FULL_SHARD) or keep the parameters for backward (SHARD_GRAD_OP).
    // Think about which unit's backward runs first, without a hook before it.
    todo!("exercise ch14: post_forward in src/ch14_fsdp/exercise.rs")
}

/// Before a unit's backward (its output's gradient has arrived): its
/// parameters again, and the all-gather of the unit whose backward comes
/// next, the one before it in forward order (backward prefetch).
#[allow(unused_variables)] // delete this line once you use the arguments
pub fn pre_backward(at: UnitAt) -> Vec<Action> {
    // TODO: what this unit's backward needs, and what the next backward
    // (which unit is that?) can already fetch.
    todo!("exercise ch14: pre_backward in src/ch14_fsdp/exercise.rs")
}

/// After a unit's backward (every gradient of it accumulated): average and
/// shard the gradients unless inside `no_sync`, and free the parameters
/// (FSDP2 reshards after backward, root included). Inside `no_sync` the
/// full gradients stay, to accumulate the next micro-batch into.
#[allow(unused_variables)] // delete this line once you use the arguments
pub fn post_backward(at: UnitAt) -> Vec<Action> {
    // TODO: `at.requires_gradient_sync` is false inside `no_sync`: then the
    // full gradients must stay for the next micro-batch. Either way the
    // parameters are no longer needed.
    todo!("exercise ch14: post_backward in src/ch14_fsdp/exercise.rs")
}
// ANCHOR_END: stub
