//! The meeting place of the in-process backend: the state that every rank
//! thread of one group shares. Try it: `cargo test --test dist`.
//!
//! Each rank numbers its collective calls 0, 1, 2, ...; call number `seq` of
//! every rank meets in the same [`Slot`]. The last rank to arrive computes the
//! result once, in rank order, so every rank receives bitwise the same values
//! (an all_reduce is instead finished in place by its ranks, in the same
//! order: `split_reduce.rs`).
//! Every wait re-checks, whenever anything changes: has the result arrived,
//! has a rank this call still needs left the group, has the deadline passed.
//! That is why no call can hang forever.
//!
//! Either every rank gets the result of a call, or every rank gets an error:
//! a rank that times out marks the slot abandoned, so that a rank arriving
//! later fails at once instead of receiving a result its peers never saw.

use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tch::Tensor;

use super::call::{compute, Call, Op, Outcome, Slot};
use super::split_reduce::{any_overlap, SplitReduce};
use super::DistError;

/// A sub-group created from this world: its members (ranks of this world,
/// in their sub-group order) and its own world.
struct SubGroup {
    members: Vec<usize>,
    world: Arc<World>,
}

#[derive(Default)]
pub(super) struct State {
    slots: HashMap<u64, Slot>,
    /// Point-to-point messages in flight, by (source, destination): `p2p.rs`.
    pub(super) mailboxes: HashMap<(usize, usize), VecDeque<Tensor>>,
    /// Why each rank left the group, once it has.
    pub(super) gone: Vec<Option<String>>,
    /// Keyed by the number of the collective call that agreed on it.
    sub_groups: HashMap<u64, SubGroup>,
}

/// What a finished rendezvous produced.
enum Ready {
    /// The result, computed once: each rank copies its part.
    Shared(Vec<Tensor>),
    /// An all_reduce that the ranks finish together, in place.
    Split(std::sync::Arc<SplitReduce>),
}

pub(crate) struct World {
    pub size: usize,
    /// Each member's rank in the world `spawn` made: errors name ranks by it,
    /// also inside a sub-group (where "rank 0" would name someone else).
    pub global: Vec<usize>,
    pub timeout: Duration,
    /// Appended to call names in errors: "" or " of sub-group [2, 3]".
    pub label: String,
    /// How long each all-reduce takes at least (`SpawnOptions::link`).
    pub link: Option<super::SimulatedLink>,
    state: Mutex<State>,
    pub(super) changed: Condvar,
}

impl World {
    pub fn new(size: usize, timeout: Duration, link: Option<super::SimulatedLink>) -> Self {
        Self::with_global_ranks((0..size).collect(), timeout, String::new(), link)
    }

    fn with_global_ranks(
        global: Vec<usize>,
        timeout: Duration,
        label: String,
        link: Option<super::SimulatedLink>,
    ) -> Self {
        let size = global.len();
        let state = State { gone: vec![None; size], ..State::default() };
        World { size, global, timeout, label, link, state: Mutex::new(state), changed: Condvar::new() }
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
        self.changed.notify_all();
        for (sub_rank, world) in sub_groups {
            world.leave(sub_rank, reason.clone());
        }
    }

