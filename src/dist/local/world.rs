//! The meeting place of the in-process backend: the state that every rank
//! thread of one group shares, who has left it, its sub-groups, and the one
//! way its threads wait. Collectives meet in it through `rendezvous.rs`,
//! messages through `p2p.rs`. Try it: `cargo test --test dist`.
//!
//! Every wait re-checks, whenever anything changes: has the result arrived,
//! has a rank this call still needs left the group, has the deadline passed.
//! That is why no call can hang forever.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tch::Tensor;

use super::link::SimulatedLink;
use super::scheme::AllReduceScheme;
use super::slot::Slot;
use super::spin::{count_sleep, count_wake_up, may_spin, spin_until};
use crate::dist::DistError;

/// A sub-group created from this world: its members (ranks of this world,
/// in their sub-group order) and its own world.
struct SubGroup {
    members: Vec<usize>,
    world: Arc<World>,
}

#[derive(Default)]
pub(super) struct State {
    /// Collective calls in progress, by number: `rendezvous.rs`.
    pub(super) slots: HashMap<u64, Slot>,
    /// Point-to-point messages in flight, by (source, destination): `p2p.rs`.
    pub(super) mailboxes: HashMap<(usize, usize), VecDeque<Tensor>>,
    /// Why each rank left the group, once it has.
    pub(super) gone: Vec<Option<String>>,
    /// Keyed by the number of the collective call that agreed on it.
    sub_groups: HashMap<u64, SubGroup>,
}

pub(super) struct World {
    pub size: usize,
    /// Each member's rank in the world `spawn` made: errors name ranks by it,
    /// also inside a sub-group (where "rank 0" would name someone else).
    pub global: Vec<usize>,
    pub timeout: Duration,
    /// Appended to call names in errors: "" or " of sub-group [2, 3]".
    pub label: String,
    /// How long each all-reduce takes at least (`SpawnOptions::link`).
    pub link: Option<SimulatedLink>,
    /// How all_reduce calls are reduced (`scheme.rs`).
    pub scheme: AllReduceScheme,
    /// Whether a waiting rank may watch before it sleeps: a core per rank (`spin.rs`).
    pub spins: bool,
    state: Mutex<State>,
    changed: Condvar,
    /// How many times `changed` was notified: what a watching rank watches.
    changes: AtomicU64,
}

impl World {
    pub fn new(size: usize, timeout: Duration, link: Option<SimulatedLink>, scheme: AllReduceScheme) -> Self {
        Self::with_global_ranks((0..size).collect(), timeout, String::new(), link, scheme)
    }

