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
    /// slice of a flat group gets the same bits as the whole group.
    pub fn apply(&self, p: &mut Tensor, g: &Tensor, m: &mut Tensor, v: &mut Tensor) -> Result<(), TchError> {
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
