//! Chapter 05: bucketing. Chapter 3 made one all-reduce per parameter; every
//! call pays a fixed cost, whatever its size. Here the gradients travel in
//! a few large flat buffers, the buckets: one all-reduce per bucket.
//!
//! Your code:           `cargo test --test chapter_05`
//! The reference code:  `cargo test --features solutions --test chapter_05`
//! The benchmark:       `cargo run --release --example bench_sync`
//!
//! You write two functions in `exercise.rs`:
//! 1. [`plan_buckets`]: the layout, computed once at construction from the
//!    parameters' sizes, dtypes and devices, in reverse registration order;
//! 2. [`sync_bucket`]: copy a bucket's gradients into one buffer, one
//!    all-reduce, divide, copy back.
//!
//! This file holds the rest, already solved: chapter 2's replica check (the
//! reference one, so you can start here), the checks on your layout (a valid
//! plan, the same on every rank), the bucket buffers, and
//! [`SimpleDistributedDataParallelism::sync_gradients`], which runs your
//! `sync_bucket` on every bucket.

use tch::nn::{self, Module};
use tch::{TchError, Tensor};

use crate::ch02_replicas::verified_tensors;
use crate::dist::{DistError, Group, ProcessGroup};

pub use crate::ch02_replicas::InitError;

pub mod exercise; // the file you edit
pub mod layout; // the layout types and their checks, already solved
pub mod solution; // the reference solution

#[cfg(not(feature = "solutions"))]
use exercise as active;
#[cfg(feature = "solutions")]
use solution as active;

pub use active::{plan_buckets, sync_bucket};
pub use layout::{Bucket, ParamMeta, DEFAULT_BUCKET_CAP_BYTES, DEFAULT_FIRST_BUCKET_CAP_BYTES, MIB};

/// Turns a libtorch error met while doing `op` into a [`DistError`] that
/// names this rank: `.map_err(torch_error(pg, "copying ..."))?`.
pub fn torch_error(pg: &dyn ProcessGroup, op: impl Into<String>) -> impl FnOnce(TchError) -> DistError {
    let (rank, op) = (pg.rank(), op.into());
    move |source| DistError::Torch { rank, op, source }
}

