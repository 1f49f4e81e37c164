//! AdamW written out by hand, so that its state can be saved and restored:
//! tch's `nn::Optimizer` keeps its moments inside libtorch, out of reach, and
//! a resumed run without them would restart Adam from zero moments and take
//! different steps. Checked against tch's own Adam and AdamW by
//! `cargo test --test train`.
//!
//! The update is PyTorch's `torch.optim.AdamW` (Loshchilov and Hutter,
//! "Decoupled Weight Decay Regularization", 2019), with the operations of
//! its single-tensor path (`foreach=False`) in the same order: in f64 the
//! same bits as PyTorch's (`cargo test --test torch_oracle adamw`), and
//! about 1e-14 from libtorch's C++ Adam, which orders them otherwise. With
//! `weight_decay = 0` it is plain Adam. As in PyTorch, a parameter that got
//! no gradient in a step is not stepped, and each parameter counts its own
//! steps for the bias correction.

use crate::ddp::{param_steps, AdamWUpdate, Named};
use tch::{TchError, Tensor};

// ANCHOR: adamw
/// AdamW over a fixed list of named parameters. Its whole state is, per
/// parameter, its step count and two tensors, the running means of the
/// gradient and of its square, and the optimizer's own step count,
/// available by name through [`state`](Self::state) and
/// [`load_state`](Self::load_state).
///
/// For speed it keeps everything flat: [`new`](Self::new) lays the
/// parameters of each dtype out in one buffer (each parameter becomes a view
/// into it, its values unchanged), the moments are flat buffers too, and a
/// step gathers the gradients into one more and updates all of them with a
/// handful of libtorch calls instead of a dozen per tensor.
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
    params: Vec<Named>,
    /// The flat buffers, one group per dtype and device.
    groups: Vec<FlatGroup>,
    /// Steps taken so far.
    step: i64,
    /// Per parameter, the steps that updated it (PyTorch's `state["step"]`):
    /// its bias correction depends on it. Behind `step` for a parameter that
    /// got no gradient in some steps.
    param_steps: Vec<i64>,
    /// The parameters to leave out of the next step, by index: the ones the
    /// DDP wrapper said got no gradient ([`skip_unused`](crate::ddp::StepOptimizer::skip_unused)).
    skip_next: Vec<bool>,
}

/// The parameters of one dtype and device, and their state, each as one flat
/// buffer; `members` index `params`, in order, back to back in every buffer.
struct FlatGroup {
    members: Vec<usize>,
    param: Tensor,
    grad: Tensor,
    /// First moments, the running mean of the gradient.
    exp_avg: Tensor,
    /// Second moments, the running mean of the squared gradient.
    exp_avg_sq: Tensor,
    /// Per member, views shaped like it: its slot in `grad`, `exp_avg`, `exp_avg_sq`.
    grad_slots: Vec<Tensor>,
    exp_avg_slots: Vec<Tensor>,
    exp_avg_sq_slots: Vec<Tensor>,
}

impl AdamW {
    /// PyTorch's defaults for the betas and eps: 0.9, 0.999, 1e-8. Moments
    /// start at zero. Lays the parameters out flat (see above).
    pub fn new(params: &[Named], lr: f64, weight_decay: f64) -> AdamW {
        let mut params: Vec<Named> =
            params.iter().map(|(name, p)| (name.clone(), p.shallow_clone())).collect();
        let mut keys: Vec<(tch::Kind, tch::Device)> = Vec::new();
        for (_, p) in &params {
            if !keys.contains(&(p.kind(), p.device())) {
                keys.push((p.kind(), p.device()));
            }
        }
        let groups = keys
            .into_iter()
            .map(|key| {
                let members: Vec<usize> = (0..params.len())
                    .filter(|&i| (params[i].1.kind(), params[i].1.device()) == key)
                    .collect();
                FlatGroup::lay_out(&mut params, members)
            })
            .collect();
        let (param_steps, skip_next) = (vec![0; params.len()], vec![false; params.len()]);
        AdamW {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay,
            params,
            groups,
            step: 0,
            param_steps,
            skip_next,
        }
    }

