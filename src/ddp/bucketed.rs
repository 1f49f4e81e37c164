//! Spoiler: this file holds the reference answer to chapter 5's `sync_bucket`
//! (`src/ch05_bucketing/exercise.rs`). Working through the book? Write yours
//! first; the book shows the parts of this file you need, and the answer at
//! the end of the chapter.
//!
//! The bucketed gradient sync: a model's gradients travel in a few flat
//! buffers, one all-reduce per bucket. Here a [`GradientBuckets`] is planned
//! (its layout from `layout.rs`, checked to be the same on every rank) and
//! synced in place ([`GradientBuckets::sync`], gradients kept in the
//! buckets: the library's sync after backward). Chapter 5's [`sync_bucket`],
//! which copies, is here too; the chapter runs it on every bucket through
//! `ddp::seams`. The buckets themselves are in `buckets.rs`.

use tch::{Kind, Tensor};

use super::buckets::GradientBuckets;
use super::layout::{self, plan_buckets, Bucket, BucketCaps, ParamMeta};
use super::replicas::InitError;
use crate::dist::{tagged, torch_error, DistError, ProcessGroup, ReduceOp};
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

// ANCHOR: gradient_buckets
impl GradientBuckets {
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
}
// ANCHOR_END: gradient_buckets

impl GradientBuckets {
    /// Averages every gradient of `params` over all ranks, one all-reduce per
    /// bucket, in bucket order, in place: the gradients become views of
    /// their slots (see `buckets.rs`). A parameter without a
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
