//! ddp-workbook: build Distributed Data Parallel training yourself, one
//! chapter at a time, on libtorch through the `tch` crate.
//!
//! - [`dist`]: the process-group layer (ranks, collectives, `spawn`);
//! - [`models`] and [`data`]: a small MLP, a tiny GPT and synthetic data;
//! - `ch01` ... : one module per chapter, each with the learner's
//!   `exercise.rs` and the reference `solution.rs`.
//!
//! `tch` is re-exported so that examples and notebooks use exactly the
//! version this crate was built with.

pub use tch;

pub mod data;
pub mod dist;
pub mod models;
pub mod seed;

pub use seed::with_seed;
pub mod check;

pub mod ch01_collectives;
pub mod ch02_replicas;
pub mod ch03_averaging;
pub mod ch04_accumulation;
pub mod ch05_bucketing;
pub mod ch06_sharding;
pub mod notebook;
pub mod train;
