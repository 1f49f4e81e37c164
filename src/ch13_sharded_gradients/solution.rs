//! Chapter 13 reference solution: what leaves when a bucket's gradients are
//! final, and what a rank keeps once its reduce-scatter is done.
//!
//! Run the chapter's tests on it: `cargo test --features solutions --test chapter_13`
//!
//! The reference lives in the library, where ZeRO-2 uses it:
//! `src/ddp/zero/grad_shards.rs` (`reduce_scatter_bucket`, `keep_shard`); the
//! book shows both on chapter 13's solution page.

pub use crate::ddp::{keep_shard, reduce_scatter_bucket};
