//! src/train/phases.rs: where the training run's steps spend their time
//! (data, forward, backward, sync, optimizer), for the run's report and the
//! benchmarks (`cargo run --release --example bench_scaling`).

use std::time::{Duration, Instant};

/// Where one rank's training steps spent their time, summed over the steps.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepPhases {
    /// Looking up and cutting the micro-batches.
    pub data: Duration,
    /// The forward pass and the loss.
    pub forward: Duration,
    /// The backward pass, without the gradient sync.
    pub backward: Duration,
    /// The gradient sync (the wrapper's `sync_time`: communication and waiting).
    pub sync: Duration,
    pub optimizer: Duration,
}

/// The time since the last lap.
pub(super) struct Lap(Instant);

impl Lap {
    pub(super) fn from(start: Instant) -> Lap {
        Lap(start)
    }

    pub(super) fn next(&mut self) -> Duration {
        let now = Instant::now();
        let since = now - self.0;
        self.0 = now;
        since
    }
}
