//! Chapter 14 tests: sharding the parameters (FSDP, ZeRO-3, `fully_shard`).
//!
//! Your code:           `cargo test --test chapter_14`
//! The reference code:  `cargo test --features solutions --test chapter_14`
//! See the measured numbers: add `-- --nocapture`
//!
//! Several files, one test binary:
//! - `chapter_14/schedule.rs`: your schedule walked through a step on
//!   paper, naming a mistake (frees too early, forgets to free, never
//!   prefetches, reduce-scatters wrongly) before any tensor is touched;
//! - `chapter_14/shards.rs`: `shard_rows` against its contract and the
//!   chapter's table, worked out by hand;
//! - `chapter_14/training.rs`: your FSDP against one process on the global
//!   batch and the workbook's DDP after every step (bitwise on 2 ranks),
//!   `reshard_after_forward` true and false, SGD and AdamW, accumulation,
//!   an unused parameter, more ranks than rows;
//! - `chapter_14/wire.rs`: the bytes handed to each collective call in a
//!   step, against values worked out by hand and DDP's (1.5 times, and why);
//! - `chapter_14/memory.rs`: the ledger's peak bytes per rank against DDP's;
//! - `chapter_14/controls.rs`: the controls, which never run your code.

// `#[path]`, because a module file directly in `tests/` would be built as a
// test binary of its own.
mod common;
#[path = "chapter_14/controls.rs"]
mod controls;
#[path = "chapter_14/memory.rs"]
mod memory;
#[path = "chapter_14/schedule.rs"]
mod schedule;
#[path = "chapter_14/shards.rs"]
mod shards;
#[path = "chapter_14/training.rs"]
mod training;
#[path = "chapter_14/wire.rs"]
mod wire;
