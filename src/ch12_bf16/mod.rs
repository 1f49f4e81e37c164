//! Chapter 12: communicating less, bf16 gradients. Every step so far sent
//! each gradient in its own dtype, four bytes an element in float32. A
//! communication hook (PyTorch's `register_comm_hook`) changes how a bucket
//! is averaged; this one sends it as bfloat16: half the bytes, at the price
//! of bf16's 8 significant bits.
//!
//! Your code:           `cargo test --test chapter_12`
//! The reference code:  `cargo test --features solutions --test chapter_12`
//!
//! You write one function in `exercise.rs`: `bf16_compress_hook`, which
//! averages one bucket over the ranks with an all-reduce that carries bf16.
//!
//! This file holds the chapter's [`SimpleDistributedDataParallelism`]: the
//! library's finished wrapper (chapters 2 to 7), with your hook registered
//! through its public `register_comm_hook`, the plug-in point every user of
//! the library has. Nothing here is a seam: the library calls a hook the
//! way PyTorch does, and its default, without one, stays the plain
//! all-reduce.

use tch::nn::{self, Module};

pub use crate::ddp::{BucketingError, CommHook, SimpleDistributedDataParallelism, StepOptimizer};
use crate::dist::Group;

pub mod exercise; // the file you edit
pub mod solution; // the reference solution

/// `learner::f` is your `exercise.rs`, or `solution.rs` with `--features solutions`.
#[cfg(not(feature = "solutions"))]
pub use exercise as learner;
#[cfg(feature = "solutions")]
pub use solution as learner;

// ANCHOR: wrapper
/// The finished wrapper around `module`, whose buckets are averaged by YOUR
/// `learner::bf16_compress_hook` from the first backward on. Every rank
/// must call it.
pub fn with_bf16_gradients<M: Module>(
    module: M,
    vs: &nn::VarStore,
    pg: Group,
) -> Result<SimpleDistributedDataParallelism<M>, BucketingError> {
    let ddp = SimpleDistributedDataParallelism::new(module, vs, pg)?;
    ddp.register_comm_hook(learner::bf16_compress_hook);
    Ok(ddp)
}
// ANCHOR_END: wrapper
