//! The median the benchmark examples report,
//! one copy for all of them. Included by each with
//! `#[path = "support/median.rs"] mod median;` (for example
//! `cargo run --release --example bench_optimizer`).

use std::time::Duration;

/// The middle time of `times` (the upper of the two middle ones for an even
/// count): a median, not a mean, so that a few rounds slowed by the
/// machine's other work do not move it.
pub fn median(mut times: Vec<Duration>) -> Duration {
    assert!(!times.is_empty(), "a median of no times: time at least one round");
    times.sort();
    times[times.len() / 2]
}
