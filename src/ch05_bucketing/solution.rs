//! Chapter 05 reference solution: plan the buckets, then average one bucket of
//! gradients with a single all-reduce.
//!
//! Run the chapter's tests on it: `cargo test --features solutions --test chapter_05`
//!
//! The reference lives in the library, where the finished DDP uses it:
//! `src/ddp/reducer/layout.rs` (`plan_buckets`) and `src/ddp/reducer/buckets.rs`
//! (`sync_bucket`); the book shows both in chapter 5.

pub use crate::ddp::{plan_buckets, sync_bucket};
