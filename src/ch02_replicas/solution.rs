//! Chapter 02 reference solution: check that every rank holds the same
//! tensors as rank 0, and make every rank fail together if not.
//!
//! Run the chapter's tests on it: `cargo test --features solutions --test chapter_02`
//!
//! The reference lives in the library, where the finished DDP uses it:
//! `src/ddp/replica_check.rs` (the book shows it in chapter 2).

pub use crate::ddp::verify_replicas;
