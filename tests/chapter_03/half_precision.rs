//! Chapter 03 tests, the mean in half precision. f16's largest value is
//! 65504: two gradients of 40000 and 48000 have a mean, 44000, that fits,
//! and a sum, 88000, that does not. Where the division goes (before the sum,
//! after it) or in which dtype the sum is taken decides whether the mean
//! comes out or `inf` does; that is the decision this test pins. Mixed
//! precision training keeps gradients in 16 bits exactly to halve what
//! travels, so this is no corner case.
//!
//! Compiled into `cargo test --test chapter_03` (see `tests/chapter_03.rs`).

use approx::relative_eq;
use ddp_workbook::ch03_averaging::learner;
use ddp_workbook::tch::{Device, Kind, Tensor};

use super::common::run;

/// Each rank's gradient, in every element: multiples of 32, which f16
/// holds exactly in this range (its spacing there is 32).
const GRADIENTS: [f64; 3] = [40000.0, 48000.0, 56000.0];
/// f16 keeps 11 significant bits: a relative error of 2^-11 per rounding,
/// a few roundings at most whichever way the mean is formed.
const HALF_RELATIVE: f64 = 2e-3;

#[test]
fn half_precision_gradients_whose_sum_overflows_still_average_to_their_mean() {
    for world_size in [2, 3] {
        let per_rank = run(world_size, |pg| {
            let param = Tensor::zeros([4], (Kind::Half, Device::Cpu)).set_requires_grad(true);
            (&param * GRADIENTS[pg.rank()]).sum(Kind::Half).backward(); // d/dparam = GRADIENTS[rank]
            let params = vec![("w".to_string(), param)];
            learner::sync_gradients(pg.as_ref(), &params)?;
            let grad = params[0].1.grad();
            anyhow::ensure!(grad.kind() == Kind::Half, "the gradient must stay f16, it is {:?}", grad.kind());
            Ok(Vec::<f64>::try_from(grad.to_kind(Kind::Double))?)
        });
        let ranks = &GRADIENTS[..world_size];
        let mean = ranks.iter().sum::<f64>() / world_size as f64; // computed in f64: no overflow
        for (rank, got) in per_rank.iter().enumerate() {
            for &value in got {
                assert!(
                    value.is_finite() && relative_eq!(value, mean, max_relative = HALF_RELATIVE),
                    "{world_size} ranks holding f16 gradients {ranks:?}: rank {rank}'s averaged gradient is \
                     {value}, the mean is {mean}. Their sum, {}, is beyond f16's largest value (65504) \
                     although the mean is not: decide where the division goes, or in which dtype the sum \
                     is taken, so that no intermediate value leaves the range the mean lives in",
                    ranks.iter().sum::<f64>()
                );
            }
        }
    }
}
