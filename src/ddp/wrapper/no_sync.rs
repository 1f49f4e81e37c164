//! Spoiler: this file holds the library's answer to chapter 4's
//! `open_no_sync` and `NoSyncScope` (`src/ch04_accumulation/exercise.rs`):
//! `SyncSwitch::no_sync` and `NoSyncGuard`. Working through the book? Write
//! yours first; the chapter does not need this file, and shows its answer on
//! the chapter's solution page.
//!
//! The `no_sync` switch: while a scope is open, `backward` only accumulates
//! gradients on this rank and sends nothing (PyTorch's
//! `require_backward_grad_sync` and `DistributedDataParallel.no_sync()`).
//! Chapter 4 of the book builds the scope; this is the switch and the guard
//! that every later wrapper uses.

use std::cell::Cell;

use crate::dist::DistError;

/// Whether `backward` averages the gradients over the ranks: on unless it
/// was set off by hand or a `no_sync` guard is open. `Cell`s, so that a
/// guard holding only `&self` can flip it while `forward` and `backward`,
/// which also take `&self`, stay callable inside its scope.
#[derive(Debug)]
pub struct SyncSwitch {
    /// What [`set`](Self::set) (and chapter 4's scope) last wrote.
    require_backward_grad_sync: Cell<bool>,
    /// How many [`NoSyncGuard`]s are open. A count, not a saved state per
    /// guard: guards dropped in any order leave the switch off until the
    /// last one closes, and then as `set` left it.
    open_guards: Cell<usize>,
}

impl SyncSwitch {
    /// A switch that starts on: every `backward` syncs.
    pub fn new() -> Self {
        SyncSwitch { require_backward_grad_sync: Cell::new(true), open_guards: Cell::new(0) }
    }

    /// Whether the next `backward` will average the gradients.
    pub fn is_on(&self) -> bool {
        self.require_backward_grad_sync.get() && self.open_guards.get() == 0
    }

    /// Runs `sync` if the switch is on, and nothing if a `no_sync` scope is
    /// open: what `backward` does after the local backward pass.
    pub fn sync_if_on(&self, sync: impl FnOnce() -> Result<(), DistError>) -> Result<(), DistError> {
        if self.is_on() {
            sync()?;
        }
        Ok(())
    }

    /// Sets the switch by hand (the "explicit flag" style). Prefer
    /// [`no_sync`](Self::no_sync), which cannot forget to turn it back on.
    /// While a guard is open the switch stays off whatever this sets.
    pub fn set(&self, on: bool) {
        self.require_backward_grad_sync.set(on);
    }

    /// Opens a `no_sync` scope: the switch is off until the guard is dropped,
    /// then back to what it was (also on `?` and on panic, and when nested,
    /// and when guards are dropped in another order than they were opened):
    ///
    /// ```
    /// use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
    /// use ddp_workbook::ddp::SyncSwitch;
    ///
    /// let switch = SyncSwitch::new();
    /// {
    ///     let _outer = switch.no_sync();
    ///     {
    ///         let _inner = switch.no_sync();
    ///     }
    ///     assert!(!switch.is_on(), "closing an inner scope leaves the switch off");
    ///     let caught = catch_unwind(AssertUnwindSafe(|| {
    ///         let _inner = switch.no_sync();
    ///         resume_unwind(Box::new("a panic inside a nested scope"));
    ///     }));
    ///     assert!(caught.is_err() && !switch.is_on(), "and so does a panic out of one");
    /// }
    /// assert!(switch.is_on(), "closing the outermost scope turns it back on");
    /// let (first, second) = (switch.no_sync(), switch.no_sync());
    /// drop(first); // out of order: the second is still open
    /// assert!(!switch.is_on(), "a guard still open keeps the switch off");
    /// drop(second);
    /// assert!(switch.is_on(), "and the last one to close turns it back on");
    /// switch.set(false);
    /// drop(switch.no_sync());
    /// assert!(!switch.is_on(), "a scope opened while the switch was off leaves it off");
    /// ```
    pub fn no_sync(&self) -> NoSyncGuard<'_> {
        self.open_guards.set(self.open_guards.get() + 1);
        NoSyncGuard { open_guards: &self.open_guards }
    }

    /// The switch itself, for chapter 4's scope (through `ddp::seams`).
    pub(crate) fn cell(&self) -> &Cell<bool> {
        &self.require_backward_grad_sync
    }
}

impl Default for SyncSwitch {
    fn default() -> Self {
        Self::new()
    }
}

// ANCHOR: guard
/// An open `no_sync` scope. While it (or any other guard of its switch)
/// lives, `backward` only accumulates; once the last one is dropped, the
/// switch is as it was before the first opened.
#[must_use = "the no_sync scope ends when the guard is dropped: bind it with `let _guard = ddp.no_sync();`"]
pub struct NoSyncGuard<'a> {
    /// The switch's count of open guards, this one included.
    open_guards: &'a Cell<usize>,
}

impl Drop for NoSyncGuard<'_> {
    fn drop(&mut self) {
        // Runs on every way out of the scope: the end of the block, `return`
        // or `?`, and a panic unwinding through it. Only a `Cell::set` here:
        // a panic inside `drop` while a panic unwinds aborts the process.
        // (Each guard counted itself in, so the count is at least 1.)
        self.open_guards.set(self.open_guards.get().saturating_sub(1));
    }
}
// ANCHOR_END: guard
