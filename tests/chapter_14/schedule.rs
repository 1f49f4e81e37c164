//! Chapter 14 tests, part 1: your schedule walked through one step on
//! paper, with no tensors: a model of `units` units (the root, 0, and the
//! blocks) runs forward (root, blocks in order, the root's head), then
//! backward (the root's head, blocks in reverse with their pre-backward
//! hooks, the root's embeddings last), asking your hooks at each point
//! what to do, as the library's driver does. At each point the walk checks
//! what must hold and, when it does not, names the mistake: a unit that
//! computes with freed parameters (gathered too late or freed too early),
//! a unit still alive after its forward with `reshard_after_forward` or
//! after its backward (forgot to free), a next unit's all-gather not
//! started while the current one computes (never prefetches), a
//! reduce-scatter missing, doubled, too early or inside `no_sync`. The
//! training tests walk your schedule first, so that a schedule which
//! would read freed memory is named here instead of crashing there.

use ddp_workbook::ch14_fsdp::{your_schedule, Action, FsdpSchedule, UnitAt};

/// What the walk saw: how many all-gathers it started and how many
/// reduce-scatters, per unit.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Walked {
    pub gathers: Vec<usize>,
    pub reduce_scatters: Vec<usize>,
}

struct Walk {
    schedule: FsdpSchedule,
    units: usize,
    reshard: bool,
    sync: bool,
    gathered: Vec<bool>,
    pending: Vec<bool>,
    /// Per unit, the hook (and the unit it was asked about) whose
    /// `Action::Free` last freed it: the function a "frees too early" names.
    freed_by: Vec<Option<(&'static str, usize)>>,
    walked: Walked,
}

impl Walk {
    fn at(&self, unit: usize) -> UnitAt {
        UnitAt {
            unit,
            units: self.units,
            reshard_after_forward: self.reshard,
            requires_gradient_sync: self.sync,
        }
    }

    fn setting(&self) -> String {
        let plural = if self.units == 1 { "" } else { "s" };
        format!(
            "({} unit{plural}, reshard_after_forward={}, requires_gradient_sync={})",
            self.units, self.reshard, self.sync
        )
    }

    /// Asks `hook` about `unit` and runs what it returns.
    fn ask(&mut self, hook: &'static str, unit: usize) -> Result<(), String> {
        let f = match hook {
            "pre_forward" => self.schedule.pre_forward,
            "post_forward" => self.schedule.post_forward,
            "pre_backward" => self.schedule.pre_backward,
            _ => self.schedule.post_backward,
        };
        let actions = f(self.at(unit));
        for action in actions {
            let target = match action {
                Action::Gather(u) | Action::Free(u) | Action::ReduceScatter(u) => Some(u),
                Action::Prefetch(_) => None,
            };
            if let Some(u) = target.filter(|&u| u >= self.units) {
                return Err(format!(
                    "{hook}(unit {unit}) returned {action:?}, but unit {u} does not exist {}: only a Prefetch \
                     may name a unit past the last (it does nothing)",
                    self.setting()
                ));
            }
            match action {
                Action::Gather(u) => {
                    if !self.gathered[u] && !self.pending[u] {
                        self.walked.gathers[u] += 1;
                    }
                    self.gathered[u] = true;
                    self.pending[u] = false;
                }
                Action::Prefetch(u) => {
                    if u < self.units && !self.gathered[u] && !self.pending[u] {
                        self.pending[u] = true;
                        self.walked.gathers[u] += 1;
                    }
                }
                Action::Free(u) => {
                    if self.gathered[u] {
                        self.freed_by[u] = Some((hook, unit));
                    }
                    self.gathered[u] = false;
                }
                Action::ReduceScatter(u) => self.walked.reduce_scatters[u] += 1,
            }
        }
        Ok(())
    }

    /// `gatherer`: the hook that runs just before this compute, which
    /// must gather the unit if nothing else has (None for the root's head
    /// and backward, which have no hook of their own).
    fn computes(&self, unit: usize, what: &str, after: &str, gatherer: Option<&str>) -> Result<(), String> {
        if self.gathered[unit] {
            return Ok(());
        }
        // Name the function at fault with "your ...": the runner shows the
        // failure that says so first, and files it under that function.
        let culprit = match (self.freed_by[unit], gatherer) {
            (Some((hook, at)), _) => {
                format!("your {hook} freed it too early ({hook}(unit {at}) returned Action::Free({unit}))")
            }
            (None, Some(hook)) => format!("your {hook} never gathered it (Action::Gather({unit}))"),
            (None, None) => format!("nothing gathered unit {unit}"),
        };
        Err(format!(
            "frees too early (or never gathers): unit {unit}'s {what} would run on freed parameters after \
             {after} {}: {culprit}. A unit must be gathered before it computes and freed only after, \
             and nothing gathers the root (unit 0) again between its forward and its backward: it has \
             no pre-backward hook",
            self.setting()
        ))
    }

    fn prefetched(&self, unit: usize, pass: &str, hook: &str, current: usize) -> Result<(), String> {
        if self.gathered[unit] || self.pending[unit] {
            return Ok(());
        }
        Err(format!(
            "never prefetches in {pass}: when your {hook}(unit {current}) returned, the all-gather of unit {unit}, \
             whose {pass} comes next, was not started {}. Return Action::Prefetch({unit}) there, so that \
             it travels while unit {current} computes",
            self.setting()
        ))
    }

