//! The in-process all_reduce at memory speed: in place, in the callers' own
//! tensors, with the work split over the ranks that wait for it.
//! Try it: `cargo test --test dist`; measure it:
//! `cargo run --release --example bench_collectives`.
//!
//! Once every rank has arrived, the flat tensors x_0 .. x_{N-1} are cut into
//! N slices. Reducing slice s is a chain of in-place operations along the
//! ranks' own tensors: x_1[s] op= x_0[s], x_2[s] op= x_1[s], ..., so that
//! x_{N-1}[s] ends up holding ((x_0 op x_1) op x_2) op ... in rank order.
//! Addition and multiplication are commutative in floating point, so each
//! step computes exactly what the rank-ordered sum computes: the result is
//! bitwise the one of the old, single-threaded reduction, on every run. Then
//! each rank's tensor gets x_{N-1} copied into it. No buffer is allocated.
//!
//! The slices and the copies are tasks that any waiting rank may claim: a
//! rank starts with its own slice, then takes whatever is left. So a rank
//! never waits for another rank's thread, only for work in progress, and
//! ranks that wait on their `Work` handles in different orders cannot block
//! each other. Rank N-1 returns last: the others copy from its tensor.
//!
//! Once every rank has arrived, nothing can stop the call: a task is pure
//! computation on tensors the call holds, and it always ends (a panic in one
//! is caught and reported to every rank like libtorch's errors). So a rank
//! that leaves now (it panicked after `all_reduce_async`, its communication
//! thread still reducing a slice) fails no one, and no deadline applies:
//! either every rank gets the result, or every rank gets the same error.
//!
//! Tensors that share memory (one tensor handed to two ranks) would be read
//! after another rank's step wrote them; `rendezvous.rs` sends those down the
//! copying path instead.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tch::Tensor;

use crate::dist::ReduceOp;
use crate::error_text::panic_message;

const UNCLAIMED: usize = usize::MAX;

/// How long a rank watches tasks in progress before it sleeps on the condvar.
const SPIN: std::time::Duration = std::time::Duration::from_micros(50);

/// One all_reduce being finished by its ranks.
pub(super) struct SplitReduce {
    /// Each rank's own tensor, as a flat view ([numel], same storage).
    /// Behind a mutex because tch tensors are `Send` but not `Sync`: a task
    /// takes shallow handles under the lock and works outside it.
    flat: Mutex<Vec<Tensor>>,
    op: ReduceOp,
    /// (offset, length) of each slice.
    slices: Vec<(i64, i64)>,
    /// Who claimed the reduction of slice s, and the copy of slice s into
    /// rank t's tensor, task t * N + s (t < N-1: rank N-1's tensor holds the
    /// result already). Copies are per slice too, so that ranks share them.
    reduce_owner: Vec<AtomicUsize>,
    copy_owner: Vec<AtomicUsize>,
    reduce_done: Vec<AtomicUsize>,
    copy_done: Vec<AtomicUsize>,
    /// libtorch's message if a task failed: every rank reports it.
    failure: Mutex<Option<String>>,
}

impl SplitReduce {
    /// `None` when the tensors cannot be reduced this way (not contiguous);
    /// the caller falls back to reducing into a new tensor.
    pub fn new(inputs: &[Tensor], op: ReduceOp) -> Option<Arc<SplitReduce>> {
        let flat: Vec<Tensor> = inputs.iter().map(|t| t.f_view([-1]).ok()).collect::<Option<_>>()?;
        let (n, numel) = (inputs.len(), flat[0].numel() as i64);
        let bounds = |s: i64| s * numel / n as i64; // slice s: bounds(s) .. bounds(s + 1)
        let slices = (0..n as i64).map(|s| (bounds(s), bounds(s + 1) - bounds(s))).collect();
        let counters = |k: usize| (0..k).map(|_| AtomicUsize::new(UNCLAIMED)).collect::<Vec<_>>();
        Some(Arc::new(SplitReduce {
            flat: Mutex::new(flat),
            op,
            slices,
            reduce_owner: counters(n),
            copy_owner: counters((n - 1) * n),
            reduce_done: counters(n),
            copy_done: counters((n - 1) * n),
            failure: Mutex::new(None),
        }))
    }

    fn handles(&self) -> Vec<Tensor> {
        self.flat.lock().unwrap_or_else(|p| p.into_inner()).iter().map(Tensor::shallow_clone).collect()
    }

    /// Reduces slice `s` along the chain of ranks (see the module's comment).
    fn reduce_slice(&self, s: usize) -> Result<(), tch::TchError> {
        let (offset, len) = self.slices[s];
        let views =
            self.handles().iter().map(|t| t.f_narrow(0, offset, len)).collect::<Result<Vec<_>, _>>()?;
        tch::no_grad(|| {
            for k in 1..views.len() {
                let (before, mut this) = (&views[k - 1], views[k].shallow_clone());
                match self.op {
                    ReduceOp::Sum | ReduceOp::Avg => _ = this.f_add_(before)?,
                    ReduceOp::Product => _ = this.f_mul_(before)?,
                    ReduceOp::Min => this.f_copy_(&before.f_minimum(&this)?)?,
                    ReduceOp::Max => this.f_copy_(&before.f_maximum(&this)?)?,
                }
            }
            if self.op == ReduceOp::Avg {
                let mut last = views[views.len() - 1].shallow_clone();
                _ = last.f_div_scalar_(views.len() as f64)?;
            }
            Ok(())
        })
    }

