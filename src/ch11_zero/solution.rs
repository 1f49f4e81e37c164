//! Chapter 11 reference solution: which shard a rank owns, and one ZeRO-1
//! step of a bucket (reduce-scatter, AdamW on the shard, all-gather).
//!
//! Run the chapter's tests on it: `cargo test --features solutions --test chapter_11`
//!
//! The reference lives in the library, where the finished run's `--zero 1`
//! uses it: `src/ddp/zero/shards.rs` (`shard_of`, `step_bucket`); the book shows
//! both at the end of chapter 11.

pub use crate::ddp::{shard_of, step_bucket};
