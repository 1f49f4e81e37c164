//! Chapter 02: identical replicas. Before DDP trains anything, every rank
//! must hold exactly the same model. You write the check that proves it,
//! `verify_replicas` in `exercise.rs`; this chapter's
//! [`SimpleDistributedDataParallelism`] runs it when it wraps a model.
//!
//! Your code:           `cargo test --test chapter_02`
//! The reference code:  `cargo test --features solutions --test chapter_02`
//!
//! Already solved, in the library (`src/ddp/`): the error type
//! [`InitError`], [`check_same_structure`] (every rank holds the same
//! parameter names, shapes and dtypes, so that your check compares like with
//! like), and the wrapper core, [`Replicated`].

use std::ops::Deref;

use tch::nn::{self, Module};

use crate::dist::Group;

pub use crate::ddp::seams::LocalBackward;
use crate::ddp::seams::WithReplicaCheck;
pub use crate::ddp::{check_same_structure, InitError, Replicated};

pub mod exercise; // the file you edit
pub mod solution; // the reference solution

/// `learner::f` is your `exercise.rs`, or `solution.rs` with `--features solutions`.
#[cfg(not(feature = "solutions"))]
pub use exercise as learner;
#[cfg(feature = "solutions")]
pub use solution as learner;

// ANCHOR: wrapper
/// The DDP wrapper as this chapter leaves it: a model replicated on every
/// rank, wrapped only once YOUR `learner::verify_replicas` has shown that
/// every rank holds bitwise the same parameters and buffers. It cannot sync
/// gradients yet (chapter 3 adds that): `backward_local` computes this
/// rank's own. The core's accessors (`forward`, `parameters()`, ...) come
/// through `Deref`.
pub struct SimpleDistributedDataParallelism<M: Module> {
    replicated: Replicated<M>,
}

impl<M: Module> SimpleDistributedDataParallelism<M> {
    /// Wraps `module`, whose variables live in `vs`, after the library's
    /// structure check and YOUR value check. Every rank must call it; on a
    /// mismatch every rank gets the same error.
    pub fn new(module: M, vs: &nn::VarStore, pg: Group) -> Result<Self, InitError> {
        let replicated = Replicated::with_replica_check(module, vs, pg, learner::verify_replicas)?;
        Ok(SimpleDistributedDataParallelism { replicated })
    }
}
// ANCHOR_END: wrapper

impl<M: Module> Deref for SimpleDistributedDataParallelism<M> {
    type Target = Replicated<M>;

    fn deref(&self) -> &Replicated<M> {
        &self.replicated
    }
}
