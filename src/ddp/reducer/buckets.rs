//! Spoiler: this file holds the library's answers to chapter 5's
//! `sync_bucket` and chapter 6's `launch_bucket` and `finish_bucket`
//! (`src/ch05_bucketing/exercise.rs`, `src/ch06_overlap/exercise.rs`), with
//! the gradients kept in the buckets. Working through the book? Write yours
//! first; the book shows the parts of this file you need, and the answer on
//! the chapter's solution page.
//!
//! The one home of a model's gradient buckets: [`GradientBuckets`] plans the
//! layout (`layout.rs`), checks that every rank planned the same one, and
//! holds one flat buffer per bucket and where each parameter's slot lies in
//! it. Everything that puts a gradient into a bucket, moves the buckets'
//! bytes or reads a slot goes through it, and its fields are private.
//!
//! The finished wrapper keeps gradients in the buckets (PyTorch's
//! `gradient_as_bucket_view`): the first time a parameter has a gradient,
//! [`install`](GradientBuckets::install) copies it into its slot and makes
//! the slot its gradient. From then on backward adds straight into the
//! bucket (autograd accumulates into an existing gradient in place),
//! `zero_grad` zeroes it there, and the all-reduce leaves the average where
//! the optimizer reads it: the sync copies nothing.
//!
//! Chapter 5's [`sync_bucket`], which copies each gradient in and out, is
//! here too; the chapter runs it on every bucket through `ddp::seams`.

use tch::{Kind, Tensor};

use super::layout::{self, plan_buckets, replanned, Bucket, BucketCaps, ParamMeta};
use crate::ddp::replica_check::InitError;
use crate::dist::{tagged, torch_error, DistError, ProcessGroup, ReduceOp, Work};
use crate::models::Named;

/// Why a model could not be wrapped with buckets.
#[derive(Debug, thiserror::Error)]
pub enum BucketingError {
    #[error(
        "{what} must be at least 1 byte, got {bytes}. PyTorch's defaults are 25 MiB for the \
         buckets and 1 MiB for the first one: use `BucketCaps::default()`, or pass caps such \
         as `25 * MIB` and `MIB`"
    )]
    InvalidCap { what: &'static str, bytes: usize },

    #[error(
        "the first bucket's cap ({first_cap_bytes} B) is larger than the cap of the others \
         ({cap_bytes} B): the first bucket is the small one, so that its all-reduce can start \
         early in backward. Pass a first cap of at most the cap (PyTorch: 1 MiB and 25 MiB)"
    )]
    FirstCapAboveCap { cap_bytes: usize, first_cap_bytes: usize },

    /// The planner returned something that is not a layout of the model.
    #[error("plan_buckets returned an unusable layout: {0}")]
    BadPlan(String),

    #[error(
        "the ranks planned different bucket layouts: {0}. Their all-reduces would not pair up. \
         Pass the same bucket caps on every rank."
    )]
    LayoutsDiffer(String),

    #[error(transparent)]
    Init(#[from] InitError),

    #[error("a collective failed while comparing the bucket layouts: {0}")]
    Dist(DistError),
}

/// How a layout is planned: [`plan_buckets`], or chapter 5's through
/// `ddp::seams` (which alone exports this name).
pub type PlanBuckets = fn(&[ParamMeta], usize, usize) -> Vec<Bucket>;

