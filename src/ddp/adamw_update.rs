//! The arithmetic of one AdamW step, on tensors that hold their own moments:
//! what the training run's `AdamW` does to each flat group, and what the
//! ZeRO-1 optimizer (`zero.rs`) does to each rank's shard. It lives in the
//! library so that both can use it (the training run builds on the library,
//! never the other way round).

use tch::{TchError, Tensor};

use crate::models::Named;

// ANCHOR: update
/// The arithmetic of one AdamW step on tensors that hold their own moments:
/// what the training run's `AdamW::step` does to each flat group, for a
/// caller that keeps its state elsewhere (the ZeRO-1 optimizer, which steps
/// only its rank's shard). Get one from `AdamW::update_at` or fill it in;
/// `step` counts from 1 and sets the bias correction.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWUpdate {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    pub step: i64,
}

impl AdamWUpdate {
    /// Updates `p` in place from its gradient `g` and moments `m`, `v`
    /// (all the same shape), which it updates in place too. Elementwise: a
    /// slice of a flat group gets the same bits as the whole group. So a
    /// large tensor is updated a slice at a time: the update's temporaries
    /// (three of the tensor's size, whole) stay a few MiB however large the
    /// model, where PyTorch's fused AdamW needs none at all.
    pub fn apply(&self, p: &mut Tensor, g: &Tensor, m: &mut Tensor, v: &mut Tensor) -> Result<(), TchError> {
        let numel = p.numel() as i64;
        let all_flat = [&*p, g, &*m, &*v].iter().all(|t| t.is_contiguous() && t.numel() as i64 == numel);
        if numel <= SLICE_ELEMENTS || !all_flat {
            return self.apply_whole(p, g, m, v);
        }
        let flat = |t: &Tensor| t.f_view([-1]);
        let (p, g, m, v) = (flat(p)?, flat(g)?, flat(m)?, flat(v)?);
        for start in (0..numel).step_by(SLICE_ELEMENTS as usize) {
            let len = SLICE_ELEMENTS.min(numel - start);
            let slice = |t: &Tensor| t.f_narrow(0, start, len);
            self.apply_whole(&mut slice(&p)?, &slice(&g)?, &mut slice(&m)?, &mut slice(&v)?)?;
        }
        Ok(())
    }

    /// [`apply`](Self::apply) on the whole tensors at once.
    fn apply_whole(
        &self,
        p: &mut Tensor,
        g: &Tensor,
        m: &mut Tensor,
        v: &mut Tensor,
    ) -> Result<(), TchError> {
        // PyTorch's single-tensor AdamW (`_single_tensor_adam` in
        // torch/optim/adam.py, `foreach=False`), operation for operation, so
        // that the same inputs give the same bits. The scalars are computed
        // as Python computes them: `beta ** step` and `x ** 0.5` are C's
        // `pow` (Rust's `powf`), not `powi` or `sqrt`.
        let t = self.step as f64;
        // Bias correction: the moments start at zero, so early on they are
        // too small by these factors.
        let bias_correction1 = 1.0 - self.beta1.powf(t);
        let bias_correction2 = 1.0 - self.beta2.powf(t);
        let step_size = self.lr / bias_correction1;
        let bias_correction2_sqrt = bias_correction2.powf(0.5);
        let (b1, b2, eps) = (self.beta1, self.beta2, self.eps);
        tch::no_grad(|| {
            // In-place ops (trailing `_`) also return a handle on the tensor
            // they changed; `let _` drops it.
            if self.weight_decay != 0.0 {
                let _ = p.f_mul_scalar_(1.0 - self.lr * self.weight_decay)?; // decoupled decay, first
            }
            let _ = m.f_lerp_(g, 1.0 - b1)?; // m += (1 - b1) (g - m): not b1 m + (1 - b1) g, which rounds otherwise
                                             // v = b2 v + (1 - b2) g²: PyTorch's addcmul_(g, g, value=1 - b2)
                                             // computes ((1 - b2) g) g; tch's addcmul_ has no `value`, so the
                                             // first product is formed first, the same rounding.
            let _ = v.f_mul_scalar_(b2)?.f_addcmul_(&(g * (1.0 - b2)), g)?;
            let denom = (v.f_sqrt()? / bias_correction2_sqrt).f_add_scalar_(eps)?;
            // p += -step_size m / denom: addcdiv_(m, denom, value=-step_size)
            // computes (-step_size m) / denom, as here.
            let _ = p.f_addcdiv_(&(&*m * -step_size), &denom)?;
            Ok(())
        })
    }
}
// ANCHOR_END: update

/// The slice [`AdamWUpdate::apply`] updates at a time: 256 Ki elements (1
/// MiB of float32), so that a slice's operands and temporaries fit in a
/// core's cache, with about a hundred slices at 25M parameters.
const SLICE_ELEMENTS: i64 = 1 << 18;

/// Each parameter's step count in a saved optimizer `state`, `step.<name>`;
/// `step`, the optimizer's, for a parameter without one (a checkpoint from
/// before per-parameter counts, when every parameter stepped every step).
/// The training run's `AdamW` and the ZeRO-1 optimizer save the same names.
pub fn param_steps(state: &[Named], names: &[String], step: i64) -> Result<Vec<i64>, String> {
    names
        .iter()
        .map(|name| {
            let key = format!("step.{name}");
            let Some((_, saved)) = state.iter().find(|(n, _)| *n == key) else { return Ok(step) };
            let count = Vec::<i64>::try_from(saved).ok().and_then(|s| s.first().copied());
            count.filter(|&s| (0..=step).contains(&s)).ok_or(format!(
                "the optimizer entry `{key}` is not a step count between 0 and the optimizer's {step}"
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    /// Two and a half slices: the sliced update (with a short last slice)
    /// must give every element the bits of the whole-tensor update.
    #[test]
    fn a_large_tensor_updated_slice_by_slice_gets_the_bits_of_one_update() {
        let numel = SLICE_ELEMENTS * 5 / 2;
        let random =
            |seed: i64| crate::with_seed(seed, || Tensor::randn([numel], (Kind::Float, Device::Cpu)));
        let (p, g, m, v) = (random(1), random(2), random(3), random(4).abs());
        let update =
            AdamWUpdate { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.1, step: 3 };
        let state = || (p.copy(), m.copy(), v.copy());
        let ((mut p1, mut m1, mut v1), (mut p2, mut m2, mut v2)) = (state(), state());
        update.apply(&mut p1, &g, &mut m1, &mut v1).unwrap();
        update.apply_whole(&mut p2, &g, &mut m2, &mut v2).unwrap();
        assert!(p1.ne_tensor(&p).any().int64_value(&[]) == 1, "the update changed nothing");
        for (name, sliced, whole) in [("p", &p1, &p2), ("m", &m1, &m2), ("v", &v1, &v2)] {
            let differ = sliced.ne_tensor(whole).sum(Kind::Int64).int64_value(&[]);
            assert_eq!(differ, 0, "{name}: {differ} elements differ between the sliced and the whole update");
        }
    }
}