    fn with_global_ranks(
        global: Vec<usize>,
        timeout: Duration,
        label: String,
        link: Option<SimulatedLink>,
        scheme: AllReduceScheme,
    ) -> Self {
        let size = global.len();
        let state = State { gone: vec![None; size], ..State::default() };
        World {
            size,
            global,
            timeout,
            label,
            link,
            scheme,
            spins: may_spin(size),
            state: Mutex::new(state),
            changed: Condvar::new(),
            changes: AtomicU64::new(0),
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        // Only plain bookkeeping runs under this lock (tensor work and user
        // code run outside it), so a poisoned lock can only come from a bug
        // in an update that cannot leave the state half-written.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records that `rank` has left (finished, failed or panicked), wakes
    /// every waiter so that calls that still need it fail now, and tells
    /// every sub-group that `rank` is a member of. The first reason stays.
    pub fn leave(&self, rank: usize, reason: String) {
        let sub_groups: Vec<(usize, Arc<World>)> = {
            let mut guard = self.lock();
            let state = &mut *guard;
            if state.gone[rank].is_some() {
                return;
            }
            state.gone[rank] = Some(reason.clone());
            // Nobody will read messages sent to `rank` any more.
            state.mailboxes.retain(|&(_, dst), _| dst != rank);
            let gone = &state.gone;
            state.slots.retain(|_, slot| !slot.finished(gone));
            state
                .sub_groups
                .values()
                .filter_map(|g| g.members.iter().position(|&m| m == rank).map(|i| (i, g.world.clone())))
                .collect()
        };
        self.notify();
        for (sub_rank, world) in sub_groups {
            world.leave(sub_rank, reason.clone());
        }
    }

    /// `rank` will never collect call `seq` (its `Work` was dropped): the
    /// slot, and the result in it, go as soon as the other ranks have theirs.
    pub fn give_up(&self, rank: usize, seq: u64) {
        let mut guard = self.lock();
        let state = &mut *guard;
        if let Some(slot) = state.slots.get_mut(&seq) {
            slot.done[rank] = true;
            if slot.finished(&state.gone) {
                state.slots.remove(&seq);
            }
        }
    }

    /// The world of the sub-group agreed on in collective call `key`, made by
    /// the first member to ask. Members ask before `new_group` returns, so
    /// before they can leave: `leave` always finds the sub-group here.
    pub fn sub_group(&self, key: u64, members: &[usize]) -> Arc<World> {
        let mut state = self.lock();
        let entry = state.sub_groups.entry(key).or_insert_with(|| {
            let global: Vec<usize> = members.iter().map(|&m| self.global[m]).collect();
            let label = format!(" of sub-group {global:?}");
            let world =
                Arc::new(World::with_global_ranks(global, self.timeout, label, self.link, self.scheme));
            SubGroup { members: members.to_vec(), world }
        });
        entry.world.clone()
    }

    /// Why group rank `rank`, waiting for the group ranks in `awaited`, must
    /// stop now: the first of them that left (`gone`, the state's record; the
    /// root cause, named first), else a timeout once `deadline` has passed.
    /// `None`: keep waiting. Errors name world ranks.
    pub(super) fn wait_failure(
        &self,
        gone: &[Option<String>],
        rank: usize,
        awaited: &[usize],
        deadline: Option<Instant>,
        op_name: &str,
    ) -> Option<DistError> {
        let (rank, op) = (self.global[rank], op_name.to_string());
        if let Some(&peer) = awaited.iter().find(|&&r| gone[r].is_some()) {
            let reason = gone[peer].clone().unwrap_or_default();
            return Some(DistError::PeerGone { rank, op, peer: self.global[peer], reason });
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            let missing = awaited.iter().map(|&r| self.global[r]).collect();
            return Some(DistError::Timeout { rank, op, missing, waited: self.timeout });
        }
        None
    }

    /// Wakes every waiter: something they may wait for has changed. Call it
    /// after the change, with the lock released.
    pub(super) fn notify(&self) {
        self.changes.fetch_add(1, Ordering::Release);
        count_wake_up();
        self.changed.notify_all();
    }

    /// Waits until something changes or the deadline passes (spurious
    /// wake-ups are fine: every caller re-checks in a loop). The first wait
    /// of a caller's loop (`*watched` false) with a core per rank watches
    /// for a change for a moment instead of sleeping (`spin.rs`), and
    /// returns either way: the caller re-checks under the lock before it
    /// waits again, so no wake-up is missed.
    pub(super) fn wait<'a>(
        &'a self,
        state: MutexGuard<'a, State>,
        deadline: Option<Instant>,
        watched: &mut bool,
    ) -> MutexGuard<'a, State> {
        if self.spins && !*watched {
            *watched = true;
            let seen = self.changes.load(Ordering::Acquire);
            drop(state);
            spin_until(|| self.changes.load(Ordering::Acquire) != seen);
            return self.lock();
        }
        count_sleep();
        match deadline {
            Some(deadline) => {
                let left = deadline.saturating_duration_since(Instant::now());
                match self.changed.wait_timeout(state, left) {
                    Ok((state, _)) => state,
                    Err(poisoned) => poisoned.into_inner().0,
                }
            }
            None => self.changed.wait(state).unwrap_or_else(|poisoned| poisoned.into_inner()),
        }
    }
}
