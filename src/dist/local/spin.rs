//! How a rank of the in-process backend waits for the others: it watches
//! for a short while when every rank has a core of its own, then sleeps on
//! the world's condvar. Also counts, for the whole process, how often each
//! happened, so that `bench_collectives` can show why a slow run was slow.
//!
//! Why watch first: a condvar wake-up costs tens of microseconds (the
//! sleeper's thread must be scheduled again), as long as reducing a few
//! hundred KiB. Why only with a core per rank: with more ranks than cores a
//! watching rank takes the core from the rank it is waiting for.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long a rank watches before it sleeps.
pub(super) const SPIN: Duration = Duration::from_micros(50);

/// Whether ranks of a group of `size` may watch instead of sleeping: one
/// core each.
pub(super) fn may_spin(size: usize) -> bool {
    size <= cores()
}

/// The machine's cores, read once.
pub(super) fn cores() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1))
}

/// Watches `ready` for at most [`SPIN`]; whether it became true. After the
/// first microseconds it yields between looks: on a machine busy with other
/// work, the rank it waits for may need this very core.
pub(super) fn spin_until(ready: impl Fn() -> bool) -> bool {
    let started = Instant::now();
    let mut looks = 0u32;
    while !ready() {
        if started.elapsed() >= SPIN {
            COUNTS.spins_lost.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        looks += 1;
        if looks < 256 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
    COUNTS.spins_won.fetch_add(1, Ordering::Relaxed);
    true
}

/// How often ranks of this process waited, each way, since it started (all
/// groups together). Differences between two readings are what one run cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WaitCounts {
    /// Watches that saw what they waited for: no sleep needed.
    pub spins_won: u64,
    /// Watches that gave up after 50 µs; a sleep followed.
    pub spins_lost: u64,
    /// Sleeps on the condvar (each ends in a wake-up, or a deadline).
    pub sleeps: u64,
    /// Wake-ups sent: every change that sleepers may be waiting for.
    pub wake_ups: u64,
    /// Blocks of split all_reduces (`split_reduce.rs`), and of those the
    /// ones done by the rank that did the most in its call: on N ranks
    /// with a core each, about 1/N of them when the ranks worked at once.
    pub blocks: u64,
    pub blocks_by_busiest_rank: u64,
}

impl std::ops::Sub for WaitCounts {
    type Output = WaitCounts;
    fn sub(self, before: WaitCounts) -> WaitCounts {
        WaitCounts {
            spins_won: self.spins_won - before.spins_won,
            spins_lost: self.spins_lost - before.spins_lost,
            sleeps: self.sleeps - before.sleeps,
            wake_ups: self.wake_ups - before.wake_ups,
            blocks: self.blocks - before.blocks,
            blocks_by_busiest_rank: self.blocks_by_busiest_rank - before.blocks_by_busiest_rank,
        }
    }
}

struct Counts {
    spins_won: AtomicU64,
    spins_lost: AtomicU64,
    sleeps: AtomicU64,
    wake_ups: AtomicU64,
    blocks: AtomicU64,
    blocks_by_busiest_rank: AtomicU64,
}

static COUNTS: Counts = Counts {
    spins_won: AtomicU64::new(0),
    spins_lost: AtomicU64::new(0),
    sleeps: AtomicU64::new(0),
    wake_ups: AtomicU64::new(0),
    blocks: AtomicU64::new(0),
    blocks_by_busiest_rank: AtomicU64::new(0),
};

pub(super) fn count_sleep() {
    COUNTS.sleeps.fetch_add(1, Ordering::Relaxed);
}

pub(super) fn count_wake_up() {
    COUNTS.wake_ups.fetch_add(1, Ordering::Relaxed);
}

pub(super) fn count_blocks(blocks: usize, by_busiest_rank: usize) {
    COUNTS.blocks.fetch_add(blocks as u64, Ordering::Relaxed);
    COUNTS.blocks_by_busiest_rank.fetch_add(by_busiest_rank as u64, Ordering::Relaxed);
}

/// The counts so far (see [`WaitCounts`]).
pub fn wait_counts() -> WaitCounts {
    let read = |c: &AtomicU64| c.load(Ordering::Relaxed);
    WaitCounts {
        spins_won: read(&COUNTS.spins_won),
        spins_lost: read(&COUNTS.spins_lost),
        sleeps: read(&COUNTS.sleeps),
        wake_ups: read(&COUNTS.wake_ups),
        blocks: read(&COUNTS.blocks),
        blocks_by_busiest_rank: read(&COUNTS.blocks_by_busiest_rank),
    }
}
