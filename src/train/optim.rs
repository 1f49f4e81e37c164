//! AdamW written out by hand, so that its state can be saved and restored:
//! tch's `nn::Optimizer` keeps its moments inside libtorch, out of reach, and
//! a resumed run without them would restart Adam from zero moments and take
//! different steps. Checked against tch's own Adam and AdamW by
//! `cargo test --test train`.
//!
//! The update is PyTorch's `torch.optim.AdamW` (Loshchilov and Hutter,
//! "Decoupled Weight Decay Regularization", 2019), written with the same
//! operations in the same order as libtorch's C++ Adam; the two agree to
//! about 1e-14 in f64 (libtorch computes `a + alpha * b` in one kernel, we
//! in two, and the roundings can differ). With `weight_decay = 0` it is
//! plain Adam.

use tch::{TchError, Tensor};

// ANCHOR: adamw
/// AdamW over a fixed list of named parameters. Its whole state is
/// [`step`](Self::step) and two tensors per parameter, the running means of
/// the gradient and of its square, available by name through
/// [`state`](Self::state) and [`load_state`](Self::load_state).
pub struct AdamW {
    /// The learning rate of the next step; the training loop sets it before
    /// each step (warm-up, decay).
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    /// Decoupled weight decay: each step multiplies every weight by
    /// `1 - lr * weight_decay` before the Adam update.
    pub weight_decay: f64,
    /// Shallow handles on the parameters (they share storage and `.grad()`).
    params: Vec<(String, Tensor)>,
    /// First moments, the running mean of the gradient; one per parameter.
    exp_avg: Vec<Tensor>,
    /// Second moments, the running mean of the squared gradient.
    exp_avg_sq: Vec<Tensor>,
    /// Steps taken so far; the bias correction depends on it.
    step: i64,
}

impl AdamW {
    /// PyTorch's defaults for the betas and eps: 0.9, 0.999, 1e-8. Moments
    /// start at zero, shaped like their parameters.
    pub fn new(params: &[(String, Tensor)], lr: f64, weight_decay: f64) -> AdamW {
        let zeros = || params.iter().map(|(_, p)| p.zeros_like().detach()).collect::<Vec<_>>();
        let params = params.iter().map(|(name, p)| (name.clone(), p.shallow_clone())).collect();
        AdamW {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay,
            params,
            exp_avg: zeros(),
            exp_avg_sq: zeros(),
            step: 0,
        }
    }

    /// Forgets every gradient: the next `backward` starts from nothing.
    pub fn zero_grad(&mut self) {
        for (_, param) in &mut self.params {
            param.zero_grad();
        }
    }

    /// One update of every parameter that has a gradient.
    pub fn step(&mut self) -> Result<(), TchError> {
        self.step += 1;
        let t = self.step as f64;
        // Bias correction: the moments start at zero, so early on they are
        // too small by these factors (powf, as C++'s std::pow, not powi).
        let bias_correction1 = 1.0 - self.beta1.powf(t);
        let bias_correction2 = 1.0 - self.beta2.powf(t);
        let step_size = self.lr / bias_correction1;
        tch::no_grad(|| {
            for (((_, param), m), v) in
                self.params.iter_mut().zip(&mut self.exp_avg).zip(&mut self.exp_avg_sq)
            {
                let grad = param.grad();
                if !grad.defined() {
                    continue; // not in this step's loss: no update, as in PyTorch
                }
                // In-place ops (trailing `_`) also return a handle on the
                // tensor they changed; `let _` drops it.
                if self.weight_decay != 0.0 {
                    let _ = param.f_mul_scalar_(1.0 - self.lr * self.weight_decay)?;
                    // decoupled decay
                }
                let _ = m.f_mul_scalar_(self.beta1)?.f_add_(&(&grad * (1.0 - self.beta1)))?; // m = b1 m + (1 - b1) g
                let _ = v.f_mul_scalar_(self.beta2)?.f_addcmul_(&(&grad * (1.0 - self.beta2)), &grad)?; // v = b2 v + (1 - b2) g²
                let denom = (v.f_sqrt()? / bias_correction2.sqrt()).f_add_scalar_(self.eps)?;
                let _ = param.f_addcdiv_(&(&*m * -step_size), &denom)?; // p -= step_size * m / denom
            }
            Ok(())
        })
    }
}
// ANCHOR_END: adamw

impl AdamW {
    /// How many steps this optimizer has taken.
    pub fn steps_taken(&self) -> i64 {
        self.step
    }

    /// The state to checkpoint: `exp_avg.<name>` and `exp_avg_sq.<name>` for
    /// every parameter (detached copies), and the step count as `step`.
    pub fn state(&self) -> Vec<(String, Tensor)> {
        let mut state = vec![("step".to_string(), Tensor::from_slice(&[self.step]))];
        for (((name, _), m), v) in self.params.iter().zip(&self.exp_avg).zip(&self.exp_avg_sq) {
            state.push((format!("exp_avg.{name}"), m.copy()));
            state.push((format!("exp_avg_sq.{name}"), v.copy()));
        }
        state
    }

    /// Restores what [`state`](Self::state) returned. Fails, naming the
    /// entry, if one is missing or has the wrong shape or dtype.
    pub fn load_state(&mut self, state: &[(String, Tensor)]) -> Result<(), String> {
        let find = |key: &str| {
            state.iter().find(|(n, _)| n == key).map(|(_, t)| t).ok_or(format!("no optimizer entry `{key}`"))
        };
        let step = find("step")?;
        let step = Vec::<i64>::try_from(step).ok().and_then(|s| s.first().copied()).filter(|&s| s >= 0);
        let step = step.ok_or("the optimizer entry `step` is not a step count")?;
        let moments = self.exp_avg.iter_mut().map(|m| ("exp_avg", m));
        let moments = moments.chain(self.exp_avg_sq.iter_mut().map(|v| ("exp_avg_sq", v)));
        let names = self.params.iter().map(|(n, _)| n).cycle();
        for ((prefix, moment), name) in moments.zip(names) {
            let key = format!("{prefix}.{name}");
            let saved = find(&key)?;
            if saved.size() != moment.size() || saved.kind() != moment.kind() {
                return Err(format!(
                    "optimizer entry `{key}` is {:?} {:?}, the model needs {:?} {:?}",
                    saved.kind(),
                    saved.size(),
                    moment.kind(),
                    moment.size()
                ));
            }
            moment.copy_(saved);
        }
        self.step = step;
        Ok(())
    }
}