    /// Puts `rank`'s side of collective `seq` on the table. The rank that
    /// completes the slot computes the shared result, outside the lock so
    /// that other slots and messages are not held up meanwhile.
    pub fn arrive(&self, rank: usize, seq: u64, call: Call, input: Option<Tensor>) {
        let mut state = self.lock();
        let slot = state.slots.entry(seq).or_insert_with(|| Slot::new(self.size));
        slot.arrived[rank] = true;
        slot.late[rank] = slot.abandoned.is_some();
        match &slot.first {
            None => slot.first = Some((rank, call.clone())),
            Some((first_rank, first_call)) if *first_call != call && slot.outcome.is_none() => {
                let (first_rank, this_rank) = (self.global[*first_rank], self.global[rank]);
                let hint = first_call.site_hint(&call);
                let (first_call, call) = (first_call.signature(), call.signature());
                let detail = format!(
                    "rank {first_rank} called {first_call} but rank {this_rank} called {call} \
                     as collective call #{seq}{}{hint}",
                    self.label
                );
                slot.outcome = Some(Outcome::Mismatch(detail));
            }
            Some(_) => {}
        }
        if slot.outcome.is_some() || slot.abandoned.is_some() {
            slot.inputs.iter_mut().for_each(|input| *input = None);
        } else {
            slot.inputs[rank] = input;
        }
        if slot.outcome.is_none() && slot.arrived.iter().all(|&a| a) {
            let split = match call.op {
                // Reduced by its ranks, in place, when they wait (split_reduce.rs).
                Op::AllReduce(reduce) if self.size > 1 && slot.abandoned.is_none() => {
                    let inputs: Vec<&Tensor> = slot.inputs.iter().flatten().collect();
                    let tensors: Vec<Tensor> = inputs.iter().map(|t| t.shallow_clone()).collect();
                    // Tensors that share memory go down the copying path (see split_reduce.rs).
                    let in_place = tensors.iter().all(Tensor::is_contiguous) && !any_overlap(&tensors);
                    in_place.then(|| SplitReduce::new(&tensors, reduce)).flatten()
                }
                _ => None,
            };
            if let Some((by, reason)) = slot.abandoned.clone() {
                slot.outcome = Some(Outcome::Abandoned { by, reason });
            } else if let Some(split) = split {
                slot.inputs.iter_mut().for_each(|input| *input = None);
                slot.outcome = Some(Outcome::Split(split));
            } else if matches!(call.op, Op::AllReduce(_)) && self.size == 1 {
                // One rank: every reduction is the tensor itself (and libtorch's
                // copy of a tensor onto itself does nothing).
                let input: Vec<Tensor> = slot.inputs.iter_mut().filter_map(Option::take).collect();
                slot.outcome = Some(Outcome::Shared(input));
            } else {
                slot.computing = true;
                let inputs: Vec<Tensor> = slot.inputs.iter_mut().filter_map(Option::take).collect();
                drop(state);
                // compute() reports libtorch errors as values; catch_unwind
                // turns a bug-panic into an error too, so waiters always wake.
                let result =
                    catch_unwind(AssertUnwindSafe(|| tch::no_grad(|| compute(&call.op, &inputs, self.size))));
                let outcome = match result {
                    Ok(Ok(shared)) => Outcome::Shared(shared),
                    Ok(Err(error)) => Outcome::TorchFailed(error.to_string()),
                    Err(_) => Outcome::TorchFailed("computing the result panicked".into()),
                };
                state = self.lock();
                // The slot is still there: this rank is neither done nor gone.
                if let Some(slot) = state.slots.get_mut(&seq) {
                    slot.computing = false;
                    slot.outcome = Some(outcome);
                }
            }
        }
        drop(state);
        self.changed.notify_all();
    }

    /// Waits for collective `seq` to finish and hands `take` the shared result
    /// so that it can copy out this rank's part (outside the lock).
    pub fn complete<T>(
        &self,
        rank: usize,
        seq: u64,
        op_name: &str,
        take: impl FnOnce(&[Tensor]) -> Result<T, tch::TchError>,
    ) -> Result<T, DistError> {
        match self.rendezvous(rank, seq, op_name)? {
            Ready::Shared(shared) => tch::no_grad(|| take(&shared)).map_err(|cause| DistError::Torch {
                rank: self.global[rank],
                op: op_name.to_string(),
                cause,
            }),
            Ready::Split(split) => self.finish_split(rank, &split, op_name).and_then(|()| {
                let detail = "an all_reduce was finished by a call that is not one (a bug in the backend)";
                Err(DistError::Invalid {
                    rank: self.global[rank],
                    op: op_name.to_string(),
                    detail: detail.into(),
                })
            }),
        }
    }

