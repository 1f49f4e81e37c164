//! Chapter 06 reference solution: cut the epoch's order into one equal shard
//! per rank.
//!
//! Run the chapter's tests on it: `cargo test --features solutions --test chapter_06`
//!
//! The reference lives in the library, where the training run uses it:
//! `src/ddp/sampler.rs` (the book shows it in chapter 6).

pub use crate::ddp::{samples_per_rank, shard_indices};