/// Why a model could not be wrapped with buckets.
#[derive(Debug, thiserror::Error)]
pub enum BucketingError {
    #[error(
        "{what} must be at least 1 byte, got {bytes}. PyTorch's defaults are 25 MiB for the \
         buckets and 1 MiB for the first one: use `SimpleDistributedDataParallelism::new`, or \
         pass caps such as `25 * MIB` and `MIB` to `with_bucket_caps`"
    )]
    InvalidCap { what: &'static str, bytes: usize },

    /// `plan_buckets` returned something that is not a layout of the model.
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

// ANCHOR: wrapper
/// A model replicated on every rank, whose gradients are averaged bucket by
/// bucket: one all-reduce per bucket instead of one per parameter.
pub struct SimpleDistributedDataParallelism<M: Module> {
    module: M,
    /// Trainable tensors, in registration order (shallow handles: they share
    /// storage, and `.grad()`, with the model).
    parameters: Vec<(String, Tensor)>,
    /// Non-trainable tensors (buffers), sorted by name.
    buffers: Vec<(String, Tensor)>,
    process_group: Group,
    /// The layout, planned once; the same on every rank.
    buckets: Vec<Bucket>,
    /// One flat buffer per bucket, `[bucket.numel]`, allocated once and
    /// reused every step.
    bucket_buffers: Vec<Tensor>,
}

impl<M: Module> SimpleDistributedDataParallelism<M> {
    /// Wraps `module` with PyTorch's default caps: 1 MiB for the first bucket
    /// of each dtype and device, 25 MiB for the others.
    pub fn new(module: M, vs: &nn::VarStore, pg: Group) -> Result<Self, BucketingError> {
        Self::with_bucket_caps(module, vs, pg, DEFAULT_BUCKET_CAP_BYTES, DEFAULT_FIRST_BUCKET_CAP_BYTES)
    }

    /// Wraps `module`, whose variables live in `vs`, after chapter 2's checks
    /// (every rank holds the same parameters and buffers), and plans its
    /// buckets with these caps, in bytes. Every rank must call it with the
    /// same caps: it checks that they all planned the same layout.
    pub fn with_bucket_caps(
        module: M,
        vs: &nn::VarStore,
        pg: Group,
        cap_bytes: usize,
        first_cap_bytes: usize,
    ) -> Result<Self, BucketingError> {
        // Before any collective: a bad cap fails here, on the rank that has it.
        if cap_bytes == 0 {
            return Err(BucketingError::InvalidCap { what: "the bucket cap", bytes: cap_bytes });
        }
        if first_cap_bytes == 0 {
            return Err(BucketingError::InvalidCap {
                what: "the first bucket's cap",
                bytes: first_cap_bytes,
            });
        }
        let (parameters, buffers) = verified_tensors(vs, pg.as_ref())?;

        // The layout depends only on the parameters' sizes, dtypes, devices
        // and order, which the checks above proved equal on every rank, and
        // on the caps. So equal caps give equal layouts: we check it anyway,
        // because unequal layouts would pair the wrong buffers.
        let metas = ParamMeta::of(&parameters);
        let buckets = plan_buckets(&metas, cap_bytes, first_cap_bytes);
        layout::check_plan(&metas, &buckets).map_err(BucketingError::BadPlan)?;
        check_same_layout(pg.as_ref(), cap_bytes, first_cap_bytes, &buckets)?;

        let bucket_buffers = buckets
            .iter()
            .map(|b| Tensor::zeros([b.numel as i64], (b.kind, b.device))) // [numel]
            .collect();
        Ok(SimpleDistributedDataParallelism {
            module,
            parameters,
            buffers,
            process_group: pg,
            buckets,
            bucket_buffers,
        })
    }

    /// Runs the wrapped model: the forward pass needs no communication.
    pub fn forward(&self, xs: &Tensor) -> Tensor {
        self.module.forward(xs)
    }

    /// Averages every gradient over all ranks, one all-reduce per bucket, in
    /// bucket order. Call it on every rank after `loss.backward()` and before
    /// `optimizer.step()`.
    pub fn sync_gradients(&mut self) -> Result<(), DistError> {
        let pg = self.process_group.as_ref();
        for (bucket, buffer) in self.buckets.iter().zip(self.bucket_buffers.iter_mut()) {
            sync_bucket(pg, bucket, buffer, &self.parameters)?;
            check_missing_gradients(pg, bucket, buffer, &self.parameters)?;
        }
        Ok(())
    }
}
// ANCHOR_END: wrapper

impl<M: Module> SimpleDistributedDataParallelism<M> {
    /// The wrapped model (for example to save it on rank 0).
    pub fn module(&self) -> &M {
        &self.module
    }

    pub fn process_group(&self) -> &Group {
        &self.process_group
    }

    /// The trainable tensors, in registration order.
    pub fn parameters(&self) -> &[(String, Tensor)] {
        &self.parameters
    }

    /// The non-trainable tensors, sorted by name.
    pub fn buffers(&self) -> &[(String, Tensor)] {
        &self.buffers
    }

    /// The bucket layout, in the order the buckets are all-reduced.
    pub fn buckets(&self) -> &[Bucket] {
        &self.buckets
    }

    /// The names of each bucket's parameters, in buffer order: the layout as
    /// a person reads it.
    pub fn bucket_names(&self) -> Vec<Vec<String>> {
        self.buckets
            .iter()
            .map(|b| b.params.iter().map(|&p| self.parameters[p].0.clone()).collect())
            .collect()
    }
}

/// Every rank tells every rank its caps and a fingerprint of its layout; all
/// fail together if any differs from rank 0's. (Solved; chapter 6 reuses it.)
pub fn check_same_layout(
    pg: &dyn ProcessGroup,
    cap_bytes: usize,
    first_cap_bytes: usize,
    buckets: &[Bucket],
) -> Result<(), BucketingError> {
    let mine = [cap_bytes as i64, first_cap_bytes as i64, buckets.len() as i64, layout::fingerprint(buckets)];
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

/// A parameter without a gradient on this rank sent zeros. If its averaged
/// slot is not zero, another rank did compute a gradient for it: the others
/// will update it and this rank will not, and the replicas drift apart
/// silently. Turn that into an error that names the parameter. (Solved;
/// chapter 6 reuses it.)
pub fn check_missing_gradients(
    pg: &dyn ProcessGroup,
    bucket: &Bucket,
    buffer: &Tensor,
    params: &[(String, Tensor)],
) -> Result<(), DistError> {
    let mut offset = 0;
    for &index in &bucket.params {
        let (name, param) = &params[index];
        let numel = param.numel() as i64;
        if !param.grad().defined() && numel > 0 {
            let largest = tch::no_grad(|| buffer.narrow(0, offset, numel).abs().max().double_value(&[]));
            if largest != 0.0 {
                let detail = format!(
                    "`{name}` has no gradient on rank {} (it took no part in this rank's loss), but \
                     the averaged bucket holds values up to {largest:e} for it: other ranks used it. \
                     Then they update it and this rank does not. Use every parameter in the loss on \
                     every rank (or on none). If this rank is right, check that sync_bucket fills \
                     the slot of a parameter without gradient with zeros.",
                    pg.rank()
                );
                return Err(DistError::Invalid { rank: pg.rank(), op: "sync_gradients".into(), detail });
            }
        }
        offset += numel;
    }
    Ok(())
}