    /// An all_reduce: waits for it, then puts the result in `output` (this
    /// rank's own tensor, for a split reduction already there).
    pub fn complete_all_reduce(
        &self,
        rank: usize,
        seq: u64,
        op_name: &str,
        output: &mut Tensor,
    ) -> Result<(), DistError> {
        match self.rendezvous(rank, seq, op_name)? {
            Ready::Split(split) => self.finish_split(rank, &split, op_name),
            Ready::Shared(shared) => tch::no_grad(|| output.f_copy_(&shared[0])).map_err(|cause| {
                DistError::Torch { rank: self.global[rank], op: op_name.to_string(), cause }
            }),
        }
    }

    /// Waits until every rank has joined call `seq`, or fails for the rules
    /// in this file's comment; then what the call produced.
    fn rendezvous(&self, rank: usize, seq: u64, op_name: &str) -> Result<Ready, DistError> {
        let op = || op_name.to_string();
        let (me, global) = (self.global[rank], &self.global);
        let deadline = Instant::now().checked_add(self.timeout);
        let mut guard = self.lock();
        loop {
            let state = &mut *guard;
            let Some(slot) = state.slots.get_mut(&seq) else {
                // Only possible after this rank has left the group.
                let detail = "this rank left the group before waiting for this call \
                              (was a Work handle kept after spawn returned?)";
                return Err(DistError::Invalid { rank: me, op: op(), detail: detail.into() });
            };
            let shared = match (&slot.outcome, &slot.abandoned) {
                // Shallow handles: the copy below runs without the lock.
                (Some(Outcome::Shared(shared)), _) => {
                    Ok(Ready::Shared(shared.iter().map(Tensor::shallow_clone).collect()))
                }
                (Some(Outcome::Split(split)), _) => Ok(Ready::Split(split.clone())),
                (Some(Outcome::Mismatch(detail)), _) => {
                    Err(DistError::Mismatch { rank: me, op: op(), detail: detail.clone() })
                }
                (Some(Outcome::TorchFailed(message)), _) => {
                    Err(DistError::Torch { rank: me, op: op(), cause: tch::TchError::Torch(message.clone()) })
                }
                (Some(Outcome::Abandoned { by, reason }), _) => {
                    Err(DistError::PeerGone { rank: me, op: op(), peer: global[*by], reason: reason.clone() })
                }
                (None, _) if slot.computing => {
                    // Every rank is here and the result is moments away.
                    guard = self.wait(guard, None);
                    continue;
                }
                (None, abandoned) => {
                    let missing: Vec<usize> = (0..self.size).filter(|&r| !slot.arrived[r]).collect();
                    let error = match (
                        self.wait_failure(&state.gone, rank, &missing, deadline, op_name),
                        abandoned,
                    ) {
                        (Some(gone @ DistError::PeerGone { .. }), _) => gone,
                        (_, Some((by, reason))) if slot.late[rank] => {
                            // This rank came after a peer gave up: waiting cannot help.
                            DistError::PeerGone {
                                rank: me,
                                op: op(),
                                peer: global[*by],
                                reason: reason.clone(),
                            }
                        }
                        (Some(timeout), _) => {
                            // Ranks that arrive later must fail at once, not get
                            // a result that this rank never saw.
                            if let DistError::Timeout { missing, waited, .. } = &timeout {
                                let reason = format!(
                                    "gave up on this call after waiting {waited:?} for rank(s) {missing:?}"
                                );
                                slot.abandoned.get_or_insert((rank, reason));
                            }
                            timeout
                        }
                        (None, _) => {
                            guard = self.wait(guard, deadline);
                            continue;
                        }
                    };
                    // This call can no longer succeed: free the inputs now.
                    slot.inputs.iter_mut().for_each(|input| *input = None);
                    Err(error)
                }
            };
            slot.done[rank] = true;
            if slot.finished(&state.gone) {
                state.slots.remove(&seq);
            }
            return shared;
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
            let world = Arc::new(World::with_global_ranks(global, self.timeout, label, self.link));
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

    /// Sleeps until something changes or the deadline passes (spurious
    /// wake-ups are fine: every caller re-checks in a loop).
    pub(super) fn wait<'a>(
        &self,
        state: MutexGuard<'a, State>,
        deadline: Option<Instant>,
    ) -> MutexGuard<'a, State> {
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
