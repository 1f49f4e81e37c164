//! The arithmetic of one AdamW step, on tensors that hold their own moments:
//! what the training run's `AdamW` does to each flat group, and what the
//! ZeRO-1 optimizer (`zero.rs`) does to each rank's shard. It lives in the
//! library so that both can use it (the training run builds on the library,
//! never the other way round).

use tch::{TchError, Tensor};

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
        let t = self.step as f64;
        // Bias correction: the moments start at zero, so early on they are
        // too small by these factors (powf, as C++'s std::pow, not powi).
        let bias_correction1 = 1.0 - self.beta1.powf(t);
        let bias_correction2 = 1.0 - self.beta2.powf(t);
        let step_size = self.lr / bias_correction1;
        let decay = 1.0 - self.lr * self.weight_decay;
        let (b1, b2, eps) = (self.beta1, self.beta2, self.eps);
        tch::no_grad(|| {
            // In-place ops (trailing `_`) also return a handle on the tensor
            // they changed; `let _` drops it.
            if decay != 1.0 {
                let _ = p.f_mul_scalar_(decay)?; // decoupled decay
            }
            let _ = m.f_mul_scalar_(b1)?.f_add_(&(g * (1.0 - b1)))?; // m = b1 m + (1 - b1) g
            let _ = v.f_mul_scalar_(b2)?.f_addcmul_(&(g * (1.0 - b2)), g)?; // v = b2 v + (1 - b2) g²
            let denom = (v.f_sqrt()? / bias_correction2.sqrt()).f_add_scalar_(eps)?;
            let _ = p.f_addcdiv_(&(&*m * -step_size), &denom)?; // p -= step_size * m / denom
            Ok(())
        })
    }
}
// ANCHOR_END: update
