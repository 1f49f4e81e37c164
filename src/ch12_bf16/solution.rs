//! Chapter 12 reference solution: the bf16 communication hook.
//!
//! Run the chapter's tests on it: `cargo test --features solutions --test chapter_12`
//!
//! The reference lives in the library, where the finished wrapper can use
//! it (`src/ddp/reducer/bf16_hooks.rs`); the book shows it at the end of chapter 12.

pub use crate::ddp::bf16_compress_hook;
