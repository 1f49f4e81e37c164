//! Tests of the process-group layer (`src/dist/`): every collective on
//! several world sizes and dtypes, and what happens when ranks misbehave.
//!
//! Run: `cargo test --test dist`
//!
//! The tests live in `tests/dist/*.rs`, compiled into this one test binary:
//! - `collectives.rs`: results are right and bitwise identical on every rank;
//! - `failures.rs`: panics, errors, early exits, skipped calls, mismatches;
//! - `stats_and_grads.rs`: call counters; parameters and their gradients;
//! - `invalid.rs`: bad arguments, and `DDP_TIMEOUT_SECS`;
//! - `groups.rs`: sub-groups made with `new_group`;
//! - `tags.rs`: same-shaped calls in another order, untagged and tagged;
//! - `split_reduce.rs`: the in-place all_reduce: handles waited in any
//!   order, and the rank-ordered result bitwise for every operation;
//! - `schemes.rs`: the all_reduce's two algorithms, forced and chosen, on 1
//!   to 256 ranks, around the size where the choice changes.
//!
//! No test can hang: every `spawn` here has an explicit timeout.

// `#[path]`, because a test's own modules would otherwise sit in `tests/`,
// where cargo would build each one as a separate test binary.
#[path = "dist/collectives.rs"]
mod collectives;
#[path = "dist/failures.rs"]
mod failures;
#[path = "dist/groups.rs"]
mod groups;
#[path = "dist/invalid.rs"]
mod invalid;
#[path = "dist/link.rs"]
mod link;
#[path = "dist/schemes.rs"]
mod schemes;
#[path = "dist/split_reduce.rs"]
mod split_reduce;
#[path = "dist/stats_and_grads.rs"]
mod stats_and_grads;
#[path = "dist/tags.rs"]
mod tags;

use std::fmt::Debug;
use std::time::Duration;

use ddp_workbook::dist::{spawn_with, DistError, Group, RankFailure, SpawnError, SpawnOptions};
use ddp_workbook::tch::{Kind, Tensor};

/// For runs that should succeed: long enough that a busy machine never trips
/// it, short enough that a bug fails the test instead of hanging it.
pub const GENEROUS: Duration = Duration::from_secs(30);
/// For runs that are meant to time out.
pub const SHORT: Duration = Duration::from_millis(300);
/// "Promptly": a failure must reach every rank well within `GENEROUS`.
pub const PROMPT: Duration = Duration::from_secs(10);

/// Runs `f` on `n` ranks and returns their results; fails the test with the
/// spawn error if any rank failed.
pub fn run_ok<T: Send>(n: usize, f: impl Fn(Group) -> anyhow::Result<T> + Sync) -> Vec<T> {
    spawn_with(SpawnOptions::new(n).timeout(GENEROUS), f)
        .unwrap_or_else(|error| panic!("spawn with {n} rank(s) failed: {error}"))
}

/// Runs `f` on `n` ranks with `timeout` and returns the error it must fail with.
pub fn run_err<T: Send + Debug>(
    n: usize,
    timeout: Duration,
    f: impl Fn(Group) -> anyhow::Result<T> + Sync,
) -> SpawnError {
    match spawn_with(SpawnOptions::new(n).timeout(timeout), f) {
        Ok(results) => panic!("expected the run to fail, but every rank returned: {results:?}"),
        Err(error) => error,
    }
}

/// The ranks that failed, in the order they failed.
pub fn failed_ranks(error: &SpawnError) -> Vec<usize> {
    match error {
        SpawnError::RanksFailed { failures } => failures.iter().map(|(rank, _)| *rank).collect(),
        other => panic!("expected ranks to fail, got {other}"),
    }
}

/// The `DistError` that `rank` returned (the test fails if it did anything else).
pub fn dist_error(error: &SpawnError, rank: usize) -> &DistError {
    match error.failure_of(rank) {
        Some(RankFailure::Error(e)) => e
            .downcast_ref::<DistError>()
            .unwrap_or_else(|| panic!("rank {rank} failed with something other than a DistError: {e:#}")),
        other => panic!("rank {rank}: expected a DistError, got {other:?}\nthe whole error: {error}"),
    }
}

/// The raw bytes of a tensor, to compare results bit for bit (`==` on floats
/// would call 0.0 and -0.0 equal, and NaN unequal to itself).
pub use ddp_workbook::check::tensor_bytes as bytes;

/// Fails unless every rank's tensor has the same dtype, shape and bits as rank 0's.
pub fn assert_same_on_every_rank(per_rank: &[Tensor], what: &str) {
    let first = &per_rank[0];
    for (rank, tensor) in per_rank.iter().enumerate() {
        assert_eq!((tensor.kind(), tensor.size()), (first.kind(), first.size()), "{what}: rank {rank}");
        assert!(bytes(tensor) == bytes(first), "{what}: rank {rank} holds {tensor} but rank 0 holds {first}");
    }
}

/// Rank `rank`'s test input: `shape` values that differ per rank, in `kind`.
/// Integers for integer kinds; for float kinds, values such as 0.1 that are
/// not exact in binary, so that the order of a sum shows in its last bits.
pub fn input(rank: usize, kind: Kind, shape: &[i64]) -> Tensor {
    let numel: i64 = shape.iter().product();
    let ints: Vec<i64> = (0..numel as usize).map(|i| ((i * 7 + rank * 5) % 13) as i64 - 6).collect();
    let values = Tensor::from_slice(&ints).reshape(shape);
    match kind {
        Kind::Float | Kind::Double => {
            (values.to_kind(Kind::Double) / 7.0 + 0.1 * (rank + 1) as f64).to_kind(kind)
        }
        _ => values.to_kind(kind),
    }
}

/// A tensor's values as f64, flattened.
pub fn values(tensor: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(tensor.to_kind(Kind::Double).flatten(0, -1)).expect("a tensor converts to f64")
}
