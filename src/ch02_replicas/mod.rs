//! Chapter 02: identical replicas. Before DDP trains anything, every rank
//! must hold exactly the same model. You write the check that proves it,
//! `verify_replicas` in `exercise.rs`; [`replicate`] wraps a model in the
//! library's [`Replicated`] core with your check.
//!
//! Your code:           `cargo test --test chapter_02`
//! The reference code:  `cargo test --features solutions --test chapter_02`
//!
//! Already solved, in the library (`src/ddp/`): the error type
//! [`InitError`], [`check_same_structure`] (every rank holds the same
//! parameter names, shapes and dtypes, so that your check compares like with
//! like), and the wrapper core itself.

use tch::nn::{self, Module};

use crate::dist::Group;

pub use crate::ddp::{check_same_structure, InitError, Replicated};

pub mod exercise; // the file you edit
pub mod solution; // the reference solution

/// `learner::f` is your `exercise.rs`, or `solution.rs` with `--features solutions`.
#[cfg(not(feature = "solutions"))]
pub use exercise as learner;
#[cfg(feature = "solutions")]
pub use solution as learner;

// ANCHOR: replicate
/// Wraps `module`, whose variables live in `vs`, once YOUR
/// `learner::verify_replicas` has shown that every rank holds bitwise the
/// same parameters and buffers (after the library's structure check). Every
/// rank must call it; on a mismatch every rank gets the same error.
pub fn replicate<M: Module>(module: M, vs: &nn::VarStore, pg: Group) -> Result<Replicated<M>, InitError> {
    Replicated::with_replica_check(module, vs, pg, learner::verify_replicas)
}
// ANCHOR_END: replicate
