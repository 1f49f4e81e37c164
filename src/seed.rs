//! Seeded, race-free construction of anything random (models, data).
//!
//! libtorch has one random generator per process, shared by every rank
//! thread of the in-process backend. If rank 0 seeds it and rank 1 draws from
//! it before rank 0 has built its model, the replicas differ. [`with_seed`]
//! holds a process-wide lock from `manual_seed` to the end of construction,
//! so a seeded build is the same whatever other seeded builds are doing.
//! The lock only keeps out other `with_seed` callers: a thread that draws
//! from libtorch's generator outside `with_seed` (a bare `Tensor::randn`)
//! can still change the numbers, so every random draw in this crate goes
//! through `with_seed`.
//!
//! Checked by `cargo test --test models` (four ranks building at once).

use std::cell::Cell;
use std::sync::Mutex;

// ANCHOR: with_seed
static GENERATOR_LOCK: Mutex<()> = Mutex::new(());

thread_local! {
    /// Whether this thread already holds GENERATOR_LOCK, so that a seeded
    /// build may call another one (`Mlp::seeded` inside `with_seed`).
    static HOLDS_LOCK: Cell<bool> = const { Cell::new(false) };
}

/// Seeds libtorch's global generator and runs `build` while no other thread
/// can draw from it. The same seed gives bitwise the same result every time.
/// Calls may nest: an inner call re-seeds and runs under the outer lock.
pub fn with_seed<T>(seed: i64, build: impl FnOnce() -> T) -> T {
    if HOLDS_LOCK.with(Cell::get) {
        tch::manual_seed(seed);
        return build();
    }
    let _guard = GENERATOR_LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    HOLDS_LOCK.with(|held| held.set(true));
    // Cleared on the way out, also when `build` panics.
    struct Release;
    impl Drop for Release {
        fn drop(&mut self) {
            HOLDS_LOCK.with(|held| held.set(false));
        }
    }
    let _release = Release;
    tch::manual_seed(seed);
    build()
}
// ANCHOR_END: with_seed
