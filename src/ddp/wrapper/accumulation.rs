//! Batch arithmetic for gradient accumulation: global batch = micro-batch x
//! accumulation steps x world size, and the errors that say what to change
//! when the numbers do not divide. Chapter 4 of the book explains it.

use tch::Tensor;

use crate::dist::DistError;

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
         are the same size: cut tensors with `split_micro_batches`, and a list of indices with \
         `chunks_exact(micro_batch)`, skipping what is left over (every rank gets the same \
         count from a DistributedSampler, so all skip alike)"
    )]
    UnequalMicroBatches { sizes: Vec<(i64, i64)> },

    #[error(
        "{what} must be a positive number that fits the arithmetic, got {value}: pass at least 1 \
         (and a global batch = micro-batch x accumulation steps x world size below 2^63)"
    )]
    OutOfRange { what: &'static str, value: String },

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
    // Zero ranks, or a product past i64, would divide by zero or wrap
    // around: refuse them with words instead.
    if world_size == 0 {
        return Err(AccumulationError::OutOfRange { what: "the world size", value: "0".into() });
    }
    if global_batch < 1 {
        return Err(AccumulationError::OutOfRange {
            what: "the global batch",
            value: global_batch.to_string(),
        });
    }
    let parts = i64::try_from(world_size)
        .ok()
        .and_then(|n| n.checked_mul(accumulation_steps.max(1)))
        .ok_or_else(|| AccumulationError::OutOfRange {
            what: "world size x accumulation steps",
            value: format!("{world_size} x {accumulation_steps}"),
        })?;
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
    check_micro_batch_sizes(micro_batches.iter().map(|(x, y)| (rows(x), rows(y))).collect())
}

/// The one rule for a step's micro-batches, whether cut from tensors (the
/// check above) or lists of indices (`train_step`): at least one, and all
/// of the same non-zero size, inputs and targets alike. Dividing each
/// micro-batch's mean loss by k gives the mean over all rows only then.
/// Returns k. `sizes`: (input rows, target rows) of each micro-batch.
pub(super) fn check_micro_batch_sizes(sizes: Vec<(i64, i64)>) -> Result<i64, AccumulationError> {
    let Some(&(first, _)) = sizes.first() else {
        return Err(AccumulationError::NoMicroBatches { accumulation_steps: 0 });
    };
    if first < 1 || sizes.iter().any(|&(x_rows, y_rows)| x_rows != first || y_rows != first) {
        return Err(AccumulationError::UnequalMicroBatches { sizes });
    }
    Ok(sizes.len() as i64)
}
// ANCHOR_END: batch_arithmetic
