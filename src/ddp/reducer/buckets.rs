//! Spoiler: this file holds the library's answers to chapter 5's
//! `sync_bucket` and chapter 6's `launch_bucket` and `finish_bucket`
//! (`src/ch05_bucketing/exercise.rs`, `src/ch06_overlap/exercise.rs`), with
//! the gradients kept in the buckets. Working through the book? Write yours
//! first; the book shows the parts of this file you need, and the answer at
//! the end of the chapter.
//!
//! The one home of a model's gradient buckets: [`GradientBuckets`] holds the
//! layout, one flat buffer per bucket, and where each parameter's slot lies
//! in it, computed once when the layout is planned. Everything that puts a
//! gradient into a bucket, moves the buckets' bytes or reads a slot goes
//! through it, and its fields are private: the wrappers, the overlapped
//! sync (`overlap.rs`) uses its methods.
//!
//! The finished wrapper keeps gradients in the buckets (PyTorch's
//! `gradient_as_bucket_view`): the first time a parameter has a gradient,
//! [`install`](GradientBuckets::install) copies it into its slot and makes
//! the slot its gradient. From then on backward adds straight into the
//! bucket (autograd accumulates into an existing gradient in place),
//! `zero_grad` zeroes it there, and the all-reduce leaves the average where
//! the optimizer reads it: the sync copies nothing.
//!
//! The re-plan after the first step (PyTorch's `rebuild_buckets`) computes
//! its layout in `layout.rs`; [`GradientBuckets::replan_in_order`] moves the
//! gradients into it. The check at the end of an overlapped backward, on
//! what went into the slots, is in `end_of_backward.rs`.

use tch::Tensor;

use super::layout::{replanned, Bucket, BucketCaps, ParamMeta};
use crate::dist::{torch_error, DistError, ProcessGroup, ReduceOp, Work};
use crate::models::Named;

/// A model's bucket layout, planned once and the same on every rank, with
/// one flat buffer per bucket, `[bucket.numel]`, allocated once and reused
/// every step. Plan it with [`plan`](Self::plan) (`bucketed.rs`).
pub struct GradientBuckets {
    layout: Vec<Bucket>,
    buffers: Vec<Tensor>,
    /// For each parameter (registration index): its bucket, and where its
    /// slot starts in that bucket's buffer. Computed once per layout.
    slots: Vec<SlotPlace>,
    /// The caps it was planned with, kept for a re-plan (below).
    caps: BucketCaps,
}

/// Where one parameter's gradient sits: `buffers[bucket][offset..offset + numel]`.
#[derive(Clone, Copy, Debug)]
struct SlotPlace {
    bucket: usize,
    offset: i64,
    numel: i64,
}

impl GradientBuckets {
    /// Zeroed buffers for `layout`, and each member's place in them: the one
    /// walk over the members' offsets, made once per layout. The layout
    /// must hold every parameter of `params` once (`layout::check_plan`).
    /// Through `pg.alloc_buffer`, a collective every rank reaches with the
    /// same layout: on MPI, memory the node's ranks share, summed in place.
    pub(super) fn allocate(
        pg: &dyn ProcessGroup,
        params: &[Named],
        layout: Vec<Bucket>,
        caps: BucketCaps,
    ) -> Result<Self, DistError> {
        let buffers =
            layout.iter().map(|b| pg.alloc_buffer(b.numel, b.kind, b.device)).collect::<Result<_, _>>()?;
        let mut slots = vec![SlotPlace { bucket: 0, offset: 0, numel: 0 }; params.len()];
        for (bucket, members) in layout.iter().enumerate() {
            let mut offset = 0;
            for &member in &members.params {
                let numel = params[member].1.numel() as i64;
                slots[member] = SlotPlace { bucket, offset, numel };
                offset += numel;
            }
        }
        Ok(GradientBuckets { layout, buffers, slots, caps })
    }

    /// The layout, in the order the buckets are all-reduced.
    pub fn layout(&self) -> &[Bucket] {
        &self.layout
    }

    /// The caps the layout was planned with.
    pub fn caps(&self) -> BucketCaps {
        self.caps
    }

    /// Bucket `b`'s flat buffer, `[numel]`: a second handle on its storage.
    pub fn buffer(&self, b: usize) -> Tensor {
        self.buffers[b].shallow_clone()
    }

    /// Parameter `index`'s slot in its bucket: `[numel]`, a view.
    pub fn slot(&self, index: usize) -> Tensor {
        let SlotPlace { bucket, offset, numel } = self.slots[index];
        self.buffers[bucket].narrow(0, offset, numel)
    }

    /// The names of each bucket's parameters, in buffer order: the layout as
    /// a person reads it.
    pub fn names(&self, params: &[Named]) -> Vec<Vec<String>> {
        self.layout.iter().map(|b| b.params.iter().map(|&p| params[p].0.clone()).collect()).collect()
    }

    /// Each bucket's members (indices into the parameters, in buffer order)
    /// and its buffer, which holds their averaged gradients after a sync:
    /// what an optimizer needs to update them flat, without copying.
    pub fn flat_groups(&self) -> FlatGroups {
        self.layout
            .iter()
            .zip(&self.buffers)
            .map(|(b, buffer)| (b.params.clone(), buffer.shallow_clone()))
            .collect()
    }