    /// Forgets every gradient: the next `backward` starts from nothing.
    pub fn zero_grad(&mut self) {
        for (_, param) in &mut self.params {
            param.zero_grad();
        }
    }

    /// One update of every parameter that has a gradient, but those the
    /// DDP wrapper said got none in this step: as PyTorch's AdamW, which
    /// skips a parameter whose `.grad` is `None`.
    pub fn step(&mut self) -> Result<(), TchError> {
        self.step += 1;
        let skip = std::mem::replace(&mut self.skip_next, vec![false; self.params.len()]);
        let settings = self.update_at(0);
        tch::no_grad(|| {
            for group in &mut self.groups {
                let grads: Vec<Tensor> = group.members.iter().map(|&i| self.params[i].1.grad()).collect();
                let stepped: Vec<bool> =
                    group.members.iter().zip(&grads).map(|(&i, g)| g.defined() && !skip[i]).collect();
                let first_step = self.param_steps[group.members[0]];
                if stepped.iter().all(|&s| s)
                    && group.members.iter().all(|&i| self.param_steps[i] == first_step)
                {
                    // Every member is stepped, each at the same count: one flat update.
                    for (slot, grad) in group.grad_slots.iter_mut().zip(&grads) {
                        slot.f_copy_(grad)?; // gathered into this group's own flat buffer
                    }
                    group.members.iter().for_each(|&i| self.param_steps[i] += 1);
                    let adamw = AdamWUpdate { step: first_step + 1, ..settings };
                    adamw.apply(&mut group.param, &group.grad, &mut group.exp_avg, &mut group.exp_avg_sq)?;
                    continue;
                }
                // Some member got no gradient in this step (it gets no
                // update), or did in fewer steps than the others (its bias
                // correction differs): one by one.
                for (k, grad) in grads.iter().enumerate().filter(|&(k, _)| stepped[k]) {
                    let i = group.members[k];
                    self.param_steps[i] += 1;
                    let adamw = AdamWUpdate { step: self.param_steps[i], ..settings };
                    let mut param = self.params[i].1.shallow_clone();
                    adamw.apply(
                        &mut param,
                        grad,
                        &mut group.exp_avg_slots[k],
                        &mut group.exp_avg_sq_slots[k],
                    )?;
                }
            }
            Ok(())
        })
    }

    /// Leaves these parameters (by name) out of the next [`step`](Self::step).
    pub fn skip_in_next_step(&mut self, names: &[String]) {
        for (skip, (name, _)) in self.skip_next.iter_mut().zip(&self.params) {
            *skip = *skip || names.contains(name);
        }
    }
}
// ANCHOR_END: adamw

/// How `ddp::train_step` drives it.
impl crate::ddp::StepOptimizer for AdamW {
    fn zero_grad(&mut self) {
        AdamW::zero_grad(self);
    }

    fn step(&mut self) -> Result<(), TchError> {
        AdamW::step(self)
    }

    /// Plain AdamW steps gradients the wrapper has averaged: either list
    /// is the same on every rank then.
    fn skip_unused(&mut self, unused: &crate::ddp::UnusedParameters) {
        let (crate::ddp::UnusedParameters::OnEveryRank(names)
        | crate::ddp::UnusedParameters::OnThisRank(names)) = unused;
        self.skip_in_next_step(names);
    }
}

