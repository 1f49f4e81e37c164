//! Chapter 07 reference solution: how many examples each rank gets, and
//! which ones, epoch by epoch.
//!
//! Run the chapter's tests on it: `cargo test --features solutions --test chapter_07`
//!
//! The reference lives in the library, where the training run uses it:
//! `src/ddp/sampler.rs` (the book shows it in chapter 7).

pub use crate::ddp::{epoch_shard, samples_per_rank};
