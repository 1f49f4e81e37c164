//! The in-process all_reduce at memory speed: in place, in the callers' own
//! tensors, with the work shared by the ranks that wait for it. Used from
//! 128 KiB on (`scheme.rs` says when). Try it: `cargo test --test dist`;
//! measure it: `cargo run --release --example bench_collectives`.
//!
//! Once every rank has arrived, the flat tensors x_0 .. x_{N-1} are cut into
//! blocks. Reducing block b is a chain of in-place operations along the
//! ranks' own tensors: x_1[b] op= x_0[b], x_2[b] op= x_1[b], ..., so that
//! x_{N-1}[b] ends up holding ((x_0 op x_1) op x_2) op ... in rank order.
//! Addition and multiplication are commutative in floating point, so each
//! step computes exactly what the rank-ordered sum computes: the result is
//! bitwise the one of the rank-order scheme, on every run. Then, while the
//! block is still in the cache, x_{N-1}[b] is copied into every other
//! rank's block. No buffer is allocated.
//!
//! A block is one task, reduced and copied back by whichever rank claims it
//! next (a counter that every rank increments). So a rank never waits for
//! another rank's thread, only for the blocks in progress, and a rank that
//! arrives late or is descheduled simply does fewer blocks; ranks that wait
//! on their `Work` handles in different orders cannot block each other.
//! Every rank waits until every block is done (each block writes every
//! rank's tensor), and only the rank that finishes the last block wakes the
//! sleepers: one wake-up per call, not one per task.
//!
//! Once every rank has arrived, nothing can stop the call: a task is pure
//! computation on tensors the call holds, and it always ends (a panic in one
//! is caught and reported to every rank like libtorch's errors). So a rank
//! that leaves now (it panicked after `all_reduce_async`, its communication
//! thread still reducing a block) fails no one, and no deadline applies:
//! either every rank gets the result, or every rank gets the same error.
//!
//! Tensors that share memory (one tensor handed to two ranks) would be read
//! after another rank's step wrote them; `rendezvous.rs` sends those down the
//! copying path instead.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tch::Tensor;

use super::spin::{cores, count_blocks, spin_until};
use crate::dist::ReduceOp;
use crate::error_text::panic_message;

/// A block's size, when the tensor is large: its N pieces and the result
/// stay in a core's cache between the reduction and the copies back.
const BLOCK_BYTES: i64 = 512 * 1024;
/// The smallest block made to give each core that can work on the call a
/// few (a block costs about 3N libtorch calls, microseconds each, however
/// small it is: more blocks than cores only buys the balance).
const MIN_BLOCK_BYTES: i64 = 64 * 1024;
const BLOCKS_PER_CORE: i64 = 4;

/// One all_reduce being finished by its ranks.
pub(super) struct SplitReduce {
    /// Each rank's own tensor, as a flat view ([numel], same storage).
    /// Behind a mutex because tch tensors are `Send` but not `Sync`: a rank
    /// takes shallow handles under the lock and works outside it.
    flat: Mutex<Vec<Tensor>>,
    op: ReduceOp,
    /// (offset, length) of each block.
    blocks: Vec<(i64, i64)>,
    /// The next block to claim (past the end: none left).
    next: AtomicUsize,
    /// How many blocks are reduced and copied back.
    done: AtomicUsize,
    /// The most blocks one rank did: all of them when the other ranks'
    /// threads did not get a core in time (counted in `spin.rs`).
    most_by_one_rank: AtomicUsize,
    /// libtorch's message if a task failed: every rank reports it.
    failure: Mutex<Option<String>>,
}