    /// Copy task `task`: slice s of the result (rank N-1's tensor) into rank t's.
    fn copy_slice(&self, task: usize) -> Result<(), tch::TchError> {
        let n = self.slices.len();
        let (t, (offset, len)) = (task / n, self.slices[task % n]);
        let handles = self.handles();
        let mut target = handles[t].f_narrow(0, offset, len)?;
        let result = handles[n - 1].f_narrow(0, offset, len)?;
        tch::no_grad(|| target.f_copy_(&result))
    }

    /// Whether every slice of rank `t`'s tensor has its result.
    fn copied_into(&self, t: usize) -> bool {
        let n = self.slices.len();
        all_done(&self.copy_done[t * n..(t + 1) * n])
    }
}

/// Whether two of `tensors` (contiguous) share any byte of memory: then the
/// in-place chain would read a rank's input after another rank's step wrote
/// it (one tensor handed to ranks 1 and 2 would be counted twice over).
pub(super) fn any_overlap(tensors: &[Tensor]) -> bool {
    let mut ranges: Vec<(usize, usize)> = tensors
        .iter()
        .filter(|t| t.numel() > 0)
        .map(|t| {
            let start = t.data_ptr() as usize;
            (start, start + t.numel() * t.kind().elt_size_in_bytes())
        })
        .collect();
    ranges.sort_unstable();
    ranges.windows(2).any(|pair| pair[1].0 < pair[0].1)
}

/// The first unclaimed task, looking from `start` on, now claimed by `rank`.
fn claim(owners: &[AtomicUsize], rank: usize, start: usize) -> Option<usize> {
    let n = owners.len();
    (0..n).map(|i| (start + i) % n).find(|&task| {
        owners[task].compare_exchange(UNCLAIMED, rank, Ordering::AcqRel, Ordering::Acquire).is_ok()
    })
}

fn all_done(done: &[AtomicUsize]) -> bool {
    done.iter().all(|d| d.load(Ordering::Acquire) != UNCLAIMED)
}

impl SplitReduce {
    /// `rank`'s part of the call: works until every slice is reduced and
    /// every copy made that this rank must see before it returns. After each
    /// task it finishes it calls `task_done`, which wakes the ranks waiting
    /// for it; with nothing left to claim it calls `sleep_until(finished)`,
    /// which must return once `finished()` holds (the other ranks'
    /// `task_done` wakes it). Returns libtorch's message if any task failed:
    /// every rank returns the same one.
    pub fn work_until_done(
        &self,
        rank: usize,
        task_done: &dyn Fn(),
        sleep_until: &dyn Fn(&dyn Fn() -> bool),
    ) -> Result<(), String> {
        let (size, last) = (self.slices.len(), self.slices.len() - 1);
        loop {
            let (owners, done, task_is_copy) = if !all_done(&self.reduce_done) {
                (&self.reduce_owner, &self.reduce_done, false)
            } else {
                (&self.copy_owner, &self.copy_done, true)
            };
            // Own work first: this rank's slice, or the copies into its own tensor.
            let start = if task_is_copy { rank.min(last - 1) * size } else { rank };
            if let Some(task) = claim(owners, rank, start) {
                let result = catch_unwind(AssertUnwindSafe(|| {
                    if task_is_copy {
                        self.copy_slice(task)
                    } else {
                        self.reduce_slice(task)
                    }
                }));
                let failure = match result {
                    Ok(Ok(())) => None,
                    Ok(Err(error)) => Some(error.to_string()),
                    Err(panic) => {
                        Some(format!("a task of the reduction panicked: {}", panic_message(&*panic)))
                    }
                };
                if let Some(failure) = failure {
                    self.failure.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(failure);
                }
                done[task].store(rank, Ordering::Release);
                task_done();
                continue;
            }
            // Nothing left to claim at this stage: wait for the tasks in progress.
            let finished = || match (task_is_copy, rank == last) {
                (false, _) => all_done(&self.reduce_done),
                (true, true) => all_done(&self.copy_done), // others read my tensor
                (true, false) => self.copied_into(rank),
            };
            if task_is_copy && finished() {
                return match self.failure.lock().unwrap_or_else(|p| p.into_inner()).clone() {
                    None => Ok(()),
                    Some(message) => Err(message),
                };
            }
            // The tasks in progress run on other cores and take microseconds
            // to a few milliseconds: watch them briefly before going to sleep,
            // since a condvar's wake-up alone costs tens of microseconds.
            let watching = Instant::now();
            while !finished() && watching.elapsed() < SPIN {
                std::hint::spin_loop();
            }
            sleep_until(&finished);
        }
    }
}
