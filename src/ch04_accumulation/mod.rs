//! Chapter 04: gradient accumulation and `no_sync`. One optimizer step now
//! consumes k micro-batches per rank: their gradients add up in `.grad`, and
//! the ranks talk only once, after the last one. You write the two pieces
//! that make this work, in `exercise.rs`:
//!
//! 1. [`begin_no_sync`]: turns the sync switch off and remembers how it was,
//!    so that a [`NoSyncGuard`] can put it back when its scope ends;
//! 2. [`accumulate_and_step`]: the accumulation loop, from `zero_grad` to
//!    `optimizer.step()`.
//!
//! Your code:           `cargo test --test chapter_04`
//! The reference code:  `cargo test --features solutions --test chapter_04`
//!
//! This file holds chapter 3's wrapper, already solved (its `new` and its
//! gradient sync call the reference code of chapters 2 and 3, so you can
//! start here), and what this chapter adds around it: the sync switch,
//! [`SimpleDistributedDataParallelism::backward`], the guard, and the batch
//! arithmetic with its errors.

use std::cell::Cell;

use tch::nn::{self, Module};
use tch::Tensor;

use crate::ch02_replicas::verified_tensors;
use crate::dist::{DistError, Group};

pub use crate::ch02_replicas::InitError;

pub mod exercise; // the file you edit
pub mod solution; // the reference solution

#[cfg(not(feature = "solutions"))]
use exercise as active;
#[cfg(feature = "solutions")]
use solution as active;

pub use active::{accumulate_and_step, begin_no_sync};

/// A model replicated on every rank, which averages its gradients in
/// [`backward`](Self::backward) unless a [`no_sync`](Self::no_sync) scope
/// is open.
pub struct SimpleDistributedDataParallelism<M: Module> {
    module: M,
    /// Trainable tensors, in registration order (shallow handles: they share
    /// storage, and `.grad()`, with the model).
    parameters: Vec<(String, Tensor)>,
    /// Non-trainable tensors (buffers), sorted by name.
    buffers: Vec<(String, Tensor)>,
    process_group: Group,
    /// Whether `backward` averages the gradients over the ranks (PyTorch's
    /// `require_backward_grad_sync`). A `Cell`, so that a guard holding only
    /// `&self` can flip it while `forward` and `backward`, which also take
    /// `&self`, stay callable inside its scope.
    require_backward_grad_sync: Cell<bool>,
}

impl<M: Module> SimpleDistributedDataParallelism<M> {
    /// Wraps `module`, whose variables live in `vs`, after checking that every
    /// rank holds bitwise the same parameters and buffers (chapter 2). The
    /// sync switch starts on.
    pub fn new(module: M, vs: &nn::VarStore, pg: Group) -> Result<Self, InitError> {
        let (parameters, buffers) = verified_tensors(vs, pg.as_ref())?;
        Ok(SimpleDistributedDataParallelism {
            module,
            parameters,
            buffers,
            process_group: pg,
            require_backward_grad_sync: Cell::new(true),
        })
    }

    /// Runs the wrapped model: the forward pass needs no communication.
    pub fn forward(&self, xs: &Tensor) -> Tensor {
        self.module.forward(xs)
    }

    /// Averages every parameter's gradient over all ranks (chapter 3's
    /// reference `sync_gradients`), whatever the switch says.
    pub fn sync_gradients(&self) -> Result<(), DistError> {
        crate::ch03_averaging::solution::sync_gradients(self.process_group.as_ref(), &self.parameters)
    }

    // ANCHOR: backward
    /// Runs `loss.backward()`, which ADDS this loss's gradients to every
    /// parameter's `.grad`, then averages the gradients over all ranks if the
    /// sync switch is on. Inside a `no_sync` scope it only accumulates, on
    /// this rank, and sends nothing.
    pub fn backward(&self, loss: &Tensor) -> Result<(), DistError> {
        // f_backward: a loss that is not a scalar, or has no gradient, becomes
        // an error that names this rank instead of a panic inside libtorch.
        loss.f_backward().map_err(|source| DistError::Torch {
            rank: self.process_group.rank(),
            op: "loss.backward()".to_string(),
            source,
        })?;
        if self.require_backward_grad_sync.get() {
            self.sync_gradients()?;
        }
        Ok(())
    }
    // ANCHOR_END: backward

