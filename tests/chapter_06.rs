//! Chapter 06 tests: overlapping communication with backward. The buckets
//! that leave during backward must give bitwise the same training as chapter
//! 5's buckets that leave after it, and one process on the global batch
//! within TOLERANCE; they must leave in one order on every rank, whatever
//! order the hooks fire in, the first before backward ends; a parameter
//! without a gradient must fail every rank by name (or be averaged in with
//! `find_unused_parameters`); `no_sync` must still send nothing.
//!
//! Your code:           `cargo test --test chapter_06`
//! The reference code:  `cargo test --features solutions --test chapter_06`
//!
//! Three modules, one test binary: `chapter_06/steps.rs` tries each of your
//! three functions alone; `chapter_06/waiting.rs` runs launch and finish on
//! an all-reduce that delivers its sum only at the wait;
//! `chapter_06/training.rs` trains with all three.

// `#[path]`, because a module file directly in `tests/` would be built as a
// test binary of its own.
mod common;
#[path = "chapter_06/steps.rs"]
mod steps;
#[path = "chapter_06/training.rs"]
mod training;
#[path = "chapter_06/waiting.rs"]
mod waiting;
