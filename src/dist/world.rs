//! The meeting place of the in-process backend: the state that every rank
//! thread of one `spawn` shares.
//!
//! Each rank numbers its collective calls 0, 1, 2, ...; call number `seq` of
//! every rank meets in the same [`Slot`]. The last rank to arrive computes the
//! result once, in rank order, so every rank receives bitwise the same values.
//! Every wait re-checks three things whenever anything changes: has the result
//! arrived, has a rank this call still needs left the group, has the deadline
//! passed. That is why no call can hang forever.

use std::collections::{HashMap, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tch::{Kind, Tensor};

use super::{DistError, ReduceOp};

/// Which collective a rank asked for; compared across ranks.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Op {
    Broadcast { root: usize },
    AllReduce(ReduceOp),
    AllGather,
    ReduceScatter(ReduceOp),
    Barrier,
}

/// One rank's side of a collective: what it asked for and on what tensor.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Call {
    pub op: Op,
    pub shape: Vec<i64>,
    pub kind: Option<Kind>,
}

impl std::fmt::Display for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.op {
            Op::Broadcast { root } => write!(f, "broadcast(root={root})")?,
            Op::AllReduce(op) => write!(f, "all_reduce({})", op.name())?,
            Op::AllGather => write!(f, "all_gather")?,
            Op::ReduceScatter(op) => write!(f, "reduce_scatter({})", op.name())?,
            Op::Barrier => return write!(f, "barrier"),
        }
        match self.kind {
            Some(kind) => write!(f, " of {kind:?}{:?}", self.shape),
            None => Ok(()),
        }
    }
}

/// Call number `seq` as all ranks see it.
struct Slot {
    first: Option<(usize, Call)>,
    inputs: Vec<Option<Tensor>>,
    arrived: Vec<bool>,
    /// Set once: the shared result, or why the ranks disagree.
    outcome: Option<Result<Vec<Tensor>, String>>,
    collected: usize,
}

#[derive(Default)]
struct State {
    slots: HashMap<u64, Slot>,
    mailboxes: HashMap<(usize, usize), VecDeque<Tensor>>,
    /// Why each rank left the group, once it has.
    gone: Vec<Option<String>>,
}

pub(crate) struct World {
    pub size: usize,
    pub timeout: Duration,
    state: Mutex<State>,
    changed: Condvar,
}

