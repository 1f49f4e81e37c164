//! Chapter 12's wrong hooks: plausible mistakes, each breaking one rule of
//! the hook's contract, so the controls in `tests/chapter_12.rs` can show
//! that every check fails on the mistake it is for, with the message meant
//! for it. Part of `tests/chapter_12.rs` (`cargo test --test chapter_12`).

use ddp_workbook::dist::{torch_error, DistError, ProcessGroup, ReduceOp, Work};
use ddp_workbook::tch::{Kind, Tensor};

/// Sums in bf16 and copies back after the wait, without dividing.
pub fn no_division(pg: &dyn ProcessGroup, buffer: &Tensor) -> Result<Work, DistError> {
    let sent = buffer.to_kind(Kind::BFloat16);
    let sum = pg.all_reduce_async(&sent, ReduceOp::Sum)?;
    Ok(copy_back_after(pg, sum, sent, buffer))
}

/// The end every hook here but the timing mistakes shares: a Work that
/// waits on the all-reduce's `sum`, then copies its tensor into the bucket.
fn copy_back_after(pg: &dyn ProcessGroup, sum: Work, sent: Tensor, buffer: &Tensor) -> Work {
    let (mut bucket, on_error) = (buffer.shallow_clone(), torch_error(pg, "copy"));
    Work::new(move || {
        sum.wait()?;
        bucket.f_copy_(&sent).map_err(on_error)
    })
}

/// This rank's share, divided and cast.
fn share(pg: &dyn ProcessGroup, buffer: &Tensor) -> Tensor {
    (buffer / pg.world_size() as f64).to_kind(Kind::BFloat16)
}

/// Waits, then writes the mean into a copy of the bucket instead of the
/// bucket.
pub fn writes_a_copy(pg: &dyn ProcessGroup, buffer: &Tensor) -> Result<Work, DistError> {
    let sent = share(pg, buffer);
    let sum = pg.all_reduce_async(&sent, ReduceOp::Sum)?;
    Ok(copy_back_after(pg, sum, sent, &buffer.copy()))
}

/// Copies back before the all-reduce has even started: this rank's own share.
pub fn copies_before_the_sum_starts(pg: &dyn ProcessGroup, buffer: &Tensor) -> Result<Work, DistError> {
    let sent = share(pg, buffer);
    buffer.shallow_clone().f_copy_(&sent).map_err(torch_error(pg, "copy"))?;
    pg.all_reduce_async(&sent, ReduceOp::Sum)
}

/// Copies back right after starting the all-reduce, and returns its Work.
pub fn copies_before_waiting(pg: &dyn ProcessGroup, buffer: &Tensor) -> Result<Work, DistError> {
    let sent = share(pg, buffer);
    let sum = pg.all_reduce_async(&sent, ReduceOp::Sum)?;
    buffer.shallow_clone().f_copy_(&sent).map_err(torch_error(pg, "copy"))?;
    Ok(sum)
}

/// Copies back inside its closure, but before waiting on the all-reduce.
pub fn copies_in_the_closure_before_waiting(
    pg: &dyn ProcessGroup,
    buffer: &Tensor,
) -> Result<Work, DistError> {
    let sent = share(pg, buffer);
    let sum = pg.all_reduce_async(&sent, ReduceOp::Sum)?;
    let (mut bucket, on_error) = (buffer.shallow_clone(), torch_error(pg, "copy"));
    Ok(Work::new(move || {
        bucket.f_copy_(&sent).map_err(on_error)?;
        sum.wait()
    }))
}

/// Copies back in its closure without ever waiting on the all-reduce.
pub fn never_waits(pg: &dyn ProcessGroup, buffer: &Tensor) -> Result<Work, DistError> {
    let sent = share(pg, buffer);
    drop(pg.all_reduce_async(&sent, ReduceOp::Sum)?);
    let (mut bucket, on_error) = (buffer.shallow_clone(), torch_error(pg, "copy"));
    Ok(Work::new(move || bucket.f_copy_(&sent).map_err(on_error)))
}

/// Divides the bucket itself by N before casting it, then waits and copies
/// back honestly: the bucket's values change before the wait.
pub fn divides_the_bucket_in_place(pg: &dyn ProcessGroup, buffer: &Tensor) -> Result<Work, DistError> {
    let _ =
        buffer.shallow_clone().f_div_scalar_(pg.world_size() as f64).map_err(torch_error(pg, "divide"))?;
    no_division(pg, buffer)
}

/// Averages with a blocking all-reduce and returns a Work with nothing left
/// to do: right values, but in the bucket before the wait (and backward
/// stalls on every bucket).
pub fn blocks(pg: &dyn ProcessGroup, buffer: &Tensor) -> Result<Work, DistError> {
    let mut sent = share(pg, buffer);
    pg.all_reduce(&mut sent, ReduceOp::Sum)?;
    buffer.shallow_clone().f_copy_(&sent).map_err(torch_error(pg, "copy"))?;
    Ok(Work::new(|| Ok(())))
}

/// Casts, starts the all-reduce, then divides the bf16 tensor while it is
/// in flight.
pub fn divides_in_flight(pg: &dyn ProcessGroup, buffer: &Tensor) -> Result<Work, DistError> {
    let mut sent = buffer.to_kind(Kind::BFloat16);
    let sum = pg.all_reduce_async(&sent, ReduceOp::Sum)?;
    let _ = sent.f_div_scalar_(pg.world_size() as f64).map_err(torch_error(pg, "divide"))?;
    Ok(copy_back_after(pg, sum, sent, buffer))
}

/// Sends the bucket as it is, in its own dtype.
pub fn sends_f32(pg: &dyn ProcessGroup, buffer: &Tensor) -> Result<Work, DistError> {
    let sent = buffer / pg.world_size() as f64;
    let sum = pg.all_reduce_async(&sent, ReduceOp::Sum)?;
    Ok(copy_back_after(pg, sum, sent, buffer))
}

/// Waits on the all-reduce before returning, then returns a Work that only
/// copies: right values, bucket untouched until the wait, but backward
/// stalls on every bucket.
pub fn waits_before_returning(pg: &dyn ProcessGroup, buffer: &Tensor) -> Result<Work, DistError> {
    let sent = share(pg, buffer);
    pg.all_reduce_async(&sent, ReduceOp::Sum)?.wait()?;
    Ok(copy_back_after(pg, Work::new(|| Ok(())), sent, buffer))
}
