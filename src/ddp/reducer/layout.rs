//! Spoiler: this file holds the reference answer to chapter 5's
//! `plan_buckets` (`src/ch05_bucketing/exercise.rs`). Working through the
//! book? Write yours first; the book shows the parts of this file you need,
//! and the answer on the chapter's solution page.
//!
//! Bucket layouts: which gradients travel together, in one flat buffer and
//! one all-reduce. [`plan_buckets`] computes the layout once, at
//! construction, from the parameters' sizes, dtypes and devices; chapter 5 of
//! the book builds it. [`check_plan`] is what a wrapper checks before it
//! trusts a layout.
//!
//! The first layout guesses that backward produces gradients in reverse
//! registration order; a model that registers its layers in another order
//! than it uses them proves the guess wrong, and then the first bucket waits
//! for the last gradient and nothing overlaps. So after the first synced
//! step every rank adopts rank 0's observed order ([`agree_on_order`]: ranks
//! must agree, their all-reduces pair up by bucket) and, if the current
//! layout made a complete bucket wait for a later one, the buckets are
//! planned again (`GradientBuckets::replan_in_order`, which computes the new layout with
//! [`replanned`], PyTorch's
//! `rebuild_buckets`). PyTorch plans again in any case; a layout whose
//! buckets already complete in order loses nothing by staying, and keeps
//! its buffers, where an optimizer may read the gradients.

use std::cmp::Reverse;

use tch::{Device, Kind, Tensor};

use crate::dist::{torch_error, DistError, ProcessGroup};
use crate::fingerprint::Fnv1a;
use crate::models::Named;

/// One mebibyte, 1024 × 1024 bytes: PyTorch counts `bucket_cap_mb` in these.
pub const MIB: usize = 1024 * 1024;

// ANCHOR: caps
/// The cap of every bucket but the first: PyTorch's `bucket_cap_mb=25`.
pub const DEFAULT_BUCKET_CAP_BYTES: usize = 25 * MIB;

/// The cap of the first bucket of each dtype and device. Small, so that the
/// first all-reduce can start as soon as the last layers' gradients exist
/// (PyTorch's `dist._DEFAULT_FIRST_BUCKET_BYTES`, 1 MiB).
pub const DEFAULT_FIRST_BUCKET_CAP_BYTES: usize = MIB;
// ANCHOR_END: caps

/// The two caps of a layout, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BucketCaps {
    /// Every bucket but the first of each dtype and device.
    pub cap_bytes: usize,
    /// The first bucket of each dtype and device.
    pub first_cap_bytes: usize,
}

impl std::fmt::Display for BucketCaps {
    /// "cap 1024 B, first cap 128 B"
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cap {} B, first cap {} B", self.cap_bytes, self.first_cap_bytes)
    }
}

impl Default for BucketCaps {
    /// PyTorch's: 25 MiB, and 1 MiB for the first bucket.
    fn default() -> Self {
        BucketCaps { cap_bytes: DEFAULT_BUCKET_CAP_BYTES, first_cap_bytes: DEFAULT_FIRST_BUCKET_CAP_BYTES }
    }
}

// ANCHOR: types
/// What the planner needs to know about one parameter: its size, dtype and
/// device. The layout is computed from these, once, at construction; never
/// from gradients, which do not exist yet and may be missing in some steps.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamMeta {
    pub name: String,
    /// Number of elements.
    pub numel: usize,
    pub kind: Kind,
    pub device: Device,
}

impl ParamMeta {
    /// The size of this parameter's gradient in bytes.
    pub fn bytes(&self) -> usize {
        self.numel * self.kind.elt_size_in_bytes()
    }

    /// The metadata of each named tensor, in the same order.
    pub fn of(named: &[Named]) -> Vec<ParamMeta> {
        named
            .iter()
            .map(|(name, t)| ParamMeta {
                name: name.clone(),
                numel: t.numel(),
                kind: t.kind(),
                device: t.device(),
            })
            .collect()
    }
}

