//! Seeded, race-free construction of anything random (models, data).
//!
//! libtorch has one random generator per process, shared by every rank
//! thread of the in-process backend. If rank 0 seeds it and rank 1 draws from
//! it before rank 0 has built its model, the replicas differ. [`with_seed`]
//! holds a process-wide lock from `manual_seed` to the end of construction,
//! so a seeded build is the same whatever the other threads are doing.

use std::sync::Mutex;

static GENERATOR_LOCK: Mutex<()> = Mutex::new(());

/// Seeds libtorch's global generator and runs `build` while no other thread
/// can draw from it. The same seed gives bitwise the same result every time.
pub fn with_seed<T>(seed: i64, build: impl FnOnce() -> T) -> T {
    let _guard = GENERATOR_LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    tch::manual_seed(seed);
    build()
}
