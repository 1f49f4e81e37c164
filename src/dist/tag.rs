//! Call tags: a name for the collectives a thread starts, such as
//! "gradient of `layers.0.weight`" or "bucket 2". Ranks whose calls pair up
//! with the same operation, shape and dtype but different tags get a
//! `Mismatch` instead of the sum of unrelated tensors.
//!
//! Why it is needed: calls pair by their number (call k of every rank meets
//! call k of every other rank). A rank that skips one all-reduce, or walks
//! two same-shaped gradients in another order, still pairs shape with shape,
//! and without a name no backend can tell. PyTorch's
//! `TORCH_DISTRIBUTED_DEBUG=DETAIL` compares operation, shapes and dtypes
//! only, and NCCL compares nothing, so there it goes unnoticed too.
//!
//! Tested by `cargo test --test dist` (`tags.rs`).
//!
//! ```
//! use ddp_workbook::dist::{spawn, tagged, ReduceOp};
//! use ddp_workbook::tch::Tensor;
//!
//! let error = spawn(2, |pg| {
//!     // The ranks walk two same-shaped tensors in opposite orders.
//!     let names = if pg.rank() == 0 { ["a", "b"] } else { ["b", "a"] };
//!     for name in names {
//!         let mut t = Tensor::from_slice(&[1.0f32, 2.0]);
//!         tagged(name, || pg.all_reduce(&mut t, ReduceOp::Sum))?;
//!     }
//!     Ok(())
//! })
//! .unwrap_err();
//! assert!(error.to_string().contains("tagged \"a\""));
//! ```

use std::cell::RefCell;

thread_local! {
    static CURRENT: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Runs `body` with `tag` naming every collective this thread starts in it.
/// Inside another `tagged`, the names join: "sync 3, bucket 0".
pub fn tagged<R>(tag: impl AsRef<str>, body: impl FnOnce() -> R) -> R {
    let joined = CURRENT.with(|current| match current.borrow().as_deref() {
        Some(outer) => format!("{outer}, {}", tag.as_ref()),
        None => tag.as_ref().to_string(),
    });
    let previous = CURRENT.with(|current| current.replace(Some(joined)));
    // Put the outer tag back however `body` ends, a panic included.
    struct Restore(Option<String>);
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.with(|current| *current.borrow_mut() = self.0.take());
        }
    }
    let _restore = Restore(previous);
    body()
}

/// The tag of the calls this thread starts now, if any.
pub fn current_tag() -> Option<String> {
    CURRENT.with(|current| current.borrow().clone())
}