impl World {
    pub fn new(size: usize, timeout: Duration) -> Self {
        let state = State { gone: vec![None; size], ..State::default() };
        World { size, timeout, state: Mutex::new(state), changed: Condvar::new() }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while the lock is held cannot leave the state half-written
        // in a way that matters here, so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records that `rank` has left (finished, failed or panicked) and wakes
    /// every waiter so that calls that still need it fail now.
    pub fn leave(&self, rank: usize, reason: String) {
        self.lock().gone[rank] = Some(reason);
        self.changed.notify_all();
    }

    /// Puts `rank`'s side of collective `seq` on the table. The rank that
    /// completes the slot computes the shared result.
    pub fn arrive(&self, rank: usize, seq: u64, call: Call, input: Option<Tensor>) {
        let mut state = self.lock();
        let size = self.size;
        let slot = state.slots.entry(seq).or_insert_with(|| Slot {
            first: None,
            inputs: (0..size).map(|_| None).collect(),
            arrived: vec![false; size],
            outcome: None,
            collected: 0,
        });
        match &slot.first {
            Some((first_rank, first_call)) if *first_call != call && slot.outcome.is_none() => {
                slot.outcome = Some(Err(format!(
                    "rank {first_rank} called {first_call} but rank {rank} called {call} \
                     as collective call #{seq}"
                )));
            }
            Some(_) => {}
            None => slot.first = Some((rank, call.clone())),
        }
        slot.arrived[rank] = true;
        slot.inputs[rank] = input;
        if slot.outcome.is_none() && slot.arrived.iter().all(|&a| a) {
            let inputs: Vec<Tensor> = slot.inputs.iter_mut().filter_map(Option::take).collect();
            let result = tch::no_grad(|| compute(&call.op, &inputs, size));
            slot.outcome = Some(result.map_err(|e| format!("libtorch failed: {e}")));
        }
        drop(state);
        self.changed.notify_all();
    }

    /// Waits for collective `seq` to finish and hands `take` the shared result
    /// so that it can copy out this rank's part.
    pub fn complete<T>(
        &self,
        rank: usize,
        seq: u64,
        op_name: &str,
        take: impl FnOnce(&[Tensor]) -> Result<T, tch::TchError>,
    ) -> Result<T, DistError> {
        let deadline = Instant::now() + self.timeout;
        let mut state = self.lock();
        loop {
            let slot = state.slots.get_mut(&seq).expect("arrive() creates the slot first");
            if let Some(outcome) = &slot.outcome {
                let result = match outcome {
                    Ok(shared) => tch::no_grad(|| take(shared)).map_err(|source| {
                        DistError::Torch { rank, op: op_name.to_string(), source }
                    }),
                    Err(detail) => Err(DistError::Mismatch {
                        rank,
                        op: op_name.to_string(),
                        detail: detail.clone(),
                    }),
                };
                slot.collected += 1;
                if slot.collected == self.size {
                    state.slots.remove(&seq);
                }
                return result;
            }
            let missing: Vec<usize> = (0..self.size).filter(|&r| !slot.arrived[r]).collect();
            if let Some(&peer) = missing.iter().find(|&&r| state.gone[r].is_some()) {
                let reason = state.gone[peer].clone().unwrap_or_default();
                return Err(DistError::PeerGone { rank, op: op_name.to_string(), peer, reason });
            }
            state = match deadline.checked_duration_since(Instant::now()) {
                Some(left) if !left.is_zero() => self.wait(state, left),
                _ => {
                    let waited = self.timeout;
                    return Err(DistError::Timeout { rank, op: op_name.to_string(), missing, waited });
                }
            };
        }
    }

    /// Queues a message from `src` to `dst`.
    pub fn post(&self, src: usize, dst: usize, message: Tensor) {
        self.lock().mailboxes.entry((src, dst)).or_default().push_back(message);
        self.changed.notify_all();
    }

    /// Takes the oldest message from `src` to `dst`, waiting for one to come.
    pub fn take_message(&self, src: usize, dst: usize, op_name: &str) -> Result<Tensor, DistError> {
        let deadline = Instant::now() + self.timeout;
        let mut state = self.lock();
        loop {
            if let Some(message) = state.mailboxes.get_mut(&(src, dst)).and_then(VecDeque::pop_front) {
                return Ok(message);
            }
            if let Some(reason) = state.gone[src].clone() {
                return Err(DistError::PeerGone { rank: dst, op: op_name.to_string(), peer: src, reason });
            }
            state = match deadline.checked_duration_since(Instant::now()) {
                Some(left) if !left.is_zero() => self.wait(state, left),
                _ => {
                    let (op, waited) = (op_name.to_string(), self.timeout);
                    return Err(DistError::Timeout { rank: dst, op, missing: vec![src], waited });
                }
            };
        }
    }

    fn wait<'a>(&self, state: MutexGuard<'a, State>, left: Duration) -> MutexGuard<'a, State> {
        match self.changed.wait_timeout(state, left) {
            Ok((state, _)) => state,
            Err(poisoned) => poisoned.into_inner().0,
        }
    }
}

/// The shared result of a collective, computed once from the inputs of the
/// ranks that supplied one, always in rank order.
fn compute(op: &Op, inputs: &[Tensor], size: usize) -> Result<Vec<Tensor>, tch::TchError> {
    Ok(match op {
        Op::Broadcast { .. } => vec![inputs[0].f_detach_copy()?],
        Op::AllReduce(reduce) => vec![reduce_in_rank_order(inputs, *reduce, size)?],
        Op::AllGather => inputs.iter().map(Tensor::f_detach_copy).collect::<Result<_, _>>()?,
        Op::ReduceScatter(reduce) => {
            let chunks: Vec<Vec<Tensor>> =
                inputs.iter().map(|t| t.f_chunk(size as i64, 0)).collect::<Result<_, _>>()?;
            (0..size)
                .map(|i| {
                    let column: Vec<Tensor> = chunks.iter().map(|c| c[i].shallow_clone()).collect();
                    reduce_in_rank_order(&column, *reduce, size)
                })
                .collect::<Result<_, _>>()?
        }
        Op::Barrier => vec![],
    })
}

fn reduce_in_rank_order(inputs: &[Tensor], op: ReduceOp, size: usize) -> Result<Tensor, tch::TchError> {
    let mut acc = inputs[0].f_detach_copy()?;
    for x in &inputs[1..] {
        acc = match op {
            ReduceOp::Sum | ReduceOp::Avg => acc.f_add(x)?,
            ReduceOp::Min => acc.f_minimum(x)?,
            ReduceOp::Max => acc.f_maximum(x)?,
            ReduceOp::Product => acc.f_mul(x)?,
        };
    }
    if op == ReduceOp::Avg {
        acc = acc.f_div_scalar(size as f64)?;
    }
    Ok(acc)
}