impl SplitReduce {
    /// `None` when the tensors cannot be reduced this way (not contiguous);
    /// the caller falls back to reducing into a new tensor.
    pub fn new(inputs: &[Tensor], op: ReduceOp) -> Option<Arc<SplitReduce>> {
        let flat: Vec<Tensor> = inputs.iter().map(|t| t.f_view([-1]).ok()).collect::<Option<_>>()?;
        let numel = flat[0].numel() as i64;
        let bytes = numel * inputs[0].kind().elt_size_in_bytes() as i64;
        let for_cache = (bytes + BLOCK_BYTES - 1) / BLOCK_BYTES;
        let workers = inputs.len().min(cores()) as i64;
        let for_balance = (BLOCKS_PER_CORE * workers).min((bytes + MIN_BLOCK_BYTES - 1) / MIN_BLOCK_BYTES);
        let count = for_cache.max(for_balance).min(numel).max(1);
        let bounds = |b: i64| b * numel / count; // block b: bounds(b) .. bounds(b + 1)
        let blocks = (0..count).map(|b| (bounds(b), bounds(b + 1) - bounds(b))).collect();
        Some(Arc::new(SplitReduce {
            flat: Mutex::new(flat),
            op,
            blocks,
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            most_by_one_rank: AtomicUsize::new(0),
            failure: Mutex::new(None),
        }))
    }

    fn handles(&self) -> Vec<Tensor> {
        self.flat.lock().unwrap_or_else(|p| p.into_inner()).iter().map(Tensor::shallow_clone).collect()
    }

    /// Reduces block `b` along the chain of ranks (see the module's comment),
    /// then copies the result into every other rank's tensor.
    fn reduce_block(&self, flat: &[Tensor], b: usize) -> Result<(), tch::TchError> {
        let (offset, len) = self.blocks[b];
        let views = flat.iter().map(|t| t.f_narrow(0, offset, len)).collect::<Result<Vec<_>, _>>()?;
        let last = views.len() - 1;
        tch::no_grad(|| {
            for k in 1..views.len() {
                self.op.combine(&views[k - 1], &views[k], &views[k])?;
            }
            if self.op == ReduceOp::Avg {
                let mut result = views[last].shallow_clone();
                _ = result.f_div_scalar_(views.len() as f64)?;
            }
            for view in &views[..last] {
                view.shallow_clone().f_copy_(&views[last])?;
            }
            Ok(())
        })
    }

    fn finished(&self) -> bool {
        self.done.load(Ordering::Acquire) == self.blocks.len()
    }

    /// A rank's part of the call: claims blocks until none is left, then
    /// waits until every block is done. `spin`: watch before sleeping
    /// (`spin.rs`). The rank that finishes the last block calls `wake`,
    /// which wakes the ranks in `sleep_until(finished)` (which must return
    /// once `finished()` holds). Returns libtorch's message if any task
    /// failed: every rank returns the same one.
    pub fn work_until_done(
        &self,
        spin: bool,
        wake: &dyn Fn(),
        sleep_until: &dyn Fn(&dyn Fn() -> bool),
    ) -> Result<(), String> {
        let mut flat: Option<Vec<Tensor>> = None; // taken at the first block claimed
        for by_this_rank in 0.. {
            let b = self.next.fetch_add(1, Ordering::AcqRel);
            if b >= self.blocks.len() {
                self.most_by_one_rank.fetch_max(by_this_rank, Ordering::Relaxed);
                break;
            }
            let flat = flat.get_or_insert_with(|| self.handles());
            let failure = match catch_unwind(AssertUnwindSafe(|| self.reduce_block(flat, b))) {
                Ok(Ok(())) => None,
                Ok(Err(error)) => Some(error.to_string()),
                Err(panic) => Some(format!("a task of the reduction panicked: {}", panic_message(&*panic))),
            };
            if let Some(failure) = failure {
                self.failure.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(failure);
            }
            if self.done.fetch_add(1, Ordering::AcqRel) + 1 == self.blocks.len() {
                wake();
            }
        }
        let finished = || self.finished();
        if !(finished() || spin && spin_until(finished)) {
            sleep_until(&finished);
        }
        match self.failure.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            None => Ok(()),
            Some(message) => Err(message),
        }
    }
}

impl Drop for SplitReduce {
    /// The last rank is done with the call: count how its blocks were shared.
    fn drop(&mut self) {
        count_blocks(self.blocks.len(), *self.most_by_one_rank.get_mut());
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
