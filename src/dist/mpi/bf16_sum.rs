//! The MPI backend's arithmetic on bfloat16 words.
//! MPI has neither a bfloat16 type nor a sum for it, so bf16 tensors travel
//! as 16-bit words (`ffi::datatype`), half the bytes of float32, and the
//! backend adds them itself, in rank order (`ordered.rs`, `shm/fold.rs`),
//! the way libtorch adds bf16 (and so the in-process backend): both words
//! widened to float32, added there, and the sum rounded to the nearest
//! bf16, ties to even. A bf16 all-reduce then means the same on MPI as in
//! process, which chapter 12's hook needs. Widening the whole tensor to
//! float32 before the call would be simpler, and would send float32: the
//! bytes the hook exists to save.

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
