//! Chapter 12's arithmetic, computed in one process: what bf16 does to an
//! average, the bound it must stay within, the two orders of operations
//! that round only where the wire must (the workbook's hook), and PyTorch's
//! order, which divides in bf16. Part of `tests/chapter_12.rs`
//! (`cargo test --test chapter_12`); the ranks' results are checked
//! against these.

use ddp_workbook::tch::{Device, Kind, Tensor};
use ddp_workbook::with_seed;

/// bf16's unit roundoff: 8 significant bits, rounding to nearest, so one
/// rounding changes a value by at most 2^-8 of itself.
pub const BF16_UNIT_ROUNDOFF: f64 = 1.0 / 256.0;

/// The bound on one element's error, as a multiple of the mean of the
/// contributions' magnitudes, sum(|x_i|) / N. The all-reduce rounds each of
/// the N contributions to bf16 once (the cast) and each of its N - 1
/// partial sums once (an addition of two bf16 numbers, rounded to bf16):
/// at most N roundings along any element's way, each by at most u of a
/// value no larger than sum(|x_i|) / N times (1 + u)^k. Higham's
/// recursive-summation bound gives gamma_N = N u / (1 - N u). The rest, a
/// division in f32 and libtorch's bf16 addition going through f32 (a double
/// rounding), is a few f32 roundings: 2^-21.
pub fn bf16_bound(world: usize) -> f64 {
    let nu = world as f64 * BF16_UNIT_ROUNDOFF;
    nu / (1.0 - nu) + 2f64.powi(-21)
}

/// Rank `rank`'s bucket in the hook tests: `numel` values of `kind` whose
/// magnitudes spread over several powers of two, the same on every call.
pub fn rank_buffer(rank: usize, numel: i64, kind: Kind) -> Tensor {
    with_seed(1200 + rank as i64, || {
        let opts = (Kind::Double, Device::Cpu);
        (Tensor::randn([numel], opts) * Tensor::randn([numel], opts).exp()).to_kind(kind)
    })
}

/// Checks `result` against the exact mean of `contributions`, element by
/// element, within [`bf16_bound`]; the error names the worst element.
pub fn within_bound(result: &Tensor, contributions: &[Tensor]) -> Result<f64, String> {
    let world = contributions.len();
    let as_f64: Vec<Tensor> = contributions.iter().map(|c| c.to_kind(Kind::Double)).collect();
    let mean = as_f64.iter().fold(Tensor::zeros_like(&as_f64[0]), |s, c| s + c) / world as f64;
    let scale = as_f64.iter().fold(Tensor::zeros_like(&as_f64[0]), |s, c| s + c.abs()) / world as f64;
    let error = (result.to_kind(Kind::Double) - &mean).abs();
    // error / (bound * scale), with 0 / 0 (all contributions zero) as 0.
    let ratio = &error / (scale.clamp_min(f64::MIN_POSITIVE) * bf16_bound(world));
    let worst = ratio.argmax(None, false).int64_value(&[]);
    let worst_ratio = ratio.double_value(&[worst]);
    if worst_ratio.is_nan() || worst_ratio > 1.0 {
        // A result N times the mean is the sum: name the missing division.
        let sum_error = (result.to_kind(Kind::Double) - &mean * world as f64).abs();
        let sum_ratio = sum_error / (scale.clamp_min(f64::MIN_POSITIVE) * world as f64 * bf16_bound(world));
        let likely = if sum_ratio.max().double_value(&[]) <= 1.0 {
            format!(". It is the SUM of the {world} ranks' values: did your bf16_compress_hook divide by the world size?")
        } else {
            String::new()
        };
        return Err(format!(
            "element {worst} is {:e} where the mean over {world} ranks is {:e}: an error of {:.3} times \
             the bound, {:.2e} times the mean of the contributions' magnitudes ({world} roundings to bf16){likely}",
            result.to_kind(Kind::Double).double_value(&[worst]),
            mean.double_value(&[worst]),
            worst_ratio,
            bf16_bound(world),
        ));
    }
    Ok(worst_ratio)
}

/// The sum the in-process backend computes for bf16 tensors: libtorch's
/// bf16 additions in rank order, each partial sum rounded to bf16.
pub fn bf16_chain(contributions: &[Tensor]) -> Tensor {
    contributions[1..].iter().fold(contributions[0].copy(), |sum, c| sum + c)
}

/// The orders that round only where the wire must, computed in one
/// process, in the contributions' dtype: the division first in that dtype,
/// then the cast and the bf16 sum; or the cast, the bf16 sum, and the
/// division after widening back; each with the division written as a
/// division by N or as a multiplication by 1/N (which rounds in the
/// bucket's dtype, not in bf16, and so is as honest).
pub fn orders_without_extra_roundings(contributions: &[Tensor]) -> [Tensor; 4] {
    let (kind, n) = (contributions[0].kind(), contributions.len() as f64);
    let scaled_first = |scale: &dyn Fn(&Tensor) -> Tensor| {
        let sent: Vec<Tensor> = contributions.iter().map(|c| scale(c).to_kind(Kind::BFloat16)).collect();
        bf16_chain(&sent).to_kind(kind)
    };
    let summed = bf16_chain(&contributions.iter().map(|c| c.to_kind(Kind::BFloat16)).collect::<Vec<_>>());
    [
        scaled_first(&|c| c / n),
        scaled_first(&|c| c * (1.0 / n)),
        summed.to_kind(kind) / n,
        summed.to_kind(kind) * (1.0 / n),
    ]
}

/// PyTorch's order (`bf16_compress_hook` of torch 2.11): each contribution
/// cast to bf16 and divided by N there, the bf16 sum (here in rank order,
/// as the in-process backend adds), widened back to the contributions'
/// dtype. The division in bf16 rounds once more unless N is a power of two.
pub fn pytorch_order(contributions: &[Tensor]) -> Tensor {
    let (kind, n) = (contributions[0].kind(), contributions.len() as f64);
    let sent: Vec<Tensor> = contributions.iter().map(|c| c.to_kind(Kind::BFloat16) / n).collect();
    bf16_chain(&sent).to_kind(kind)
}
