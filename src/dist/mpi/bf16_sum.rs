//! The MPI backend's sum of bfloat16 tensors.
//! MPI has neither a bfloat16 type nor a sum for it, so bf16 tensors travel
//! as 16-bit words (`ffi::datatype`), half the bytes of float32, and are
//! added by this user-defined operation, the way libtorch adds bf16 (and so
//! the in-process backend): both words widened to float32, added there, and
//! the sum rounded to the nearest bf16, ties to even. A bf16 all-reduce
//! then means the same on MPI as in process, which chapter 12's hook needs.
//! Widening the whole tensor to float32 before the call would be simpler,
//! and would send float32: the bytes the hook exists to save.

use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

use mpi::ffi as sys;

/// The operation's handle, created once (the backend initializes MPI with
/// `MPI_THREAD_MULTIPLE`, so any thread may create it).
struct Bf16Sum(sys::MPI_Op);

// SAFETY: an MPI_Op is a handle that MPI lets every thread use.
unsafe impl Send for Bf16Sum {}
unsafe impl Sync for Bf16Sum {}

/// The sum of bf16 words, as an MPI reduction.
pub(crate) fn bf16_sum() -> Result<sys::MPI_Op, String> {
    static OP: OnceLock<Result<Bf16Sum, String>> = OnceLock::new();
    let op = OP.get_or_init(|| {
        let mut op = std::mem::MaybeUninit::<sys::MPI_Op>::uninit();
        // Commutative, as MPI's own float sums are: every rank receives the
        // result of the same reduction tree.
        // SAFETY: MPI_Op_create writes the handle; it is read only on success.
        match unsafe { sys::MPI_Op_create(Some(add_bf16_words), 1, op.as_mut_ptr()) } {
            0 => Ok(Bf16Sum(unsafe { op.assume_init() })),
            code => Err(format!("MPI_Op_create for the bf16 sum failed with code {code}")),
        }
    });
    op.as_ref().map(|op| op.0).map_err(Clone::clone)
}

/// MPI's callback: `inout[i] = in[i] + inout[i]`, for `len` bf16 words.
unsafe extern "C" fn add_bf16_words(
    input: *mut c_void,
    inout: *mut c_void,
    len: *mut c_int,
    _datatype: *mut sys::MPI_Datatype,
) {
    // SAFETY: MPI hands two buffers of `*len` elements of the datatype the
    // call was made with, 16-bit words for bf16 (`ffi::datatype`).
    let n = usize::try_from(*len).unwrap_or(0);
    let (input, inout) = (
        std::slice::from_raw_parts(input as *const u16, n),
        std::slice::from_raw_parts_mut(inout as *mut u16, n),
    );
    for (a, b) in input.iter().zip(inout) {
        *b = bf16_of(f32_of(*a) + f32_of(*b));
    }
}

/// A bf16 word widened to float32: exact (bf16 is float32's top half).
pub(super) fn f32_of(word: u16) -> f32 {
    f32::from_bits(u32::from(word) << 16)
}

/// A float32 rounded to the nearest bf16, ties to even, as libtorch does
/// (`c10::detail::round_to_nearest_even`), NaN as libtorch's NaN.
pub(super) fn bf16_of(value: f32) -> u16 {
    if value.is_nan() {
        return 0x7fc0;
    }
    let bits = value.to_bits();
    let rounding_bias = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(rounding_bias) >> 16) as u16
}
