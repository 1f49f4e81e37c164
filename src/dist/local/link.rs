//! A simulated network link for the in-process backend: every all-reduce
//! takes at least as long as the α–β model of chapter 5 says it would on a
//! real network, `α + 2(N − 1)/N · n / β` for n bytes on N ranks. Ranks on
//! one machine share memory, and their all-reduce is nearly free; with a
//! link, a laptop shows what overlapping communication with backward hides
//! on a cluster. Turn it on with `SpawnOptions::link`.

use std::time::{Duration, Instant};

/// A latency (α, per call) and a bandwidth (β).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SimulatedLink {
    pub latency: Duration,
    pub bytes_per_second: f64,
}

impl SimulatedLink {
    /// A link of `latency` and `gbit_per_second` (10 for 10 Gbit/s Ethernet).
    pub fn new(latency: Duration, gbit_per_second: f64) -> Self {
        SimulatedLink { latency, bytes_per_second: gbit_per_second * 1e9 / 8.0 }
    }

    /// How long a ring all-reduce of `bytes` on `ranks` ranks takes on this
    /// link: nothing moves on one rank.
    pub fn all_reduce_time(&self, bytes: u64, ranks: usize) -> Duration {
        if ranks <= 1 {
            return Duration::ZERO;
        }
        let moved = 2.0 * (ranks - 1) as f64 / ranks as f64 * bytes as f64;
        self.latency + Duration::from_secs_f64(moved / self.bytes_per_second)
    }
}

/// Sleeps until `deadline`, to within a few microseconds. Linux lets a
/// sleeping thread wake up to 50 µs late by default ("timer slack", which
/// batches wake-ups to save power); on a link of 50 µs that would double
/// every latency. This thread's slack is set to 1 ns first (per thread,
/// cheap, and harmless for a thread that only waits for its collectives).
pub(super) fn sleep_until(deadline: Instant) {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_TIMERSLACK takes one integer and touches no memory.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong);
    }
    std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
}