/// A group of parameters whose gradients travel together, in one flat buffer
/// of `numel` elements, in one all-reduce. All of them have the bucket's
/// dtype and device.
#[derive(Clone, Debug, PartialEq)]
pub struct Bucket {
    pub kind: Kind,
    pub device: Device,
    /// Indices into the parameter list (registration order), in the order
    /// their gradients sit in the buffer: the first one at offset 0.
    pub params: Vec<usize>,
    /// Total number of elements: the sum of the members' `numel`.
    pub numel: usize,
}

impl Bucket {
    /// An empty bucket for gradients of this dtype and device.
    pub fn new(kind: Kind, device: Device) -> Bucket {
        Bucket { kind, device, params: Vec::new(), numel: 0 }
    }

    /// The size of the bucket's buffer in bytes.
    pub fn bytes(&self) -> usize {
        self.numel * self.kind.elt_size_in_bytes()
    }
}
// ANCHOR_END: types

// ANCHOR: plan_buckets
/// Groups the parameters into buckets, walking them from the LAST registered
/// to the first (the order in which backward produces their gradients). Each
/// dtype and device gets its own buckets; the first bucket of each holds at
/// most `first_cap_bytes`, the others at most `cap_bytes`, except that a
/// parameter larger than the cap gets a bucket of its own. Buckets come out
/// in the order backward starts filling them: the last layer's first.
pub fn plan_buckets(params: &[ParamMeta], cap_bytes: usize, first_cap_bytes: usize) -> Vec<Bucket> {
    let mut closed: Vec<Bucket> = Vec::new();
    // At most one bucket being filled per (dtype, device).
    let mut open: Vec<Bucket> = Vec::new();
    for index in (0..params.len()).rev() {
        let meta = &params[index];
        let same_key = |b: &Bucket| b.kind == meta.kind && b.device == meta.device;
        // The first bucket of a key is small, so that it fills, and can be
        // sent, early in backward; once one of that key is closed, the big cap.
        let limit = |closed: &[Bucket]| if closed.iter().any(same_key) { cap_bytes } else { first_cap_bytes };

        // 1. This gradient would overflow the open bucket: close that one as it is.
        if let Some(i) = open.iter().position(same_key) {
            if open[i].bytes() + meta.bytes() > limit(&closed) {
                closed.push(open.swap_remove(i));
            }
        }
        // 2. Put it in the open bucket of its key, opening one if needed.
        let i = match open.iter().position(same_key) {
            Some(i) => i,
            None => {
                open.push(Bucket::new(meta.kind, meta.device));
                open.len() - 1
            }
        };
        open[i].params.push(index);
        open[i].numel += meta.numel;
        // 3. Full, or one parameter at least as large as the cap: close it.
        if open[i].bytes() >= limit(&closed) {
            closed.push(open.swap_remove(i));
        }
    }
    // The partly filled last buckets close too.
    closed.extend(open);
    // Closing order is not filling order when dtypes mix (a big f32 tensor
    // closes its bucket while an f64 bucket opened earlier is still open).
    // Sort by first member, highest index first: the order backward, going
    // from high indices to low, starts filling them.
    closed.sort_by_key(|b| Reverse(b.params[0]));
    closed
}
// ANCHOR_END: plan_buckets

/// Checks that `buckets` is a usable layout for `metas`: every parameter in
/// exactly one bucket, no empty bucket, and each bucket's dtype, device and
/// `numel` consistent with its members. Returns what is wrong, for a learner.
pub fn check_plan(metas: &[ParamMeta], buckets: &[Bucket]) -> Result<(), String> {
    let mut seen = vec![None; metas.len()]; // seen[param] = Some(bucket)
    for (b, bucket) in buckets.iter().enumerate() {
        if bucket.params.is_empty() {
            return Err(format!("bucket {b} is empty: every bucket must hold at least one parameter"));
        }
        let mut numel = 0;
        for &p in &bucket.params {
            let Some(meta) = metas.get(p) else {
                return Err(format!(
                    "bucket {b} lists parameter #{p}, but the model has {} parameters",
                    metas.len()
                ));
            };
            if let Some(other) = seen[p] {
                return Err(format!(
                    "`{}` (#{p}) is in bucket {other} and in bucket {b}: put it in one",
                    meta.name
                ));
            }
            seen[p] = Some(b);
            if (meta.kind, meta.device) != (bucket.kind, bucket.device) {
                return Err(format!(
                    "`{}` is {:?} on {:?} but sits in bucket {b} of {:?} on {:?}: \
                     a bucket holds one dtype on one device",
                    meta.name, meta.kind, meta.device, bucket.kind, bucket.device
                ));
            }
            numel += meta.numel;
        }
        if numel != bucket.numel {
            return Err(format!(
                "bucket {b} says numel = {}, but its parameters hold {numel} elements together",
                bucket.numel
            ));
        }
    }
    if let Some(p) = seen.iter().position(Option::is_none) {
        return Err(format!(
            "`{}` (#{p}) is in no bucket: its gradient would never be averaged",
            metas[p].name
        ));
    }
    Ok(())
}

