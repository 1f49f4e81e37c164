//! Chapter 14 reference solution: the rows each rank keeps, and FSDP's
//! schedule (what to gather, prefetch, free and reduce-scatter around each
//! unit's forward and backward).
//!
//! Run the chapter's tests on it: `cargo test --features solutions --test chapter_14`
//!
//! The reference lives in the library, where the finished `FullyShard`
//! runs it: `src/ddp/fsdp/schedule.rs`; the book shows it at the end of
//! chapter 14.

pub use crate::ddp::fsdp_schedule::{post_backward, post_forward, pre_backward, pre_forward, shard_rows};
