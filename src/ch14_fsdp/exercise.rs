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

/// Before a unit's forward. Must hold: the unit's full parameters are
/// present when it computes, and while it computes the all-gather of the
/// unit whose forward comes next is already travelling (forward prefetch).
#[allow(unused_variables)] // delete this line once you use the arguments
pub fn pre_forward(at: UnitAt) -> Vec<Action> {
    // TODO: what must be done before unit `at.unit` computes, and what can
    // start travelling while it does? `Action::Prefetch(u)` with
    // `u >= at.units` (past the last unit) does nothing; no unit comes
    // before unit 0, and a `usize` cannot name one (`0 - 1` panics).
    // The order of the actions in the returned `Vec` changes no result and
    // no test (see the chapter's "Units" section).
    todo!("exercise ch14: pre_forward in src/ch14_fsdp/exercise.rs")
}

/// After a unit's forward. Must hold: with `reshard_after_forward`
/// (FULL_SHARD) no unit keeps full parameters that can be gathered again
/// before it next computes; without it (SHARD_GRAD_OP) every unit keeps
/// them until its backward; either way, every unit's parameters are
/// present when its backward computes.
#[allow(unused_variables)] // delete this line once you use the arguments
pub fn post_forward(at: UnitAt) -> Vec<Action> {
    // TODO: `at.reshard_after_forward` says whether to give the memory back
    // now (FULL_SHARD) or keep the parameters for backward (SHARD_GRAD_OP).
    // Whatever you free here must be gathered again before it computes:
    // the module comment above lists the hooks that could do it.
    todo!("exercise ch14: post_forward in src/ch14_fsdp/exercise.rs")
}

/// Before a block's backward (its output's gradient has arrived; asked
/// about units 1.. only, never the root). Must hold: the unit's full
/// parameters are present when its backward computes, and while it
/// computes the all-gather of the unit whose backward comes next is
/// already travelling (backward prefetch).
#[allow(unused_variables)] // delete this line once you use the arguments
pub fn pre_backward(at: UnitAt) -> Vec<Action> {
    // TODO: what this unit's backward needs, and which all-gather can
    // already travel while it computes.
    todo!("exercise ch14: pre_backward in src/ch14_fsdp/exercise.rs")
}

/// After a unit's backward (every gradient of it accumulated). Must hold:
/// when gradients are synced, each rank ends with its rows of the gradient
/// averaged over the ranks, one collective per unit; inside `no_sync`
/// nothing is sent and the full gradients stay, to accumulate the next
/// micro-batch into; either way, no unit keeps its full parameters after
/// its backward.
#[allow(unused_variables)] // delete this line once you use the arguments
pub fn post_backward(at: UnitAt) -> Vec<Action> {
    // TODO: `at.requires_gradient_sync` is false inside `no_sync`.
    todo!("exercise ch14: post_backward in src/ch14_fsdp/exercise.rs")
}
// ANCHOR_END: stub