    // ANCHOR: no_sync
    /// Opens a scope in which [`backward`](Self::backward) does not
    /// communicate; it closes when the returned guard is dropped, and the
    /// switch gets back the state it had before (also on `?` and on panic).
    /// Write `let _guard = ddp.no_sync();` (a named binding: `let _ = ...`
    /// would drop the guard, and close the scope, at once).
    pub fn no_sync(&self) -> NoSyncGuard<'_> {
        let previous = begin_no_sync(&self.require_backward_grad_sync);
        NoSyncGuard { switch: &self.require_backward_grad_sync, previous }
    }

    /// The closure form of [`no_sync`](Self::no_sync): runs `body` with
    /// the switch off and returns what it returns.
    pub fn no_sync_scope<R>(&self, body: impl FnOnce() -> R) -> R {
        let _guard = self.no_sync();
        body()
    } // _guard dropped here, after body, whether body returned or panicked
      // ANCHOR_END: no_sync

    /// Whether the next `backward` will average the gradients.
    pub fn require_backward_grad_sync(&self) -> bool {
        self.require_backward_grad_sync.get()
    }

    /// Sets the switch by hand (the "explicit flag" style). Prefer
    /// [`no_sync`](Self::no_sync), which cannot forget to turn it back on.
    pub fn set_require_backward_grad_sync(&self, on: bool) {
        self.require_backward_grad_sync.set(on);
    }

    /// The wrapped model (for example to save it on rank 0).
    pub fn module(&self) -> &M {
        &self.module
    }

    pub fn process_group(&self) -> &Group {
        &self.process_group
    }

    /// The trainable tensors, in registration order.
    pub fn parameters(&self) -> &[(String, Tensor)] {
        &self.parameters
    }

    /// The non-trainable tensors, sorted by name.
    pub fn buffers(&self) -> &[(String, Tensor)] {
        &self.buffers
    }
}

// ANCHOR: guard
/// An open `no_sync` scope. While it lives, `backward` only accumulates;
/// dropping it puts the switch back to the state it found.
#[must_use = "the no_sync scope ends when the guard is dropped: bind it with `let _guard = ddp.no_sync();`"]
pub struct NoSyncGuard<'a> {
    switch: &'a Cell<bool>,
    /// The switch's state when this guard turned it off.
    previous: bool,
}

impl Drop for NoSyncGuard<'_> {
    fn drop(&mut self) {
        // Runs on every way out of the scope: the end of the block, `return`
        // or `?`, and a panic unwinding through it. Only a `Cell::set` here:
        // a panic inside `drop` while a panic unwinds aborts the process.
        self.switch.set(self.previous);
    }
}
// ANCHOR_END: guard

impl<'a> NoSyncGuard<'a> {
    /// Turns `switch` off with the REFERENCE `begin_no_sync` and returns the
    /// guard that restores it: how later chapters' wrappers open a scope.
    pub(crate) fn open_with_reference(switch: &'a Cell<bool>) -> Self {
        let previous = solution::begin_no_sync(switch);
        NoSyncGuard { switch, previous }
    }
}

/// Why an accumulation step was refused. Each message says what to change.
#[derive(Debug, thiserror::Error)]
pub enum AccumulationError {
    #[error(
        "accumulation_steps is {accumulation_steps}, but one optimizer step needs at least one \
         micro-batch: use 1 for no accumulation, or k > 1 to accumulate k micro-batches"
    )]
    NoMicroBatches { accumulation_steps: i64 },

    #[error(
        "{what}: {rows} rows do not split into {parts} equal, non-empty micro-batches \
         ({rows} = {parts} x {} + {}). Accumulation steps must divide evenly across ranks: \
         global batch = micro-batch x accumulation steps x world size. Make the row count a \
         multiple of {parts} ({}), or change the accumulation steps", .rows / .parts, .rows % .parts,
        multiples_near(*.rows, *.parts)
    )]
    Uneven { what: String, rows: i64, parts: i64 },

    #[error(
        "the micro-batches must be non-empty and all have the same number of rows, inputs and targets alike; \
         got (input rows, target rows) = {sizes:?}. Dividing each micro-batch's mean loss by k \
         weighs the micro-batches equally, which gives the mean over all rows only when they \
         are the same size: cut them with `split_micro_batches`"
    )]
    UnequalMicroBatches { sizes: Vec<(i64, i64)> },

    #[error("{0}")]
    Dist(DistError),
}

