//! Chapter 13 tests: sharding the gradients (ZeRO stage 2; FSDP's
//! `SHARD_GRAD_OP`).
//!
//! Your code:           `cargo test --test chapter_13`
//! The reference code:  `cargo test --features solutions --test chapter_13`
//! See the measured numbers: add `-- --nocapture`
//!
//! Several files, one test binary:
//! - `chapter_13/buckets.rs`: `reduce_scatter_bucket` and `keep_shard` alone, on
//!   one bucket built by hand on 3 ranks (one member without a gradient,
//!   padding): the buffer that leaves, no member keeping its gradient, and
//!   the shard each rank keeps, bit for bit the sum over the ranks added in
//!   rank order and divided by 3, as DDP's all-reduce and division leave it;
//! - `chapter_13/training.rs`: `ShardGradOp` with your functions trained on
//!   2 and 3 ranks (several buckets, padding, a bucket smaller than the
//!   world size, accumulation under `no_sync`), against the workbook's DDP
//!   with AdamW bit for bit and one process on the global batch; the peak of
//!   gradient bytes per rank, from the memory ledger, below DDP's full
//!   gradient;
//! - `chapter_13/controls.rs`: the controls, which never run your code: the
//!   library's own ZeRO-2 takes DDP's steps, and DDP matches one process.

#[path = "chapter_13/buckets.rs"]
mod buckets;
mod common;
#[path = "chapter_13/controls.rs"]
mod controls;
#[path = "chapter_13/training.rs"]
mod training;
