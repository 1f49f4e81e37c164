//! Panics that a notebook's rank closures raise, kept off stderr and
//! remembered with their place: the notebook runner treats `panicked at` on
//! stderr as a failed notebook, and a failure a cell shows on purpose (a
//! `todo!()` still in an exercise) must not count as one; the report under
//! the cell shows it instead. Also the lock every notebook helper takes on
//! what its ranks share. Used by `on_ranks` (`src/notebook.rs`) and `World`
//! (`world.rs`, `rank.rs`); tested through them, `cargo test --lib notebook`
//! and `cargo test --test notebook_world`.

use std::cell::{Cell, RefCell};
use std::panic;
use std::sync::{Mutex, MutexGuard, Once};

thread_local! {
    /// Set while a rank thread runs the notebook's closure: the panic hook
    /// then keeps the panic off stderr, because the report shows it.
    static QUIET_PANICS: Cell<bool> = const { Cell::new(false) };
    /// Where the last quiet panic of this thread happened.
    static LAST_PANIC_LOCATION: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Runs `work` with this thread's panics kept off stderr (`work` is expected
/// to catch them itself). The hook is installed here, at every call, and not
/// once per world: evcxr links a copy of this crate, with its own flag and
/// hook, into every cell, and the copy that sets the flag must be the one
/// whose hook reads it.
pub(super) fn quietly<R>(work: impl FnOnce() -> R) -> R {
    install_quiet_panic_hook();
    /// Clears the flag on every way out, a panic that `work` let through included.
    struct Loud;
    impl Drop for Loud {
        fn drop(&mut self) {
            QUIET_PANICS.with(|quiet| quiet.set(false));
        }
    }
    QUIET_PANICS.with(|quiet| quiet.set(true));
    let _loud = Loud;
    work()
}

/// Where this thread's last quiet panic happened (`file:line:column`), once.
pub(super) fn last_panic_place() -> Option<String> {
    LAST_PANIC_LOCATION.with(|place| place.borrow_mut().take())
}

/// Wraps the process's panic hook once (per copy of this crate) so that
/// quiet panics are recorded, not printed. Every other panic still goes to
/// the previous hook.
fn install_quiet_panic_hook() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if QUIET_PANICS.with(Cell::get) {
                let place = info.location().map(|l| format!("{}:{}:{}", l.file(), l.line(), l.column()));
                LAST_PANIC_LOCATION.with(|l| *l.borrow_mut() = place);
            } else {
                previous(info);
            }
        }));
    });
}

/// A poisoned lock (a rank panicked while holding it) still holds what was
/// written before the panic, which is exactly what the notebook should show.
pub(super) fn lock<T>(shared: &Mutex<T>) -> MutexGuard<'_, T> {
    shared.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