    fn step(mut self) -> Result<Walked, String> {
        let n = self.units;
        // Forward: the root's pre-forward, each block, the root's head.
        for u in 0..n {
            self.ask("pre_forward", u)?;
            self.computes(u, "forward", &format!("pre_forward(unit {u})"), Some("pre_forward"))?;
            if u + 1 < n {
                self.prefetched(u + 1, "forward", "pre_forward", u)?;
            }
            if u > 0 {
                self.ask("post_forward", u)?;
                if self.reshard && self.gathered[u] {
                    return Err(format!(
                        "forgets to free: unit {u}'s full parameters are still alive after your post_forward(unit {u}) \
                         {}; with reshard_after_forward they must go (Action::Free({u})) and come back for backward",
                        self.setting()
                    ));
                }
                if !self.reshard && !self.gathered[u] {
                    return Err(format!(
                        "frees too early: your post_forward(unit {u}) freed the unit although reshard_after_forward \
                         is false {}: SHARD_GRAD_OP keeps a block's parameters until its backward",
                        self.setting()
                    ));
                }
            }
        }
        self.computes(0, "head (ln_f, lm_head)", "the last block's post_forward", None)?;
        self.ask("post_forward", 0)?;
        // Backward: the root's head first, with no hook before it.
        self.computes(0, "backward (lm_head)", "post_forward(unit 0)", None)?;
        let backward_order: Vec<usize> = (1..n).rev().chain(std::iter::once(0)).collect();
        for &u in &backward_order {
            if u > 0 {
                self.ask("pre_backward", u)?;
                if u > 1 {
                    self.prefetched(u - 1, "backward", "pre_backward", u)?;
                }
            }
            let after = if u > 0 { format!("pre_backward(unit {u})") } else { "the blocks' backward".into() };
            self.computes(u, "backward", &after, (u > 0).then_some("pre_backward"))?;
            if self.walked.reduce_scatters[u] > 0 {
                return Err(format!(
                    "reduce-scatters too early: unit {u} was reduce-scattered before its backward ended {}; \
                     its gradients are complete only at post_backward(unit {u})",
                    self.setting()
                ));
            }
            self.ask("post_backward", u)?;
            let rs = self.walked.reduce_scatters[u];
            match (self.sync, rs) {
                (true, 1) | (false, 0) => {}
                (true, 0) => {
                    return Err(format!(
                    "never reduce-scatters: your post_backward(unit {u}) must return Action::ReduceScatter({u}) \
                         {}: else no rank gets the average of its gradient shard",
                    self.setting()
                ))
                }
                (true, _) => {
                    return Err(format!(
                        "reduce-scatters unit {u} {rs} times in one backward {}: once, at its post_backward",
                        self.setting()
                    ))
                }
                (false, _) => {
                    return Err(format!(
                        "reduce-scatters inside no_sync: your post_backward(unit {u}) returned ReduceScatter {}; \
                         inside no_sync the full gradients stay to accumulate the next micro-batch",
                        self.setting()
                    ))
                }
            }
            if self.gathered[u] {
                return Err(format!(
                    "forgets to free: unit {u}'s full parameters are still alive after your post_backward(unit {u}) \
                     {}; FSDP frees every unit after its backward (Action::Free({u}))",
                    self.setting()
                ));
            }
        }
        Ok(self.walked)
    }
}

/// Walks `schedule` through one step of a model of `units` units.
pub fn walk(schedule: FsdpSchedule, units: usize, reshard: bool, sync: bool) -> Result<Walked, String> {
    let walk = Walk {
        schedule,
        units,
        reshard,
        sync,
        gathered: vec![false; units],
        pending: vec![false; units],
        freed_by: vec![None; units],
        walked: Walked { gathers: vec![0; units], reduce_scatters: vec![0; units] },
    };
    walk.step()
}

/// Walks YOUR schedule in every setting the training tests use, and fails
/// naming the first mistake.
pub fn assert_your_schedule_is_sound() {
    for units in [1, 2, 3, 4] {
        for reshard in [true, false] {
            for sync in [true, false] {
                if let Err(mistake) = walk(your_schedule(), units, reshard, sync) {
                    panic!("your schedule {mistake}");
                }
            }
        }
    }
}

#[test]
fn your_schedule_gathers_before_compute_frees_after_and_prefetches() {
    assert_your_schedule_is_sound();
}

#[test]
fn your_schedule_gathers_each_unit_as_often_as_fsdp2_per_step() {
    // With reshard_after_forward a block is gathered for its forward and
    // again for its backward; the root, kept after forward, once. Without
    // it, every unit once. One reduce-scatter per unit when synced.
    for reshard in [true, false] {
        let walked = walk(your_schedule(), 3, reshard, true).unwrap_or_else(|m| panic!("your schedule {m}"));
        let block = if reshard { 2 } else { 1 };
        assert_eq!(
            walked,
            Walked { gathers: vec![1, block, block], reduce_scatters: vec![1, 1, 1] },
            "all-gathers and reduce-scatters per unit in one step, reshard_after_forward={reshard}"
        );
    }
}