// Not `#[from]`, which would also make it the `source` and print it twice.
impl From<DistError> for AccumulationError {
    fn from(error: DistError) -> Self {
        AccumulationError::Dist(error)
    }
}

/// "for example 10 or 20": the valid row counts nearest to `rows`.
fn multiples_near(rows: i64, parts: i64) -> String {
    let below = rows - rows.rem_euclid(parts);
    if below >= parts {
        format!("for example {below} or {}", below + parts)
    } else {
        format!("for example {parts}")
    }
}

/// Refuses `accumulation_steps < 1`, and `rows` that do not split into
/// `parts` equal, non-empty pieces.
fn check_split(
    what: impl FnOnce() -> String,
    rows: i64,
    parts: i64,
    accumulation_steps: i64,
) -> Result<(), AccumulationError> {
    if accumulation_steps < 1 {
        return Err(AccumulationError::NoMicroBatches { accumulation_steps });
    }
    if rows < parts || rows % parts != 0 {
        return Err(AccumulationError::Uneven { what: what(), rows, parts });
    }
    Ok(())
}

// ANCHOR: batch_arithmetic
/// The rows of one micro-batch: global batch = micro-batch x accumulation
/// steps x world size, so micro-batch = global / (steps x world size). Every
/// rank computes it from the same numbers, so every rank runs the same number
/// of micro-steps of the same size.
pub fn micro_batch_size(
    global_batch: i64,
    world_size: usize,
    accumulation_steps: i64,
) -> Result<i64, AccumulationError> {
    let parts = world_size as i64 * accumulation_steps;
    let what =
        || format!("a global batch over {world_size} rank(s) x {accumulation_steps} accumulation step(s)");
    check_split(what, global_batch, parts, accumulation_steps)?;
    Ok(global_batch / parts)
}

/// Cuts this rank's rows (`x` `[rows, ..]`, `y` `[rows, ..]`) into
/// `accumulation_steps` equal micro-batches, in order (views, no copies).
pub fn split_micro_batches(
    x: &Tensor,
    y: &Tensor,
    accumulation_steps: i64,
) -> Result<Vec<(Tensor, Tensor)>, AccumulationError> {
    let (rows, target_rows) =
        (x.size().first().copied().unwrap_or(0), y.size().first().copied().unwrap_or(0));
    if rows != target_rows {
        return Err(AccumulationError::UnequalMicroBatches { sizes: vec![(rows, target_rows)] });
    }
    let what = || format!("this rank's batch cut into {accumulation_steps} accumulation step(s)");
    check_split(what, rows, accumulation_steps, accumulation_steps)?;
    let micro = rows / accumulation_steps;
    Ok((0..accumulation_steps)
        .map(|j| (x.narrow(0, j * micro, micro), y.narrow(0, j * micro, micro))) // [micro, ..] each
        .collect())
}

/// Checks a list of micro-batches before a step uses them: at least one,
/// and all of the same size. Returns k, their number.
pub fn check_micro_batches(micro_batches: &[(Tensor, Tensor)]) -> Result<i64, AccumulationError> {
    let rows = |t: &Tensor| t.size().first().copied().unwrap_or(0);
    let sizes: Vec<(i64, i64)> = micro_batches.iter().map(|(x, y)| (rows(x), rows(y))).collect();
    let Some(&(first, _)) = sizes.first() else {
        return Err(AccumulationError::NoMicroBatches { accumulation_steps: 0 });
    };
    if first < 1 || sizes.iter().any(|&(x_rows, y_rows)| x_rows != first || y_rows != first) {
        return Err(AccumulationError::UnequalMicroBatches { sizes });
    }
    Ok(sizes.len() as i64)
}
// ANCHOR_END: batch_arithmetic
