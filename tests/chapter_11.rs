//! Chapter 11 tests: sharding the optimizer (ZeRO stage 1).
//!
//! Your code:           `cargo test --test chapter_11`
//! The reference code:  `cargo test --features solutions --test chapter_11`
//! See the measured numbers: add `-- --nocapture`
//!
//! Several files, one test binary:
//! - `chapter_11/shards.rs`: `shard_of` alone, against its contract: the
//!   ranks agree on one shard length and padded length, the shards follow
//!   each other in rank order and cover the buffer, with less than one
//!   element of padding per rank (empty buffers and more ranks than
//!   elements included), and the chapter's table by hand; and
//!   `ShardedAdamW::new` taking your shards but refusing, naming the rule
//!   `offset == rank * len`, a `shard_of` that puts every rank at offset 0
//!   or the ranks in reverse;
//! - `chapter_11/step_bucket.rs`: `step_bucket` alone on one bucket built by
//!   hand on 3 ranks, bitwise against AdamW in one process with the sum
//!   divided by 3; when it differs, it names the likely cause (no division,
//!   a multiplication by 1/N, NCCL's `Avg`, moments or shard stepped on a
//!   copy, the gathered shards not copied back);
//! - `chapter_11/training.rs`: `ShardedAdamW` trained on 2, 3 and 4 ranks
//!   with buckets that do not divide by the world size, against plain DDP
//!   with AdamW and one process on the global batch, after every step; the
//!   moments each rank keeps (1/N of DDP's) and the bytes it hands to each
//!   collective call, counted by a group around the library's; a failure
//!   quotes `step_bucket.rs`'s diagnosis;
//! - `chapter_11/checkpoint.rs`: the shards gathered into one checkpoint,
//!   and runs that resume from it on the same or another world size, or
//!   with plain AdamW, ending where an uninterrupted run ends;
//! - `chapter_11/memory.rs`: the moments per rank on the training run's
//!   tiny GPT, on 1, 2, 4 and 8 ranks (the book's table), and every ZeRO
//!   stage's bytes per parameter and for 7e9 parameters, checked against
//!   `ddp::plan_memory` (the closing chapter's table);
//! - `chapter_11/controls.rs`: the controls, which never run your code: the
//!   DDP run matches one process, AdamW on slices of a flat buffer gives
//!   the bits AdamW gives on the whole, and the wrong averages
//!   `step_bucket.rs` looks for give other bits on its bucket.

// `#[path]`, because a module file directly in `tests/` would be built as a
// test binary of its own.
#[path = "chapter_11/checkpoint.rs"]
mod checkpoint;
mod common;
#[path = "chapter_11/controls.rs"]
mod controls;
#[path = "chapter_11/memory.rs"]
mod memory;
#[path = "chapter_11/shards.rs"]
mod shards;
#[path = "chapter_11/step_bucket.rs"]
mod step_bucket;
#[path = "chapter_11/training.rs"]
mod training;
