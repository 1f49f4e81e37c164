//! ddp-workbook: build Distributed Data Parallel training yourself, one
//! chapter at a time, on libtorch through the `tch` crate.
//!
//! - [`dist`]: the process-group layer (ranks, collectives, `spawn`);
//! - [`ddp`]: the finished DDP library, which the training run ([`train`])
//!   and the examples use;
//! - [`models`] and [`data`]: a small MLP, a tiny GPT and synthetic data;
//! - `ch01_collectives` ... : one module per chapter, a lesson over the
//!   library: the learner's `exercise.rs`, the reference `solution.rs`, and
//!   the glue the lesson needs. `docs/architecture.md` maps it all.
//!
//! `tch` is re-exported so that examples and notebooks use exactly the
//! version this crate was built with.

pub use tch;

pub mod autograd;
pub mod data;
pub mod ddp;
pub mod dist;
mod error_text;
pub mod fingerprint;
pub mod models;
pub mod seed;

pub use seed::with_seed;
pub mod check;

pub mod ch01_collectives;
pub mod ch02_replicas;
pub mod ch03_averaging;
pub mod ch04_accumulation;
pub mod ch05_bucketing;
pub mod ch06_overlap;
pub mod ch07_sharding;
pub mod ch11_zero;
pub mod ch12_bf16;
pub mod ch13_sharded_gradients;
pub mod ch14_fsdp;
pub mod notebook;
pub mod train;
