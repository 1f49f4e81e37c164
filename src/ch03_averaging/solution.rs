//! Chapter 03 reference solution: average every gradient over all ranks.
//!
//! Run the chapter's tests on it: `cargo test --features solutions --test chapter_03`
//!
//! The reference lives in the library, where the benchmark uses it as the
//! baseline for buckets: `src/ddp/naive.rs` (the book shows it in chapter 3).

pub use crate::ddp::naive::sync_gradients;
