//! Buckets that leave during backward (PyTorch's reducer): a gradient-ready
//! hook on every parameter marks it; when a bucket's last member is ready,
//! and every bucket before it has left, its asynchronous all-reduce starts
//! while backward goes on computing the earlier layers. After backward,
//! [`OverlappedBuckets::finish`] waits for them all and divides. Gradients
//! are views of their buckets (see `bucket_views.rs`): nothing is copied.
//!
//! Buckets leave in bucket order on every rank, whatever order the hooks
//! fire in, because collectives pair up by their order. Bucket 0 holds the
//! last parameters, whose gradients backward computes first.
//!
//! Tested by `cargo test --test overlap`.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use tch::Tensor;

use super::bucketed::GradientBuckets;
use crate::autograd::GradReadyHooks;
use crate::dist::{tagged, torch_error, DistError, Group, ReduceOp, Work};

/// One step's progress, shared by the hooks (on the backward thread) and
/// the caller.
struct Progress {
    pg: Group,
    buckets: GradientBuckets,
    params: Vec<(String, Tensor)>,
    /// For each parameter, its bucket.
    bucket_of: Vec<usize>,
    /// Members of each bucket whose gradient is not ready yet.
    waiting: Vec<usize>,
    ready: Vec<bool>,
    /// The next bucket to launch, and the launched ones' handles.
    next: usize,
    works: Vec<Work>,
    /// Off under `no_sync`: the hooks then only let gradients accumulate.
    armed: bool,
    /// Names this step's all-reduces (the backward thread may not be the
    /// caller's, so the caller's `tagged` scope does not reach it).
    tag: String,
    /// When each bucket left in the last synced step, and in which order
    /// the gradients became ready: what tests and benchmarks look at.
    launched_at: Vec<(usize, Instant)>,
    ready_order: Vec<usize>,
    /// The first error a hook met; reported by `finish`.
    error: Option<DistError>,
}

impl Progress {
    fn mark_ready(&mut self, index: usize) {
        if !self.armed || self.ready[index] || self.error.is_some() {
            return;
        }
        self.ready[index] = true;
        self.ready_order.push(index);
        self.waiting[self.bucket_of[index]] -= 1;
        while self.next < self.waiting.len() && self.waiting[self.next] == 0 {
            if let Err(error) = self.launch(self.next) {
                self.error = Some(error);
                return;
            }
        }
    }

    /// Places bucket `b`'s gradients in its buffer (zeros for a parameter
    /// without one) and starts its all-reduce.
    fn launch(&mut self, b: usize) -> Result<(), DistError> {
        let pg = self.pg.as_ref();
        let buffer = self.buckets.buffers[b].shallow_clone();
        let work = tch::no_grad(|| {
            self.buckets.attach(pg, b, &self.params)?;
            tagged(format!("{}, bucket {b}", self.tag), || pg.all_reduce_async(&buffer, ReduceOp::Sum))
        })?;
        self.works.push(work);
        self.launched_at.push((b, Instant::now()));
        self.next += 1;
        Ok(())
    }
}

/// Gradient buckets whose all-reduces overlap with backward.
pub struct OverlappedBuckets {
    progress: Arc<Mutex<Progress>>,
    _hooks: GradReadyHooks,
}