    /// Makes parameter `index`'s gradient live in its slot (in the
    /// parameter's shape), so that backward adds into the bucket and the
    /// optimizer reads the average there. A gradient held elsewhere has its
    /// values copied into the slot first; a parameter without a gradient
    /// gets one holding the slot as it is (after a sync: the other ranks'
    /// average). The one place where a gradient's storage changes, always by
    /// `set_data`: the gradient stays a tensor of its own that shares the
    /// slot's memory, not a view, so that an optimizer may still detach and
    /// zero it in place (tch's `Optimizer::zero_grad` does).
    pub fn install(&self, pg: &dyn ProcessGroup, index: usize, params: &[Named]) -> Result<(), DistError> {
        let (name, param) = &params[index];
        let mut slot = self.slot(index).view(param.size().as_slice());
        let grad = param.grad();
        if grad.defined() && grad.data_ptr() == slot.data_ptr() {
            return Ok(()); // already there: backward wrote into the slot
        }
        let op = || format!("placing the gradient of `{name}` in its bucket");
        tch::no_grad(|| {
            if grad.defined() {
                slot.f_copy_(&grad).map_err(|e| torch_error(pg, op())(e))?;
            } else {
                // Autograd has not made one yet: give it a gradient to point.
                let empty = slot.f_empty_like().map_err(|e| torch_error(pg, op())(e))?;
                crate::autograd::set_grad(param, &empty).map_err(|e| DistError::Invalid {
                    rank: pg.rank(),
                    op: op(),
                    detail: e.to_string(),
                })?;
            }
            param.grad().f_set_data(&slot).map_err(|e| torch_error(pg, op())(e))
        })
    }

    /// Starts bucket `b`'s all-reduce (SUM) with its gradients installed in
    /// their slots; a parameter without a gradient sends zeros and keeps none.
    pub fn launch_bucket(
        &self,
        pg: &dyn ProcessGroup,
        b: usize,
        params: &[Named],
    ) -> Result<Work, DistError> {
        self.fill_bucket(pg, b, params)?;
        tch::no_grad(|| pg.all_reduce_async(&self.buffers[b], ReduceOp::Sum))
    }

    /// Installs bucket `b`'s gradients in their slots, zeros in the slot of
    /// a parameter without one: the buffer as it leaves, by the library's
    /// all-reduce or a communication hook (`comm_hook.rs`).
    pub(super) fn fill_bucket(
        &self,
        pg: &dyn ProcessGroup,
        b: usize,
        params: &[Named],
    ) -> Result<(), DistError> {
        tch::no_grad(|| {
            for &member in &self.layout[b].params {
                if params[member].1.grad().defined() {
                    self.install(pg, member, params)?;
                } else {
                    let _ = self
                        .slot(member)
                        .f_zero_()
                        .map_err(|e| torch_error(pg, "zeroing a missing gradient's slot")(e))?;
                }
            }
            Ok(())
        })
    }

    /// Waits for bucket `b`'s all-reduce and divides it by the world size:
    /// its installed gradients, views of it, hold the average.
    pub fn finish_bucket(&self, pg: &dyn ProcessGroup, b: usize, work: Work) -> Result<(), DistError> {
        work.wait()?;
        let mut buffer = self.buffer(b);
        let _ = tch::no_grad(|| buffer.f_div_scalar_(pg.world_size() as f64))
            .map_err(|e| torch_error(pg, "dividing a bucket by the world size")(e))?;
        Ok(())
    }

    /// Replaces the layout by `layout` (a re-plan: below), with new
    /// buffers; a gradient that was a view of its old slot is installed in
    /// its new one, values and all.
    pub(super) fn relayout(
        &mut self,
        pg: &dyn ProcessGroup,
        params: &[Named],
        layout: Vec<Bucket>,
    ) -> Result<(), DistError> {
        let installed: Vec<bool> = (0..params.len())
            .map(|i| {
                let grad = params[i].1.grad();
                grad.defined() && grad.data_ptr() == self.slot(i).data_ptr()
            })
            .collect();
        *self = GradientBuckets::allocate(pg, params, layout, self.caps)?;
        (0..params.len()).filter(|&i| installed[i]).try_for_each(|i| self.install(pg, i, params))
    }
}

/// Each bucket's members (indices into the parameters, in buffer order) and
/// its flat buffer: [`GradientBuckets::flat_groups`].
pub type FlatGroups = Vec<(Vec<usize>, Tensor)>;

impl GradientBuckets {
    /// If, with gradients ready in `order` (each parameter once), some
    /// bucket would complete after a later one, and so wait for it, plans
    /// the buckets again, with the same caps, filling them in `order`
    /// instead of reverse registration order. Returns the new layout's flat
    /// groups if the layout changed (new buffers then replace the old, and a
    /// gradient that lived in its old slot lives in its new one), `None` if
    /// it stays. Every rank must pass the same order (see [`agree_on_order`](super::agree_on_order)).
    pub fn replan_in_order(
        &mut self,
        pg: &dyn ProcessGroup,
        params: &[Named],
        order: &[usize],
    ) -> Result<Option<FlatGroups>, DistError> {
        let Some(layout) = replanned(&self.layout, &ParamMeta::of(params), order, self.caps) else {
            return Ok(None);
        };
        self.relayout(pg, params, layout)?;
        Ok(Some(self.flat_groups()))
    }
}
