//! How one collective call of the in-process backend meets: each rank
//! numbers its collective calls 0, 1, 2, ...; call number `seq` of every
//! rank meets in the same [`Slot`] of the [`World`]. The last rank to arrive
//! computes the result once, in rank order, so every rank receives bitwise
//! the same values (an all_reduce is instead finished in place by its ranks,
//! in the same order: `split_reduce.rs`).
//!
//! Either every rank gets the result of a call, or every rank gets an error:
//! a rank that times out marks the slot abandoned, so that a rank arriving
//! later fails at once instead of receiving a result its peers never saw.
//!
//! Try it: `cargo test --test dist`.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Instant;

use tch::Tensor;

use super::slot::{compute, Outcome, Slot};
use super::split_reduce::{any_overlap, SplitReduce};
use super::world::World;
use crate::dist::call::{Call, Op};
use crate::dist::DistError;

/// What a finished rendezvous produced.
enum Ready {
    /// The result, computed once: each rank copies its part.
    Shared(Vec<Tensor>),
    /// An all_reduce that the ranks finish together, in place.
    Split(Arc<SplitReduce>),
}

impl World {
    /// Puts `rank`'s side of collective `seq` on the table. The rank that
    /// completes the slot computes the shared result, outside the lock so
    /// that other slots and messages are not held up meanwhile.
    pub fn arrive(&self, rank: usize, seq: u64, call: Call, input: Option<Tensor>) {
        let mut state = self.lock();
        // A rank that has left (a notebook World retires a whole group after
        // a failed cell) must not complete a call with its peers, whatever
        // order they come in: the call fails on every rank with its reason.
        let left = state.gone[rank].clone();
        let slot = state.slots.entry(seq).or_insert_with(|| Slot::new(self.size));
        slot.arrived[rank] = true;
        slot.late[rank] = slot.abandoned.is_some();
        if let (Some(reason), None) = (left, &slot.outcome) {
            slot.outcome = Some(Outcome::Abandoned { by: rank, reason });
        }
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
            let bytes =
                slot.inputs.iter().flatten().next().map_or(0, |t| t.numel() * t.kind().elt_size_in_bytes());
            let split = match call.op {
                // Reduced by its ranks, in place, when they wait (split_reduce.rs).
                // Or by the rank-order sum below, when that is faster (scheme.rs).
                Op::AllReduce(reduce)
                    if self.size > 1 && slot.abandoned.is_none() && self.scheme.splits(bytes, self.size) =>
                {
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
        // Waiters wait for the outcome: an arrival that does not settle the
        // call wakes no one (on N ranks that would be N wake-ups per arrival).
        let settled = state.slots.get(&seq).is_none_or(|slot| slot.outcome.is_some());
        drop(state);
        if settled {
            self.notify();
        }
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
        match self.rendezvous(rank, seq, op_name, Instant::now())? {
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
    /// rank's own tensor, for a split reduction already there). Its deadline
    /// counts from `called`, when the caller made the call: an asynchronous
    /// one waits in the communication thread's queue behind earlier calls,
    /// and that wait counts too (else each queued call would restart the
    /// clock, and N calls behind a silent peer would fail after N timeouts).
    pub fn complete_all_reduce(
        &self,
        rank: usize,
        seq: u64,
        op_name: &str,
        output: &mut Tensor,
        called: Instant,
    ) -> Result<(), DistError> {
        match self.rendezvous(rank, seq, op_name, called)? {
            Ready::Split(split) => self.finish_split(rank, &split, op_name),
            Ready::Shared(shared) => tch::no_grad(|| output.f_copy_(&shared[0])).map_err(|cause| {
                DistError::Torch { rank: self.global[rank], op: op_name.to_string(), cause }
            }),
        }
    }

    /// Waits until every rank has joined call `seq`, or fails for the rules
    /// in this file's comment; then what the call produced. The timeout
    /// counts from `called`.
    fn rendezvous(&self, rank: usize, seq: u64, op_name: &str, called: Instant) -> Result<Ready, DistError> {
        let op = || op_name.to_string();
        let (me, global) = (self.global[rank], &self.global);
        let deadline = called.checked_add(self.timeout);
        let (mut guard, mut watched) = (self.lock(), false);
        loop {
            let state = &mut *guard;
            let Some(slot) = state.slots.get_mut(&seq) else {
                // Only possible after this rank has left the group; its own
                // reason says why, whichever rank reached the call first.
                let detail = match &state.gone[rank] {
                    Some(reason) => format!("this rank has left the group: {reason}"),
                    None => "this rank left the group before waiting for this call \
                             (was a Work handle kept after spawn returned?)"
                        .to_string(),
                };
                return Err(DistError::Invalid { rank: me, op: op(), detail });
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
                    guard = self.wait(guard, None, &mut watched);
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
                            guard = self.wait(guard, deadline, &mut watched);
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

    /// `rank`'s part of a split all_reduce: it works on the call's tasks
    /// until its own tensor holds the result (see `split_reduce.rs`).
    fn finish_split(&self, rank: usize, split: &SplitReduce, op_name: &str) -> Result<(), DistError> {
        let wake = || {
            drop(self.lock()); // so that no waiter misses the wake-up below
            self.notify();
        };
        // The tasks it waits for are in progress on other threads, and a task
        // always ends: neither a rank that left nor a deadline can be a
        // reason to stop.
        // It has watched already (split_reduce.rs): it sleeps at once.
        let sleep_until = |finished: &dyn Fn() -> bool| {
            let (mut guard, mut watched) = (self.lock(), true);
            while !finished() {
                guard = self.wait(guard, None, &mut watched);
            }
        };
        split.work_until_done(self.spins, &wake, &sleep_until).map_err(|message| DistError::Torch {
            rank: self.global[rank],
            op: op_name.to_string(),
            cause: tch::TchError::Torch(message),
        })
    }
}