/// A model's bucket layout, planned once and the same on every rank, with
/// one flat buffer per bucket, `[bucket.numel]`, allocated once and reused
/// every step. Plan it with [`plan`](Self::plan).
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
    // ANCHOR: gradient_buckets
    /// Plans the buckets of `params` with [`plan_buckets`].
    pub fn plan(pg: &dyn ProcessGroup, params: &[Named], caps: BucketCaps) -> Result<Self, BucketingError> {
        Self::planned_by(pg, params, caps, plan_buckets)
    }

    /// Plans the buckets of `params` with `planner`, checks that the result
    /// is a layout of these parameters and that every rank planned the same
    /// one, and allocates the buffers. Every rank must call it, with the
    /// same caps.
    pub(crate) fn planned_by(
        pg: &dyn ProcessGroup,
        params: &[Named],
        caps: BucketCaps,
        planner: PlanBuckets,
    ) -> Result<Self, BucketingError> {
        // Before any collective: a bad cap fails here, on the rank that has it.
        for (what, bytes) in
            [("the bucket cap", caps.cap_bytes), ("the first bucket's cap", caps.first_cap_bytes)]
        {
            if bytes == 0 {
                return Err(BucketingError::InvalidCap { what, bytes });
            }
        }
        // With a first cap above the cap, "a parameter larger than the cap
        // travels alone" would no longer hold for the first bucket.
        let BucketCaps { cap_bytes, first_cap_bytes } = caps;
        if first_cap_bytes > cap_bytes {
            return Err(BucketingError::FirstCapAboveCap { cap_bytes, first_cap_bytes });
        }
        // The layout depends only on the parameters' sizes, dtypes, devices
        // and order, which the replica checks proved equal on every rank, and
        // on the caps. So equal caps give equal layouts: we check it anyway,
        // because unequal layouts would pair the wrong buffers.
        let metas = ParamMeta::of(params);
        let layout = planner(&metas, caps.cap_bytes, caps.first_cap_bytes);
        layout::check_plan(&metas, &layout).map_err(BucketingError::BadPlan)?;
        check_same_layout(pg, caps, &layout)?;
        GradientBuckets::allocate(pg, params, layout, caps).map_err(BucketingError::Dist)
    }
    // ANCHOR_END: gradient_buckets

    /// Zeroed buffers for `layout`, and each member's place in them: the one
    /// walk over the members' offsets, made once per layout. The layout
    /// must hold every parameter of `params` once (`layout::check_plan`).
    /// Through `pg.alloc_buffer`, a collective every rank reaches with the
    /// same layout: on MPI, memory the node's ranks share, summed in place.
    fn allocate(
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

    /// Averages every gradient of `params` over all ranks, one all-reduce per
    /// bucket, in bucket order, in place: the gradients become views of
    /// their slots (see [`install`](Self::install)). A parameter without a
    /// gradient sends zeros and keeps none; if another rank had one for it,
    /// every rank fails naming it.
    pub fn sync(&self, pg: &dyn ProcessGroup, params: &[Named]) -> Result<(), DistError> {
        for b in 0..self.layout().len() {
            tagged(format!("bucket {b}"), || {
                let work = self.launch_bucket(pg, b, params)?;
                self.finish_bucket(pg, b, work)
            })?;
            self.check_missing_gradients(pg, b, params)?;
        }
        Ok(())
    }

    /// A parameter without a gradient on this rank sent zeros. If its
    /// averaged slot of bucket `b` is not zero, another rank did compute a
    /// gradient for it: the others will update it and this rank will not,
    /// and the replicas drift apart silently. Turn that into an error that
    /// names the parameter. (Chapter 5's copying sync, in `ddp::seams`,
    /// runs it too.)
    pub(crate) fn check_missing_gradients(
        &self,
        pg: &dyn ProcessGroup,
        b: usize,
        params: &[Named],
    ) -> Result<(), DistError> {
        for &index in &self.layout()[b].params {
            let (name, param) = &params[index];
            if param.grad().defined() || param.numel() == 0 {
                continue;
            }
            let largest =
                tch::no_grad(|| self.slot(index).abs().max().to_kind(Kind::Double).double_value(&[]));
            if largest != 0.0 {
                let detail = format!(
                    "`{name}` has no gradient on rank {} (it took no part in this rank's loss), but \
                     the averaged bucket holds values up to {largest:e} for it: other ranks used it. \
                     Then they update it and this rank does not. Use every parameter in the loss on \
                     every rank (or on none).",
                    pg.rank()
                );
                return Err(DistError::Invalid { rank: pg.rank(), op: "sync_gradients".into(), detail });
            }
        }
        Ok(())
    }
    /// If, with gradients ready in `order` (each parameter once), some
    /// bucket would complete after a later one, and so wait for it, plans
    /// the buckets again, with the same caps, filling them in `order`
    /// instead of reverse registration order (PyTorch's `rebuild_buckets`).
    /// Returns whether the layout changed: then new buffers replace the old,
    /// and a gradient that lived in its old slot lives in its new one. Every
    /// rank must pass the same order (see [`agree_on_order`](super::layout::agree_on_order)).
    pub fn replan_in_order(
        &mut self,
        pg: &dyn ProcessGroup,
        params: &[Named],
        order: &[usize],
    ) -> Result<bool, DistError> {
        let Some(layout) = replanned(&self.layout, &ParamMeta::of(params), order, self.caps) else {
            return Ok(false);
        };
        self.relayout(pg, params, layout)?;
        Ok(true)
    }

    /// Replaces the layout by `layout` (a re-plan: below), with new
    /// buffers; a gradient that was a view of its old slot is installed in
    /// its new one, values and all.
    fn relayout(
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

// ANCHOR: sync_bucket
/// Averages the gradients of one bucket's parameters over all ranks with a
/// single all-reduce of `buffer`, whose slots are the members' gradients,
/// flattened, back to back in the order of `bucket.params`. On return each
/// member's gradient holds its mean over the ranks, in its own shape and bit
/// for bit what the library's per-parameter sync (`ddp::naive`) leaves; a
/// member without a gradient on this rank counts as zeros in the mean and
/// still has no gradient afterwards.
pub fn sync_bucket(
    pg: &dyn ProcessGroup,
    bucket: &Bucket,
    buffer: &mut Tensor,
    params: &[(String, Tensor)],
) -> Result<(), DistError> {
    tch::no_grad(|| {
        // The slots follow `bucket.params`, back to back: cut the buffer at
        // the members' sizes, into views ([numel] each).
        let numels: Vec<i64> = bucket.params.iter().map(|&index| params[index].1.numel() as i64).collect();
        let slots = buffer
            .f_split_with_sizes(numels.as_slice(), 0)
            .map_err(torch_error(pg, "cutting a bucket into slots"))?;

        // 1. Copy in.
        for (&index, slot) in bucket.params.iter().zip(&slots) {
            let (name, param) = &params[index];
            let mut slot = slot.shallow_clone();
            let grad = param.grad();
            let copied = if grad.defined() {
                grad.f_reshape([-1]).and_then(|flat| slot.f_copy_(&flat)) // [numel]
            } else {
                // No gradient here: send zeros, so that every rank still makes
                // the same call with the same buffer size.
                slot.f_zero_().map(|_| ())
            };
            // (A closure, so that the message is only formatted on an error.)
            let op = || format!("copying the gradient of `{name}` into its bucket");
            copied.map_err(|source| torch_error(pg, op())(source))?;
        }

        // 2. One collective for the whole bucket, then the mean.
        pg.all_reduce(buffer, ReduceOp::Sum)?;
        let _ = buffer
            .f_div_scalar_(pg.world_size() as f64)
            .map_err(torch_error(pg, "dividing a bucket by the world size"))?;

        // 3. Copy out, slot by slot, into the gradients that exist.
        for (&index, slot) in bucket.params.iter().zip(&slots) {
            let (name, param) = &params[index];
            let mut grad = param.grad(); // a handle sharing the gradient's storage
            if grad.defined() {
                let op = || format!("copying the bucket back into the gradient of `{name}`");
                slot.f_view_as(&grad) // the gradient's shape
                    .and_then(|averaged| grad.f_copy_(&averaged))
                    .map_err(|source| torch_error(pg, op())(source))?;
            }
        }
        Ok(())
    })
}
// ANCHOR_END: sync_bucket

/// Every rank tells every rank its caps and a fingerprint of its layout; all
/// fail together if any differs from rank 0's.
fn check_same_layout(
    pg: &dyn ProcessGroup,
    caps: BucketCaps,
    buckets: &[Bucket],
) -> Result<(), BucketingError> {
    let mine = [
        caps.cap_bytes as i64,
        caps.first_cap_bytes as i64,
        buckets.len() as i64,
        layout::layout_fingerprint(buckets),
    ];
    let all = pg.all_gather(&Tensor::from_slice(&mine)).map_err(BucketingError::Dist)?; // world_size x [4]
    let all: Vec<Vec<i64>> = all
        .iter()
        .map(Vec::<i64>::try_from)
        .collect::<Result<_, _>>()
        .map_err(|e| BucketingError::Dist(torch_error(pg, "reading the gathered bucket layouts")(e)))?;
    let differing: Vec<usize> = (0..all.len()).filter(|&r| all[r] != all[0]).collect();
    if let Some(&r) = differing.first() {
        let describe = |v: &[i64]| format!("cap {} B, first cap {} B, {} buckets", v[0], v[1], v[2]);
        let detail = format!(
            "rank 0 has {} but rank(s) {differing:?} differ, e.g. rank {r} has {}",
            describe(&all[0]),
            describe(&all[r])
        );
        return Err(BucketingError::LayoutsDiffer(detail));
    }
    Ok(())
}
