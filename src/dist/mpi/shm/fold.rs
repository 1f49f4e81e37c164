//! The reduction of one slice over a node's ranks
//! (or a group's, `../ordered.rs`), in rank order: a plain loop for the
//! sums DDP makes (float32, float64, bfloat16), libtorch for the rest. libtorch would compute the same bits, but on a large slice
//! it wakes its OpenMP threads, which on a busy machine fight the other
//! ranks' processes for the cores (4 MiB took 44 ms instead of 0.7 here).
//! Other dtypes and operations go through libtorch in pieces too small for
//! it to split (`slices.rs`). Try it: `cargo test --features mpi --test mpi
//! shared_memory`.

use std::ops::Add;

use tch::{Device, Kind, Tensor};

use super::super::bf16_sum::{bf16_of, f32_of};
use crate::dist::ReduceOp;

/// Elements per block: the accumulator's block stays in L1 while every
/// rank's part is added to it.
const BLOCK: usize = 2048;

/// A 16-bit word holding a bfloat16, added as libtorch adds bf16: both
/// widened to float32, added, rounded to the nearest, ties to even.
#[derive(Clone, Copy)]
#[repr(transparent)]
struct Bf16(u16);

impl Add for Bf16 {
    type Output = Bf16;
    fn add(self, other: Bf16) -> Bf16 {
        Bf16(bf16_of(f32_of(self.0) + f32_of(other.0)))
    }
}

/// For `len` elements, `((first[e] + parts[1][e]) + parts[2][e]) + ...`,
/// where `first` is `start` when given (the previous nodes' partial sum)
/// and `parts[0]` otherwise (then `parts[1..]` follow), written to every
/// pointer of `outs`. Each block is summed in a buffer of its own, then
/// written out, so an output may be one of the inputs: the zero-copy path
/// writes each rank's slice back into the buffers it read it from.
///
/// # Safety
/// Every pointer is valid for `len` elements of `T`; no other thread of
/// this process writes them during the call.
unsafe fn sum_in_order<T: Copy + Add<Output = T>>(
    start: Option<*const T>,
    parts: &[*const T],
    len: usize,
    outs: &[*mut T],
) {
    let mut acc: Vec<T> = Vec::with_capacity(BLOCK.min(len));
    let mut at = 0;
    while at < len {
        let n = BLOCK.min(len - at);
        let mut rest = parts.iter().copied();
        let first = start.unwrap_or_else(|| rest.next().expect("a node has a rank"));
        acc.clear();
        acc.extend_from_slice(std::slice::from_raw_parts(first.add(at), n));
        for part in rest {
            for (x, y) in acc.iter_mut().zip(std::slice::from_raw_parts(part.add(at), n)) {
                *x = *x + *y;
            }
        }
        for &out in outs {
            std::ptr::copy_nonoverlapping(acc.as_ptr(), out.add(at), n);
        }
        at += n;
    }
}

/// `len` elements of `kind`: `start` (when given) then every part folded in,
/// in order, with `op`, the result written to every pointer of `outs`.
///
/// # Safety
/// Every pointer is valid for `len` elements of `kind`; no other thread of
/// this process writes them during the call.
pub(crate) unsafe fn fold_in_order(
    kind: Kind,
    op: ReduceOp,
    start: Option<*mut u8>,
    parts: &[*mut u8],
    len: usize,
    outs: &[*mut u8],
) -> Result<(), tch::TchError> {
    if len == 0 {
        return Ok(());
    }
    let sum = matches!(op, ReduceOp::Sum | ReduceOp::Avg);
    let folded = match kind {
        Kind::Float if sum => sum_as::<f32>(start, parts, len, outs),
        Kind::Double if sum => sum_as::<f64>(start, parts, len, outs),
        Kind::BFloat16 if sum => sum_as::<Bf16>(start, parts, len, outs),
        _ => false,
    };
    if folded {
        return Ok(());
    }
    // Elsewhere libtorch, in pieces below its grain size (32768), so
    // that it never wakes its thread pool; each piece folded in a
    // tensor of its own, then written out (an output may be an input).
    let elt = kind.elt_size_in_bytes();
    let view = |base: *mut u8, offset: usize, n: usize| {
        // SAFETY: the caller's promise: `len` elements at every pointer.
        unsafe { Tensor::from_blob(base.wrapping_add(offset * elt), &[n as i64], &[1], kind, Device::Cpu) }
    };
    let acc = Tensor::f_empty([PIECE.min(len) as i64], (kind, Device::Cpu))?;
    let mut at = 0;
    while at < len {
        let n = PIECE.min(len - at);
        let acc = acc.narrow(0, 0, n as i64);
        tch::no_grad(|| -> Result<(), tch::TchError> {
            let mut rest = parts.iter().map(|&p| view(p, at, n));
            let first = match start {
                Some(start) => view(start, at, n),
                None => rest.next().expect("a node has a rank"),
            };
            acc.shallow_clone().f_copy_(&first)?;
            for part in rest {
                op.combine(&acc, &part, &acc)?;
            }
            for &out in outs {
                view(out, at, n).f_copy_(&acc)?;
            }
            Ok(())
        })?;
        at += n;
    }
    Ok(())
}

/// Pieces of the libtorch path, in elements.
const PIECE: usize = 16384;

/// [`sum_in_order`] on elements of `T`; true (it did the work).
///
/// # Safety
/// As [`sum_in_order`]'s.
unsafe fn sum_as<T: Copy + Add<Output = T>>(
    start: Option<*mut u8>,
    parts: &[*mut u8],
    len: usize,
    outs: &[*mut u8],
) -> bool {
    let parts: Vec<*const T> = parts.iter().map(|&p| p.cast_const().cast()).collect();
    let outs: Vec<*mut T> = outs.iter().map(|&p| p.cast()).collect();
    sum_in_order(start.map(|p| p.cast_const().cast()), &parts, len, &outs);
    true
}