impl OverlappedBuckets {
    /// Hooks every parameter of `params` (planned into `buckets`).
    pub fn new(pg: Group, params: &[(String, Tensor)], buckets: GradientBuckets) -> Result<Self, DistError> {
        let mut bucket_of = vec![0; params.len()];
        for (b, bucket) in buckets.layout().iter().enumerate() {
            bucket.params.iter().for_each(|&p| bucket_of[p] = b);
        }
        let waiting = buckets.layout().iter().map(|b| b.params.len()).collect();
        let progress = Arc::new(Mutex::new(Progress {
            pg: pg.clone(),
            buckets,
            params: params.iter().map(|(n, p)| (n.clone(), p.shallow_clone())).collect(),
            bucket_of,
            waiting,
            ready: vec![false; params.len()],
            next: 0,
            works: vec![],
            armed: false,
            tag: String::new(),
            launched_at: vec![],
            ready_order: vec![],
            error: None,
        }));
        let shared = progress.clone();
        let tensors: Vec<Tensor> = params.iter().map(|(_, p)| p.shallow_clone()).collect();
        let hooks = GradReadyHooks::register(&tensors, move |i| {
            shared.lock().unwrap_or_else(|p| p.into_inner()).mark_ready(i);
        })
        .map_err(|e| DistError::Invalid {
            rank: pg.rank(),
            op: "hooking the parameters".into(),
            detail: e.to_string(),
        })?;
        Ok(OverlappedBuckets { progress, _hooks: hooks })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Before a backward pass whose gradients are to be synced: its hooks
    /// will launch buckets, their all-reduces named by `tag`.
    pub fn arm(&self, tag: String) {
        let mut p = self.lock();
        p.armed = true;
        p.tag = tag;
        p.launched_at.clear();
        p.ready_order.clear();
    }

    /// After the armed backward pass: launches what has not left (buckets
    /// with a parameter that got no gradient, its slot zero), waits for
    /// every all-reduce, divides by the world size, and checks that every
    /// rank computed the same parameters' gradients. Names the parameters
    /// that got none unless `find_unused_parameters`.
    pub fn finish(&self, find_unused_parameters: bool) -> Result<(), DistError> {
        let mut p = self.lock();
        p.armed = false;
        let mut result = p.error.take().map_or(Ok(()), Err);
        while result.is_ok() && p.next < p.waiting.len() {
            let next = p.next;
            result = p.launch(next);
        }
        let works: Vec<Work> = p.works.drain(..).collect();
        for work in works {
            let waited = work.wait(); // wait for every one, even after an error
            result = result.and(waited);
        }
        let unused: Vec<usize> = (0..p.ready.len()).filter(|&i| !p.ready[i]).collect();
        p.ready.iter_mut().for_each(|r| *r = false);
        let counts: Vec<usize> = p.buckets.layout().iter().map(|b| b.params.len()).collect();
        p.waiting = counts;
        p.next = 0;
        result?;
        let pg = p.pg.clone();
        let world = pg.world_size() as f64;
        for buffer in &p.buckets.buffers {
            let _ = tch::no_grad(|| buffer.shallow_clone().f_div_scalar_(world))
                .map_err(torch_error(pg.as_ref(), "dividing a bucket"))?;
        }
        unused_check(pg.as_ref(), &p.buckets, &p.params, &unused, find_unused_parameters, &p.tag)
    }

    /// The buckets in the order they left during the last synced backward,
    /// with when; and the parameters in the order their gradients were ready.
    pub fn last_step(&self) -> (Vec<(usize, Instant)>, Vec<usize>) {
        let p = self.lock();
        (p.launched_at.clone(), p.ready_order.clone())
    }
}

/// Every rank learns which parameters got no gradient on some rank, and
/// which got one on some rank (one small all-reduce of two masks). Unless
/// unused parameters were expected, every rank fails with the same error,
/// naming them. When they were, a parameter that this rank did not use but
/// another did gets the averaged gradient here too, so that every replica
/// takes the same step.
fn unused_check(
    pg: &dyn crate::dist::ProcessGroup,
    buckets: &GradientBuckets,
    params: &[(String, Tensor)],
    unused: &[usize],
    find_unused_parameters: bool,
    tag: &str,
) -> Result<(), DistError> {
    let n = params.len() as i64;
    let mut mask = Tensor::zeros([2, n], (tch::Kind::Int, tch::Device::Cpu)); // [unused here, used here]
    let _ = mask.get(1).fill_(1);
    for &i in unused {
        let _ = mask.get(0).get(i as i64).fill_(1);
        let _ = mask.get(1).get(i as i64).fill_(0);
    }
    tagged(format!("{tag}, unused parameters"), || pg.all_reduce(&mut mask, ReduceOp::Max))?;
    let unused_somewhere: Vec<usize> =
        (0..params.len()).filter(|&i| mask.int64_value(&[0, i as i64]) != 0).collect();
    if unused_somewhere.is_empty() {
        return Ok(());
    }
    if !find_unused_parameters {
        let names: Vec<&str> = unused_somewhere.iter().map(|&i| params[i].0.as_str()).collect();
        let detail = format!(
            "parameter(s) {names:?} got no gradient in this backward pass on at least one rank. Their \
             buckets were sent with zeros in their place, so every rank still agrees; but a model \
             that skips parameters must say so: pass `find_unused_parameters: true` (PyTorch's \
             find_unused_parameters=True), or use every parameter in the loss"
        );
        return Err(DistError::Invalid {
            rank: pg.rank(),
            op: "the gradient sync at the end of backward".into(),
            detail,
        });
    }
    for &i in unused {
        if mask.int64_value(&[1, i as i64]) != 0 {
            let (name, param) = &params[i];
            let averaged = buckets.slot(i, params).view(param.size().as_slice()).copy();
            crate::autograd::set_grad(param, &averaged).map_err(|e| DistError::Invalid {
                rank: pg.rank(),
                op: format!("giving `{name}` the gradient other ranks computed"),
                detail: e.to_string(),
            })?;
        }
    }
    Ok(())
}
