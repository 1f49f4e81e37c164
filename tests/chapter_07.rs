//! Chapter 07 tests: sharding the data, and the whole DDP loop.
//!
//! Your code:           `cargo test --test chapter_07`
//! The reference code:  `cargo test --features solutions --test chapter_07`
//! See the measured numbers: add `-- --nocapture`
//!
//! Several files, one test binary:
//! - `chapter_07/sampler.rs`: the `DistributedSampler` alone: equal counts,
//!   disjoint shards that cover the data set, the padding and the stride;
//!   `chapter_07/sampler_order.rs`: a new order every epoch and the same one
//!   on every rank; its controls (`chapter_07/sampler_controls.rs`: the
//!   library's shuffle, bad input);
//! - `chapter_07/training.rs`: the chapter-7 `SimpleDistributedDataParallelism`
//!   trained with the sampler, accumulation and small buckets on 2 and 3
//!   ranks, against one process on the global batch the shards form, the
//!   checkpoint rank 0 writes, and what skipping `set_epoch` costs;
//! - `chapter_07/controls.rs`: the controls, which never run your code: every
//!   rank on the same shard, unequal shards.

// `#[path]`, because a module file directly in `tests/` would be built as a
// test binary of its own.
mod common;
#[path = "chapter_07/controls.rs"]
mod controls;
#[path = "chapter_07/sampler.rs"]
mod sampler;
#[path = "chapter_07/training.rs"]
mod training;
