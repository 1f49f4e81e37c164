//! Call tags: a name for the collectives a thread starts, such as
//! "gradient of `layers.0.weight`" or "bucket 2". Ranks whose calls pair up
//! with the same operation, shape and dtype but different tags get a
//! `Mismatch` instead of the sum of unrelated tensors.
//!
//! Why it is needed: calls pair by their number (call k of every rank meets
//! call k of every other rank). Without a tag, a call is named by the place
//! it was made from (`Call::here`): a rank that skips an all-reduce, or
//! makes two same-shaped ones written on different lines in another order,
//! pairs calls from different places, and that is a mismatch. What the place
//! cannot tell apart: one line that all-reduces same-shaped tensors in a
//! loop, walked in another order on one rank or with one iteration skipped;
//! the calls pair shape with shape, place with place. A tag names what the
//! call carries ("gradient of `a`"), so those differ too. PyTorch's
//! `TORCH_DISTRIBUTED_DEBUG=DETAIL` compares operation, shapes and dtypes
//! only, and NCCL compares nothing, so there both go unnoticed.
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
