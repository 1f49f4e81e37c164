//! The sum of one slice over a node's ranks, in
//! rank order, as a plain loop, for the sums DDP makes (float32, float64,
//! bfloat16). libtorch would compute the same bits, but on a large slice
//! it wakes its OpenMP threads, which on a busy machine fight the other
//! ranks' processes for the cores (4 MiB took 44 ms instead of 0.7 here).
//! Other dtypes and operations go through libtorch in pieces too small for
//! it to split (`slices.rs`). Try it: `cargo test --features mpi --test mpi
//! shared_memory`.

use std::ops::Add;

use super::super::bf16_sum::{bf16_of, f32_of};

/// Elements per block: the accumulator's block stays in L1 while every
/// rank's part is added to it.
const BLOCK: usize = 2048;

/// A 16-bit word holding a bfloat16, added as libtorch adds bf16: both
/// widened to float32, added, rounded to the nearest, ties to even.
#[derive(Clone, Copy)]
#[repr(transparent)]
pub(super) struct Bf16(u16);

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
pub(super) unsafe fn sum_in_order<T: Copy + Add<Output = T>>(
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
