//! Chapter 04: gradient accumulation and `no_sync`. One optimizer step now
//! consumes k micro-batches per rank: their gradients add up in `.grad`, and
//! the ranks talk only once, after the last one. You write the two pieces
//! that make this work, in `exercise.rs`:
//!
//! 1. `open_no_sync` and its `NoSyncScope`: the scope in which backward
//!    does not communicate, and what closing it leaves behind;
//! 2. `accumulate_and_step`: the accumulation loop, from `zero_grad` to
//!    `optimizer.step()`.
//!
//! Your code:           `cargo test --test chapter_04`
//! The reference code:  `cargo test --features solutions --test chapter_04`
//!
//! This file holds the chapter's [`SimpleDistributedDataParallelism`]:
//! chapter 3's, with its replica check and naive sync (the library's
//! reference code of chapters 2 and 3, so you can start here), plus what
//! this chapter adds: the sync switch, `backward`, and `no_sync`, which
//! opens your `NoSyncScope` on the switch. The batch arithmetic and its
//! errors are the library's (`src/ddp/wrapper/accumulation.rs`).

use std::ops::Deref;

use tch::nn::{self, Module};
use tch::Tensor;

use crate::ddp::{naive, SyncSwitch};
use crate::dist::{DistError, Group};

pub use crate::ddp::seams::LocalBackward;
use crate::ddp::seams::NoSyncWith;
pub use crate::ddp::{
    check_micro_batches, micro_batch_size, split_micro_batches, AccumulationError, InitError, Replicated,
};

pub mod exercise; // the file you edit
pub mod solution; // the reference solution

/// `learner::f` is your `exercise.rs`, or `solution.rs` with `--features solutions`.
#[cfg(not(feature = "solutions"))]
pub use exercise as learner;
#[cfg(feature = "solutions")]
pub use solution as learner;

// ANCHOR: wrapper
/// The DDP wrapper as this chapter leaves it: chapter 3's, whose replicas
/// start equal and average their gradients, now able to accumulate: it
/// averages in [`backward`](Self::backward) unless a
/// [`no_sync`](Self::no_sync) scope is open. The core's accessors come
/// through `Deref`.
pub struct SimpleDistributedDataParallelism<M: Module> {
    replicated: Replicated<M>,
    /// Whether `backward` syncs (PyTorch's `require_backward_grad_sync`).
    switch: SyncSwitch,
}
// ANCHOR_END: wrapper

impl<M: Module> SimpleDistributedDataParallelism<M> {
    /// Wraps `module` after the library's replica check (chapter 2). The
    /// sync switch starts on.
    pub fn new(module: M, vs: &nn::VarStore, pg: Group) -> Result<Self, InitError> {
        Ok(SimpleDistributedDataParallelism {
            replicated: Replicated::new(module, vs, pg)?,
            switch: SyncSwitch::new(),
        })
    }

    // ANCHOR: backward
    /// Runs `loss.backward()`, which ADDS this loss's gradients to every
    /// parameter's `.grad`, then averages the gradients over all ranks if the
    /// sync switch is on. Inside a `no_sync` scope it only accumulates, on
    /// this rank, and sends nothing.
    pub fn backward(&self, loss: &Tensor) -> Result<(), DistError> {
        self.backward_local(loss)?; // adds to .grad
        self.switch.sync_if_on(|| self.sync_gradients())
    }
    // ANCHOR_END: backward

    /// Averages every parameter's gradient over all ranks (chapter 3's
    /// reference, one all-reduce per parameter), whatever the switch says.
    pub fn sync_gradients(&self) -> Result<(), DistError> {
        naive::sync_gradients(self.process_group().as_ref(), self.parameters())
    }

    // ANCHOR: no_sync
    /// Opens a scope in which [`backward`](Self::backward) does not
    /// communicate: YOUR `learner::open_no_sync` opens it on the switch,
    /// and dropping the returned `NoSyncScope` closes it. Write `let _guard =
    /// ddp.no_sync();` (a named binding: `let _ = ...` would drop the scope,
    /// and close it, at once).
    pub fn no_sync(&self) -> learner::NoSyncScope<'_> {
        self.switch.no_sync_with(learner::open_no_sync)
    }

    /// The closure form of [`no_sync`](Self::no_sync): runs `body` with
    /// the switch off and returns what it returns.
    pub fn no_sync_scope<R>(&self, body: impl FnOnce() -> R) -> R {
        let _guard = self.no_sync();
        body()
    } // _guard dropped here, after body, whether body returned or panicked
      // ANCHOR_END: no_sync

    /// Whether the next `backward` will average the gradients.
    pub fn require_backward_grad_sync(&self) -> bool {
        self.switch.is_on()
    }

    /// Sets the switch by hand (the "explicit flag" style). Prefer
    /// [`no_sync`](Self::no_sync), which cannot forget to turn it back on.
    pub fn set_require_backward_grad_sync(&self, on: bool) {
        self.switch.set(on);
    }
}

impl<M: Module> Deref for SimpleDistributedDataParallelism<M> {
    type Target = Replicated<M>;

    fn deref(&self) -> &Replicated<M> {
        &self.replicated
    }
}
