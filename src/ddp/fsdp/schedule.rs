//! FSDP's schedule: which rows of a parameter each rank keeps, and, around
//! each unit's forward and backward, what to gather, what to prefetch, what
//! to free and what to reduce-scatter. These are the decisions chapter 14
//! asks the learner for; the unit plumbing (`unit.rs`) and the driver
//! (`mod.rs`) carry them out, whoever wrote them ([`FsdpSchedule`] is the
//! seam). PyTorch spreads the same decisions over `FSDPParam._init_sharded_param`
//! (the rows), `FSDPParamGroup.pre_forward` / `post_forward` /
//! `pre_backward` / `post_backward` and its explicit prefetching.

// ANCHOR: actions
/// One thing the driver does to a unit (units are numbered in forward
/// order; the root, unit 0, runs first and ends last).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Make the unit's full parameters present: wait for its prefetched
    /// all-gather, or all-gather now. Nothing when they are present.
    Gather(usize),
    /// Start the unit's all-gather on the communication thread and return
    /// at once (nothing when it is present or on its way, or out of range).
    Prefetch(usize),
    /// Free the unit's full parameters (their storage resized to 0 bytes).
    Free(usize),
    /// Reduce-scatter the unit's full gradients into this rank's shard of
    /// the averaged gradient, and free the full gradients.
    ReduceScatter(usize),
}

/// Where a unit stands when the schedule is asked.
#[derive(Clone, Copy, Debug)]
pub struct UnitAt {
    /// The unit's index, 0 for the root.
    pub unit: usize,
    /// How many units the model has, root included.
    pub units: usize,
    /// `fully_shard(reshard_after_forward=...)`.
    pub reshard_after_forward: bool,
    /// False inside `no_sync` (`set_requires_gradient_sync(False)`).
    pub requires_gradient_sync: bool,
}
// ANCHOR_END: actions

/// The schedule's functions, swapped as one (chapter 14 plugs in the
/// learner's through `ddp::seams`).
#[derive(Clone, Copy)]
pub struct FsdpSchedule {
    /// `(first row, rows)` of a `rows`-row parameter that `rank` keeps.
    pub shard_rows: fn(rows: i64, world_size: usize, rank: usize) -> (i64, i64),
    pub pre_forward: fn(UnitAt) -> Vec<Action>,
    pub post_forward: fn(UnitAt) -> Vec<Action>,
    pub pre_backward: fn(UnitAt) -> Vec<Action>,
    pub post_backward: fn(UnitAt) -> Vec<Action>,
    /// `(pre, post)`: the gradients are divided by `pre` before the
    /// reduce-scatter's sum and by `post` after it.
    pub divide_factors: fn(world_size: usize) -> (f64, f64),
}

impl Default for FsdpSchedule {
    /// The library's schedule, PyTorch's `fully_shard` default.
    fn default() -> Self {
        FsdpSchedule { shard_rows, pre_forward, post_forward, pre_backward, post_backward, divide_factors }
    }
}

// ANCHOR: shard_rows
/// FSDP2's dim-0 sharding (`torch.chunk`): every rank gets
/// `ceil(rows / world_size)` rows but the last ones, which get what is left,
/// maybe nothing. A 7-row weight on 2 ranks: 4 and 3; 2 rows on 3 ranks: 1,
/// 1 and 0. The collectives pad each shard to the full `ceil` rows.
pub fn shard_rows(rows: i64, world_size: usize, rank: usize) -> (i64, i64) {
    let chunk = (rows + world_size as i64 - 1) / world_size as i64;
    let start = (chunk * rank as i64).min(rows);
    (start, (rows - start).min(chunk))
}
// ANCHOR_END: shard_rows

// ANCHOR: schedule
/// Before a unit's forward. Must hold: the unit's full parameters are
/// present when it computes, and while it computes the all-gather of the
/// unit whose forward comes next is already travelling (forward prefetch).
pub fn pre_forward(at: UnitAt) -> Vec<Action> {
    vec![Action::Gather(at.unit), Action::Prefetch(at.unit + 1)]
}

/// After a unit's forward. Must hold: with `reshard_after_forward`
/// (FULL_SHARD) no unit keeps full parameters that can be gathered again
/// before it next computes; without it (SHARD_GRAD_OP) every unit keeps
/// them until its backward; either way, every unit's parameters are
/// present when its backward computes.
pub fn post_forward(at: UnitAt) -> Vec<Action> {
    // The root has no pre-backward hook: `lm_head`'s backward runs first,
    // before anything could gather it again, so FSDP2 never reshards the
    // root after forward; a block is gathered again by its pre_backward.
    if at.reshard_after_forward && at.unit != 0 {
        vec![Action::Free(at.unit)]
    } else {
        vec![]
    }
}

/// Before a block's backward (its output's gradient has arrived; asked
/// about units 1.. only, never the root). Must hold: the unit's full
/// parameters are present when its backward computes, and while it
/// computes the all-gather of the unit whose backward comes next is
/// already travelling (backward prefetch).
pub fn pre_backward(at: UnitAt) -> Vec<Action> {
    // The next backward is the unit before this one in forward order.
    // Never asked about the root; the guard keeps `at.unit - 1` from
    // underflowing if it were.
    let mut actions = vec![Action::Gather(at.unit)];
    if at.unit > 0 {
        actions.push(Action::Prefetch(at.unit - 1));
    }
    actions
}

/// After a unit's backward (every gradient of it accumulated). Must hold:
/// when gradients are synced, each rank ends with its rows of the gradient
/// averaged over the ranks, one collective per unit; inside `no_sync`
/// nothing is sent and the full gradients stay, to accumulate the next
/// micro-batch into; either way, no unit keeps its full parameters after
/// its backward.
pub fn post_backward(at: UnitAt) -> Vec<Action> {
    // FSDP2 reshards every unit after its backward, root included; inside
    // `no_sync` the full gradients stay for the next micro-batch.
    if at.requires_gradient_sync {
        vec![Action::ReduceScatter(at.unit), Action::Free(at.unit)]
    } else {
        vec![Action::Free(at.unit)]
    }
}

/// PyTorch's `_get_gradient_divide_factors` for float64 (which risks
/// overflow, so it splits the division): the largest power of two `pre`
/// with `pre * pre < world_size` that divides it, then what is left. 2
/// ranks: 2 then 1; 3 ranks: 2 then 1.5; 4 ranks: 2 then 2.
pub fn divide_factors(world_size: usize) -> (f64, f64) {
    let factor = world_size as f64;
    let mut pre = 1.0;
    while factor % pre == 0.0 && factor / pre > pre {
        pre *= 2.0;
    }
    (pre, factor / pre)
}
// ANCHOR_END: schedule
