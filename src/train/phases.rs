//! Where the training run's steps spend their time
//! (data, forward, backward, sync, optimizer), for the run's report and the
//! benchmarks (`cargo run --release --example bench_scaling`).

use std::cell::Cell;
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

/// The part of a step a lap of the [`PhaseClock`] ends.
#[derive(Clone, Copy, Debug)]
pub(super) enum Phase {
    Data,
    Forward,
    Backward,
    Optimizer,
}

/// Splits the steps' time into phases as they run: each [`lap`](Self::lap)
/// adds the time since the previous one to a phase. It takes `&self`, so
/// that every closure of a step (the loss, the callback after backward) can
/// hold it at once.
pub(super) struct PhaseClock {
    last: Cell<Instant>,
    phases: Cell<StepPhases>,
}

impl PhaseClock {
    pub(super) fn new() -> PhaseClock {
        PhaseClock { last: Cell::new(Instant::now()), phases: Cell::new(StepPhases::default()) }
    }

    /// Starts a step's first lap now, and returns now.
    pub(super) fn start(&self) -> Instant {
        let now = Instant::now();
        self.last.set(now);
        now
    }

    /// Adds the time since the last lap to `phase`.
    pub(super) fn lap(&self, phase: Phase) {
        let now = Instant::now();
        let since = now - self.last.replace(now);
        let mut phases = self.phases.get();
        match phase {
            Phase::Data => phases.data += since,
            Phase::Forward => phases.forward += since,
            Phase::Backward => phases.backward += since,
            Phase::Optimizer => phases.optimizer += since,
        }
        self.phases.set(phases);
    }

    /// The phases so far, summed over the steps.
    pub(super) fn phases(&self) -> StepPhases {
        self.phases.get()
    }
}