/// A 64-bit FNV-1a hash of a layout (dtypes, devices, members, in order):
/// equal on two ranks exactly when they planned the same buckets.
pub fn layout_fingerprint(buckets: &[Bucket]) -> i64 {
    let mut hash = Fnv1a::new();
    for bucket in buckets {
        hash.write(format!("{:?}@{:?}:{:?}|", bucket.kind, bucket.device, bucket.params).as_bytes());
    }
    hash.finish()
}

// Re-planning (PyTorch's `rebuild_buckets`): see the top of this file.

/// Rank 0's `observed` order, on every rank. A parameter rank 0 never saw
/// ready (it got no gradient) is appended, from the last registered to the
/// first, so that the order names every parameter once.
pub fn agree_on_order(
    pg: &dyn ProcessGroup,
    observed: &[usize],
    param_count: usize,
) -> Result<Vec<usize>, DistError> {
    let mut order: Vec<i64> = Vec::with_capacity(param_count);
    let mut seen = vec![false; param_count];
    for &p in observed.iter().chain((0..param_count).rev().collect::<Vec<_>>().iter()) {
        if !seen[p] {
            seen[p] = true;
            order.push(p as i64);
        }
    }
    let mut agreed = Tensor::from_slice(&order); // [param_count]
    pg.broadcast(&mut agreed, 0)?;
    let agreed = Vec::<i64>::try_from(&agreed).map_err(torch_error(pg, "reading rank 0's gradient order"))?;
    Ok(agreed.into_iter().map(|p| p as usize).collect())
}

/// The layout to re-plan to, if, with gradients ready in `order` (each
/// parameter once), some bucket of `layout` would complete after a later
/// one, and so wait for it: the buckets planned again with the same caps,
/// filled in `order` instead of reverse registration order. `None` if the
/// layout may stay.
pub fn replanned(
    layout: &[Bucket],
    metas: &[ParamMeta],
    order: &[usize],
    caps: BucketCaps,
) -> Option<Vec<Bucket>> {
    if completes_in_order(layout, order) {
        return None;
    }
    // `plan_buckets` walks its list from the last entry to the first:
    // hand it the order reversed, and map its indices back.
    let reversed: Vec<usize> = order.iter().rev().copied().collect();
    let permuted: Vec<ParamMeta> = reversed.iter().map(|&p| metas[p].clone()).collect();
    let mut planned = plan_buckets(&permuted, caps.cap_bytes, caps.first_cap_bytes);
    for bucket in &mut planned {
        bucket.params.iter_mut().for_each(|j| *j = reversed[*j]);
    }
    (planned != layout).then_some(planned)
}

/// Whether each bucket's last member comes, in `order`, before the last
/// member of every later bucket: then every bucket leaves as it completes.
fn completes_in_order(layout: &[Bucket], order: &[usize]) -> bool {
    let mut position = vec![0; order.len()];
    order.iter().enumerate().for_each(|(at, &p)| position[p] = at);
    let completed_at: Vec<usize> =
        layout.iter().map(|b| b.params.iter().map(|&p| position[p]).max().unwrap_or(0)).collect();
    completed_at.windows(2).all(|w| w[0] < w[1])
}