impl FlatGroup {
    /// One flat buffer for `members`' values, which become views into it,
    /// and one each for their gradients and moments.
    fn lay_out(params: &mut [Named], members: Vec<usize>) -> FlatGroup {
        let flats: Vec<Tensor> = members.iter().map(|&i| params[i].1.detach().reshape([-1])).collect();
        let param = Tensor::cat(&flats, 0); // [numel of all members], a copy of their values
        let zeros = || param.zeros_like();
        let (grad, exp_avg, exp_avg_sq) = (zeros(), zeros(), zeros());
        let mut offset = 0;
        let (mut grad_slots, mut exp_avg_slots, mut exp_avg_sq_slots) = (vec![], vec![], vec![]);
        for &i in &members {
            let (numel, shape) = (params[i].1.numel() as i64, params[i].1.size());
            let slot = |flat: &Tensor| flat.narrow(0, offset, numel).view(shape.as_slice());
            // The parameter's data is now its slot of the flat buffer (the
            // model, the wrapper and the VarStore share this tensor).
            params[i].1.set_data(&slot(&param));
            grad_slots.push(slot(&grad));
            exp_avg_slots.push(slot(&exp_avg));
            exp_avg_sq_slots.push(slot(&exp_avg_sq));
            offset += numel;
        }
        FlatGroup { members, param, grad, exp_avg, exp_avg_sq, grad_slots, exp_avg_slots, exp_avg_sq_slots }
    }
}

impl AdamW {
    /// This optimizer's settings as an [`AdamWUpdate`] for step `step`.
    pub fn update_at(&self, step: i64) -> AdamWUpdate {
        let (lr, beta1, beta2, eps, weight_decay) =
            (self.lr, self.beta1, self.beta2, self.eps, self.weight_decay);
        AdamWUpdate { lr, beta1, beta2, eps, weight_decay, step }
    }

    /// How many steps this optimizer has taken.
    pub fn steps_taken(&self) -> i64 {
        self.step
    }

    /// Parameter `i`'s moments: views into its group's flat buffers.
    fn moments_of(&self, i: usize) -> (Tensor, Tensor) {
        for group in &self.groups {
            if let Some(k) = group.members.iter().position(|&member| member == i) {
                return (group.exp_avg_slots[k].shallow_clone(), group.exp_avg_sq_slots[k].shallow_clone());
            }
        }
        unreachable!("every parameter belongs to one group")
    }

    /// The state to checkpoint: `exp_avg.<name>`, `exp_avg_sq.<name>` and
    /// `step.<name>` for every parameter (detached copies), and the
    /// optimizer's step count as `step`.
    pub fn state(&self) -> Vec<Named> {
        let mut state = vec![("step".to_string(), Tensor::from_slice(&[self.step]))];
        for (i, (name, _)) in self.params.iter().enumerate() {
            let (m, v) = self.moments_of(i);
            state.push((format!("exp_avg.{name}"), m.copy()));
            state.push((format!("exp_avg_sq.{name}"), v.copy()));
            state.push((format!("step.{name}"), Tensor::from_slice(&[self.param_steps[i]])));
        }
        state
    }

    /// Restores what [`state`](Self::state) returned. Fails, naming the
    /// entry, if one is missing or has the wrong shape or dtype.
    pub fn load_state(&mut self, state: &[Named]) -> Result<(), String> {
        let find = |key: &str| {
            state.iter().find(|(n, _)| n == key).map(|(_, t)| t).ok_or(format!("no optimizer entry `{key}`"))
        };
        let step = find("step")?;
        let step = Vec::<i64>::try_from(step).ok().and_then(|s| s.first().copied()).filter(|&s| s >= 0);
        let step = step.ok_or("the optimizer entry `step` is not a step count")?;
        for (i, prefix) in (0..self.params.len()).flat_map(|i| [(i, "exp_avg"), (i, "exp_avg_sq")]) {
            let (m, v) = self.moments_of(i);
            let mut moment = if prefix == "exp_avg" { m } else { v };
            let key = format!("{prefix}.{}", self.params[i].0);
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
        let names: Vec<String> = self.params.iter().map(|(name, _)| name.clone()).collect();
        self.param_steps = param_steps(state, &names, step)?;
        self.step = step;
        Ok(())
    }
}
