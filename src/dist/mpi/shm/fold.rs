//! src/dist/mpi/shm/fold.rs: the sum of one slice over a node's ranks, in
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

/// `acc[e] = ((parts[0][e] + parts[1][e]) + parts[2][e]) + ...` when
/// `fresh`, else `acc[e] = ((acc[e] + parts[0][e]) + ...)`, for `len`
/// elements; then, with `own`, the result copied there too.
///
/// # Safety
/// Every pointer is valid for `len` elements of `T`; `acc` overlaps none of
/// `parts` nor `own`; `own` may be one of `parts` (read before written).
pub(super) unsafe fn sum_in_order<T: Copy + Add<Output = T>>(
    acc: *mut T,
    parts: &[*const T],
    len: usize,
    fresh: bool,
    own: Option<*mut T>,
) {
    let mut start = 0;
    while start < len {
        let n = BLOCK.min(len - start);
        {
            let out = std::slice::from_raw_parts_mut(acc.add(start), n);
            let mut rest = parts.iter().map(|p| std::slice::from_raw_parts(p.add(start), n));
            if fresh {
                let first = rest.next().expect("a node has a rank");
                out.copy_from_slice(first);
            }
            for part in rest {
                for (x, y) in out.iter_mut().zip(part) {
                    *x = *x + *y;
                }
            }
        }
        if let Some(own) = own {
            std::ptr::copy_nonoverlapping(acc.add(start), own.add(start), n);
        }
        start += n;
    }
}
