//! Spoiler: this file holds the library's answer to chapter 12's
//! `bf16_compress_hook` (`src/ch12_bf16/exercise.rs`). Working through the
//! book? Write yours first; the book shows it on the chapter's solution page.
//!
//! The library's communication hooks (`comm_hook.rs` says what a hook is).
//! [`bf16_compress_hook`] (PyTorch's `bf16_compress_hook`) sends bfloat16:
//! half the bytes of float32, with bf16's 8 significant bits (chapter 12
//! derives the error and `tests/chapter_12.rs` bounds it). It divides by
//! the world size before the cast, in the bucket's own dtype: the workbook's
//! order, which rounds to bf16 only where the wire must.
//! [`bf16_compress_hook_pytorch_order`] is PyTorch's own order (its
//! `default_hooks.bf16_compress_hook` casts, divides the bf16 tensor, then
//! all-reduces): one rounding more wherever the world size is not a power
//! of two, and the same bits as PyTorch's hook (`tests/torch_oracle.rs`).

use tch::{Kind, Tensor};

use crate::dist::{torch_error, DistError, ProcessGroup, ReduceOp, Work};

// ANCHOR: bf16_compress_hook
/// Starts averaging one bucket over the ranks with an all-reduce that
/// carries bfloat16, half the bytes of float32. `buffer` is the bucket's
/// flat gradients in their own dtype (f32 or f64). When the returned
/// [`Work`] is waited on, `buffer` holds their mean over the ranks, in its
/// own dtype, bitwise the same on every rank, with no more roundings to
/// bf16's 8 significant bits than the all-reduce itself needs: each rank's
/// contribution is rounded once, and the sum's partial sums once each.
pub fn bf16_compress_hook(pg: &dyn ProcessGroup, buffer: &Tensor) -> Result<Work, DistError> {
    let op = "casting a bucket to bfloat16";
    // Divided in the bucket's own precision first: a division in bf16 (by
    // 3, say) would round once more; bf16 has float32's exponent range, so
    // dividing first costs nothing in range either.
    let compressed = tch::no_grad(|| buffer.f_div_scalar(pg.world_size() as f64)?.f_to_kind(Kind::BFloat16))
        .map_err(torch_error(pg, op))?;
    let sum = pg.all_reduce_async(&compressed, ReduceOp::Sum)?; // the sum happens in bf16
    let mut bucket = buffer.shallow_clone();
    let written_back = torch_error(pg, "writing the bf16 average back into its bucket");
    Ok(Work::new(move || {
        sum.wait()?;
        // Widening bf16 to f32 or f64 is exact: the bucket gets the sum as sent.
        tch::no_grad(|| bucket.f_copy_(&compressed)).map_err(written_back)
    }))
}
// ANCHOR_END: bf16_compress_hook

// ANCHOR: bf16_compress_hook_pytorch_order
/// [`bf16_compress_hook`] in PyTorch's order of operations, for bitwise
/// agreement with PyTorch's `bf16_compress_hook` (torch 2.11,
/// `ddp_comm_hooks/default_hooks.py`: `buffer.to(bfloat16).div_(world_size)`,
/// an all-reduce (SUM), then `buffer.copy_(result)`). The division happens
/// in bf16, so each contribution is rounded twice, at the cast and at the
/// division, unless the world size is a power of two (then the division is
/// exact, and both hooks give the same bits). Otherwise the same contract
/// as [`bf16_compress_hook`].
pub fn bf16_compress_hook_pytorch_order(pg: &dyn ProcessGroup, buffer: &Tensor) -> Result<Work, DistError> {
    let op = "casting a bucket to bfloat16 and dividing it there";
    let compressed = tch::no_grad(|| buffer.f_to_kind(Kind::BFloat16)?.f_div_scalar(pg.world_size() as f64))
        .map_err(torch_error(pg, op))?;
    let sum = pg.all_reduce_async(&compressed, ReduceOp::Sum)?;
    let mut bucket = buffer.shallow_clone();
    let written_back = torch_error(pg, "writing the bf16 average back into its bucket");
    Ok(Work::new(move || {
        sum.wait()?;
        tch::no_grad(|| bucket.f_copy_(&compressed)).map_err(written_back)
    }))
}
// ANCHOR_END: bf16_compress_hook_pytorch_order
